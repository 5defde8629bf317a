#include "engine/pipeline/step_message.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace glm::engine::pipeline {
namespace {

constexpr uint8_t kFlagAllLogits = 1, kFlagWantHidden = 2, kFlagSample = 4;

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T>
  void PutArray(const std::vector<T>& v) {
    Put(static_cast<uint32_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Bounds-checked reads; the first failure sticks and names the field.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T Get(const char* field) {
    T v{};
    if (!Take(&v, sizeof(T), field)) return T{};
    return v;
  }
  template <typename T>
  std::vector<T> GetArray(const char* field) {
    const uint32_t n = Get<uint32_t>(field);
    std::vector<T> v;
    if (!status_.ok()) return v;
    if (static_cast<uint64_t>(n) * sizeof(T) > in_.size() - pos_) {
      Fail(field, n * sizeof(T));
      return v;
    }
    v.resize(n);
    Take(v.data(), n * sizeof(T), field);
    return v;
  }
  bool AtEnd() const { return pos_ == in_.size(); }
  size_t pos() const { return pos_; }
  const absl::Status& status() const { return status_; }

 private:
  bool Take(void* dst, size_t n, const char* field) {
    if (!status_.ok()) return false;
    if (n > in_.size() - pos_) {
      Fail(field, n);
      return false;
    }
    if (n > 0) std::memcpy(dst, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  void Fail(const char* field, size_t n) {
    status_ = absl::DataLossError(absl::StrCat(
        "pipeline step message: truncated at byte ", pos_, " of ", in_.size(), " reading ", field,
        " (", n, " bytes): the ranks disagree on the message format or it was corrupted"));
  }
  std::string_view in_;
  size_t pos_ = 0;
  absl::Status status_;
};

}  // namespace

const char* MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kStep: return "step";
    case MessageKind::kMtpStep: return "mtp-step";
    case MessageKind::kIdle: return "idle";
    case MessageKind::kStop: return "stop";
  }
  return "unknown";
}

std::string EncodePayload(const StepMessage& m) {
  Writer w;
  w.Put<uint64_t>(m.sequence);
  w.PutArray(m.released);
  if (m.kind != MessageKind::kStep && m.kind != MessageKind::kMtpStep) return w.Take();
  w.Put<uint32_t>(static_cast<uint32_t>(m.batch.seqs.size()));
  for (const SequenceSlice& s : m.batch.seqs) {
    w.Put<int64_t>(s.seq_id);
    w.Put<int32_t>(s.start_pos);
    w.Put<uint8_t>((s.all_logits ? kFlagAllLogits : 0) | (s.want_hidden ? kFlagWantHidden : 0) |
                   (s.sample.enabled ? kFlagSample : 0));
    w.Put<float>(s.sample.temperature);
    w.Put<int32_t>(s.sample.top_k);
    w.Put<float>(s.sample.top_p);
    w.Put<uint64_t>(s.sample.seed);
    w.Put<int64_t>(s.sample.index);
    w.Put<int32_t>(s.sample.logprobs);
    w.PutArray(s.token_ids);
    w.PutArray(s.block_table);
  }
  if (m.kind == MessageKind::kMtpStep) {
    for (size_t i = 0; i < m.batch.seqs.size(); ++i) {
      w.PutArray(i < m.mtp_hidden.size() ? m.mtp_hidden[i] : std::vector<float>{});
    }
  }
  return w.Take();
}

absl::StatusOr<StepMessage> DecodePayload(MessageKind kind, std::string_view payload) {
  Reader r(payload);
  StepMessage m;
  m.kind = kind;
  m.sequence = r.Get<uint64_t>("sequence");
  m.released = r.GetArray<int64_t>("released");
  if (kind == MessageKind::kStep || kind == MessageKind::kMtpStep) {
    const uint32_t num_seqs = r.Get<uint32_t>("num_seqs");
    // Each slice takes at least 53 bytes: a count beyond that is corrupt, not a reason to
    // allocate.
    if (r.status().ok() && num_seqs > payload.size() / 53) {
      return absl::DataLossError(absl::StrCat("pipeline step message: num_seqs=", num_seqs,
                                              " cannot fit a payload of ", payload.size(),
                                              " bytes"));
    }
    m.batch.seqs.resize(r.status().ok() ? num_seqs : 0);
    for (SequenceSlice& s : m.batch.seqs) {
      s.seq_id = r.Get<int64_t>("seq_id");
      s.start_pos = r.Get<int32_t>("start_pos");
      const uint8_t flags = r.Get<uint8_t>("flags");
      s.all_logits = (flags & kFlagAllLogits) != 0;
      s.want_hidden = (flags & kFlagWantHidden) != 0;
      s.sample.enabled = (flags & kFlagSample) != 0;
      s.sample.temperature = r.Get<float>("temperature");
      s.sample.top_k = r.Get<int32_t>("top_k");
      s.sample.top_p = r.Get<float>("top_p");
      s.sample.seed = r.Get<uint64_t>("seed");
      s.sample.index = r.Get<int64_t>("index");
      s.sample.logprobs = r.Get<int32_t>("logprobs");
      s.token_ids = r.GetArray<int32_t>("token_ids");
      s.block_table = r.GetArray<int32_t>("block_table");
      if (!r.status().ok()) break;
    }
    if (kind == MessageKind::kMtpStep && r.status().ok()) {
      m.mtp_hidden.resize(m.batch.seqs.size());
      for (auto& h : m.mtp_hidden) h = r.GetArray<float>("mtp_hidden");
    }
  }
  if (!r.status().ok()) return r.status();
  if (!r.AtEnd()) {
    return absl::DataLossError(absl::StrCat("pipeline ", MessageKindName(kind),
                                            " message: ", payload.size() - r.pos(),
                                            " bytes left over after the last field"));
  }
  return m;
}

void EncodeHeader(const Header& h, float out[kHeaderFloats]) {
  char bytes[kHeaderFloats * sizeof(float)];
  const uint32_t magic = kMagic, kind = static_cast<uint32_t>(h.kind);
  std::memcpy(bytes, &magic, 4);
  std::memcpy(bytes + 4, &kind, 4);
  std::memcpy(bytes + 8, &h.payload_bytes, 8);
  std::memcpy(out, bytes, sizeof(bytes));
}

absl::StatusOr<Header> DecodeHeader(const float in[kHeaderFloats]) {
  char bytes[kHeaderFloats * sizeof(float)];
  std::memcpy(bytes, in, sizeof(bytes));
  uint32_t magic = 0, kind = 0;
  Header h;
  std::memcpy(&magic, bytes, 4);
  std::memcpy(&kind, bytes + 4, 4);
  std::memcpy(&h.payload_bytes, bytes + 8, 8);
  if (magic != kMagic) {
    return absl::DataLossError(absl::StrCat(
        "pipeline message header: magic 0x", absl::Hex(magic), " is not 0x", absl::Hex(kMagic),
        ": the ranks run different engine builds or the stream is out of step"));
  }
  if (kind < 1 || kind > 4) {
    return absl::DataLossError(absl::StrCat("pipeline message header: unknown kind ", kind));
  }
  // A step of 2^32 bytes of metadata is not a real step.
  if (h.payload_bytes > (uint64_t{1} << 32)) {
    return absl::DataLossError(
        absl::StrCat("pipeline message header: payload of ", h.payload_bytes, " bytes"));
  }
  h.kind = static_cast<MessageKind>(kind);
  return h;
}

size_t FloatsForBytes(size_t num_bytes) { return (num_bytes + sizeof(float) - 1) / sizeof(float); }

std::vector<float> BytesToFloats(std::string_view bytes) {
  std::vector<float> out(FloatsForBytes(bytes.size()), 0.0f);
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::string FloatsToBytes(const std::vector<float>& floats, size_t num_bytes) {
  std::string out(std::min(num_bytes, floats.size() * sizeof(float)), '\0');
  if (!out.empty()) std::memcpy(out.data(), floats.data(), out.size());
  return out;
}

}  // namespace glm::engine::pipeline
