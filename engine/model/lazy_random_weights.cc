#include "engine/model/lazy_random_weights.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace glm::engine {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr float kSqrt3 = 1.7320508f;

uint64_t Mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t NameHash(const std::string& s) {  // FNV-1a
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Elements [begin, end) (begin even) of the stream `key`: pair j gives elements 2j and 2j + 1.
void FillRange(uint64_t key, float mean, float bound, float* out, int64_t begin, int64_t end) {
  const float scale = bound * (1.0f / 2147483648.0f);  // int32 -> [-1, 1) * bound
  int64_t i = begin;
  for (; i + 1 < end; i += 2) {
    const uint64_t z = Mix(key + static_cast<uint64_t>(i / 2 + 1) * kGolden);
    out[i] = mean + scale * static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(z)));
    out[i + 1] = mean + scale * static_cast<float>(static_cast<int32_t>(z >> 32));
  }
  if (i < end) {
    const uint64_t z = Mix(key + static_cast<uint64_t>(i / 2 + 1) * kGolden);
    out[i] = mean + scale * static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(z)));
  }
}

// e4m3 codes with exponent field <= 7 (|q| <= 1.875, no NaN), either sign: byte = sign | (b & 0x3F).
float DecodeE4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6)
                         : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return (b & 0x80) ? -v : v;
}

// Root mean square of DecodeE4m3 over the 128 codes FillE4m3 draws from.
float E4m3Rms() {
  double sq = 0;
  for (int b = 0; b < 64; ++b) sq += static_cast<double>(DecodeE4m3(b)) * DecodeE4m3(b);
  return static_cast<float>(std::sqrt(sq / 64.0));
}

void FillBytesRange(uint64_t key, uint8_t* out, int64_t begin, int64_t end) {
  constexpr uint64_t kCodeMask = 0xBFBFBFBFBFBFBFBFull;  // per byte: sign | 6 low bits
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const uint64_t z = Mix(key + static_cast<uint64_t>(i / 8 + 1) * kGolden) & kCodeMask;
    std::memcpy(out + i, &z, 8);
  }
  uint64_t z = Mix(key + static_cast<uint64_t>(i / 8 + 1) * kGolden) & kCodeMask;
  for (; i < end; ++i, z >>= 8) out[i] = static_cast<uint8_t>(z);
}

// Root mean square of the signed values a uniformly random INT4 nibble / INT8 byte / e2m1 nibble
// stands for.
float CodeRms(WeightDType dtype) {
  double sq = 0;
  int n = 0;
  if (dtype == WeightDType::kNvfp4) {
    for (float v : {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f}) {
      sq += static_cast<double>(v) * v;
      ++n;
    }
  } else {
    const int offset = dtype == WeightDType::kInt4 ? 8 : 128;
    for (int u = 0; u < 2 * offset; ++u) {
      sq += static_cast<double>(u - offset) * (u - offset);
      ++n;
    }
  }
  return static_cast<float>(std::sqrt(sq / n));
}

// Uniformly random bytes [begin, end) (begin a multiple of 8) of the stream `key`.
void FillRawBytesRange(uint64_t key, uint8_t* out, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const uint64_t z = Mix(key + static_cast<uint64_t>(i / 8 + 1) * kGolden);
    std::memcpy(out + i, &z, 8);
  }
  uint64_t z = Mix(key + static_cast<uint64_t>(i / 8 + 1) * kGolden);
  for (; i < end; ++i, z >>= 8) out[i] = static_cast<uint8_t>(z);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsRoutedExpert(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos && EndsWith(name, "_proj.weight");
}

// The INT8 linears of the Int4-Int8Mix layout: attention projections, dense MLP, shared experts.
bool IsInt8MixLinear(const std::string& name) {
  for (const char* m : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}) {
    if (EndsWith(name, std::string(".self_attn.") + m + ".weight")) return true;
  }
  return (name.find(".mlp.shared_experts.") != std::string::npos ||
          name.find(".mlp.gate_proj.") != std::string::npos ||
          name.find(".mlp.up_proj.") != std::string::npos ||
          name.find(".mlp.down_proj.") != std::string::npos) &&
         EndsWith(name, "_proj.weight");
}

uint16_t Bf16Bits(float v) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace


LazyRandomWeights::LazyRandomWeights(const ModelConfig& c, Options options) : options_(options) {
  if (options_.num_threads <= 0) {
    options_.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  specs_ = RandomTensorSpecs(c);
  for (size_t i = 0; i < specs_.size(); ++i) index_[specs_[i].name] = i;
}

LazyRandomWeights::~LazyRandomWeights() {
  if (pending_.valid()) pending_.wait();
}

int64_t LazyRandomWeights::TotalBytes(const std::string& prefix) const {
  int64_t bytes = 0;
  for (const Spec& s : specs_) {
    if (s.name.compare(0, prefix.size(), prefix) == 0) bytes += s.numel() * 4;
  }
  return bytes;
}

void LazyRandomWeights::Fill(uint64_t seed, float mean, float bound, int num_threads,
                             std::vector<float>* out) {
  const int64_t n = static_cast<int64_t>(out->size());
  const uint64_t key = Mix(seed);
  constexpr int64_t kMinPerThread = 1 << 20;
  const int threads = static_cast<int>(
      std::clamp<int64_t>(n / kMinPerThread, 1, std::max(1, num_threads)));
  if (threads == 1) {
    FillRange(key, mean, bound, out->data(), 0, n);
    return;
  }
  // Chunks start at even indices so pairs never straddle two threads.
  const int64_t chunk = ((n + threads - 1) / threads + 1) / 2 * 2;
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) {
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, (t + 1) * chunk);
    workers.emplace_back(FillRange, key, mean, bound, out->data(), begin, end);
  }
  FillRange(key, mean, bound, out->data(), 0, std::min(n, chunk));
  for (std::thread& w : workers) w.join();
}

bool LazyRandomWeights::IsLinearWeight(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends("mlp.gate.weight")) return false;  // the router stays fp32
  // kv_a_proj_with_mqa is fp8 in the GLM-5 FP8 checkpoint too (576 rows: 5 scale row blocks,
  // the last one partial), and so is kv_b_proj (narrow models absorb from it as stored:
  // Backend::AbsorbPerHead).
  return ends("_proj.weight") || ends("_proj_with_mqa.weight") || ends(".wq_b.weight") ||
         ends(".wk.weight") || name == "lm_head.weight";
}

bool LazyRandomWeights::IsFp8Block(const std::string& name) const {
  auto it = index_.find(name);
  return options_.fp8_linear && it != index_.end() && specs_[it->second].shape.size() == 2 &&
         IsLinearWeight(name);
}

absl::StatusOr<Fp8BlockTensor> LazyRandomWeights::ReadFp8Block(const std::string& name) {
  if (!IsFp8Block(name)) {
    return absl::NotFoundError(absl::StrCat(
        "tensor ", name, " is not an fp8 block-scaled tensor of this random checkpoint (",
        options_.fp8_linear ? "not a Linear weight" : "Options::fp8_linear is off", ")"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (pending_.valid()) pending_.get();  // a prefetch of something else: discard
  const Spec& s = specs_[index_.at(name)];
  Fp8BlockTensor t;
  t.shape = s.shape;
  const int64_t rows = s.shape[0], cols = s.shape[1], n = rows * cols;
  t.data.resize(static_cast<size_t>(n));
  const uint64_t key = Mix(options_.seed * kGolden ^ NameHash(s.name) ^ 0xF8F8F8F8ull);
  const int threads = static_cast<int>(
      std::clamp<int64_t>(n / (1 << 20), 1, std::max(1, options_.num_threads)));
  const int64_t chunk = ((n + threads - 1) / threads + 7) / 8 * 8;
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i) {
    workers.emplace_back(FillBytesRange, key, t.data.data(), std::min(n, i * chunk),
                         std::min(n, (i + 1) * chunk));
  }
  FillBytesRange(key, t.data.data(), 0, std::min(n, chunk));
  for (std::thread& w : workers) w.join();
  // W = q * scale with the fp32 tensor's standard deviation.
  static const float rms = E4m3Rms();
  const float scale = s.stddev / rms;
  t.scales.assign(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)), scale);
  seconds_generating_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bytes_served_ += n + static_cast<int64_t>(t.scales.size() * sizeof(float));
  return t;
}

std::optional<QuantizedInfo> LazyRandomWeights::QuantizedInfoOf(const std::string& name) const {
  using Q = Options::Quantized;
  auto it = index_.find(name);
  if (options_.quantized == Q::kNone || it == index_.end() ||
      specs_[it->second].shape.size() != 2) {
    return std::nullopt;
  }
  QuantizedInfo info;
  info.shape = specs_[it->second].shape;
  if (options_.quantized == Q::kNvfp4) {
    if (!IsRoutedExpert(name)) return std::nullopt;
    info.dtype = WeightDType::kNvfp4;
    info.group_size = 16;
  } else if (IsRoutedExpert(name)) {
    info.dtype = WeightDType::kInt4;
    info.group_size = 128;
  } else if (IsInt8MixLinear(name)) {
    info.dtype = WeightDType::kInt8;
    info.group_size = 128;
  } else {
    return std::nullopt;
  }
  return info;
}

absl::StatusOr<QuantizedTensor> LazyRandomWeights::ReadQuantized(const std::string& name,
                                                                 const TensorSlice& slice) {
  const std::optional<QuantizedInfo> info = QuantizedInfoOf(name);
  if (!info.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "tensor ", name, " is not a quantized tensor of this random checkpoint (",
        options_.quantized == Options::Quantized::kNone ? "Options::quantized is off"
                                                        : "the layout keeps it plain",
        ")"));
  }
  const Spec& s = specs_[index_.at(name)];
  const int64_t rows = s.shape[0], cols = s.shape[1];
  int64_t r0 = 0, r1 = rows, c0 = 0, c1 = cols;
  if (slice.dim == TensorSlice::kRows) r0 = slice.begin, r1 = slice.end;
  if (slice.dim == TensorSlice::kCols) c0 = slice.begin, c1 = slice.end;
  if (r0 < 0 || r1 > rows || r0 > r1 || c0 < 0 || c1 > cols || c0 > c1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": slice [", slice.begin,
                                                   ", ", slice.end, ") is outside it"));
  }
  if (!QuantizedSliceAligned(*info, slice)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, ": the slice [", slice.begin, ", ", slice.end,
        ") splits a quantization group or a packed word"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (pending_.valid()) pending_.get();  // a prefetch of something else: discard
  const bool fp4 = info->dtype == WeightDType::kNvfp4;
  const int bits = info->dtype == WeightDType::kInt8 ? 8 : 4;
  auto packed_bytes = [&](int64_t n) { return fp4 ? (n + 1) / 2 : 4 * ((n * bits + 31) / 32); };
  const int64_t row_bytes = packed_bytes(cols);

  // The whole tensor's codes (a pure function of the seed and the name), then the slice.
  std::vector<uint8_t> codes(static_cast<size_t>(rows * row_bytes));
  const uint64_t key = Mix(options_.seed * kGolden ^ NameHash(s.name) ^ 0x5151515151ull);
  const int64_t n = static_cast<int64_t>(codes.size());
  const int threads = static_cast<int>(
      std::clamp<int64_t>(n / (1 << 20), 1, std::max(1, options_.num_threads)));
  const int64_t chunk = ((n + threads - 1) / threads + 7) / 8 * 8;
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i) {
    workers.emplace_back(FillRawBytesRange, key, codes.data(), std::min(n, i * chunk),
                         std::min(n, (i + 1) * chunk));
  }
  FillRawBytesRange(key, codes.data(), 0, std::min(n, chunk));
  for (std::thread& w : workers) w.join();

  // One scale value for the whole tensor, so that W's standard deviation is the fp32 tensor's.
  // NVFP4: every block scale is 1.0 (e4m3 0x38) and the global scale carries it.
  const float scale = s.stddev / CodeRms(info->dtype);
  uint8_t scale_entry[2] = {0x38, 0};
  if (!fp4) {
    const uint16_t b = Bf16Bits(scale);
    std::memcpy(scale_entry, &b, 2);
  }

  QuantizedTensor t;
  t.dtype = info->dtype;
  t.full_shape = s.shape;
  t.shape = {r1 - r0, c1 - c0};
  t.group_size = info->group_size;
  t.global_scale = fp4 ? scale : 1.0f;
  t.scale_bytes = fp4 ? 1 : 2;
  t.row_bytes = packed_bytes(c1 - c0);
  t.scale_cols = (c1 - c0 + info->group_size - 1) / info->group_size;
  const int64_t byte0 = fp4 ? c0 / 2 : c0 * bits / 8;  // a whole word / byte (aligned slice)
  t.data.resize(static_cast<size_t>(t.shape[0] * t.row_bytes));
  for (int64_t r = r0; r < r1; ++r) {
    std::memcpy(t.data.data() + (r - r0) * t.row_bytes, codes.data() + r * row_bytes + byte0,
                static_cast<size_t>(std::min(t.row_bytes, row_bytes - byte0)));
  }
  t.scales.resize(static_cast<size_t>(t.shape[0] * t.scale_cols * t.scale_bytes));
  for (size_t i = 0; i < t.scales.size(); i += t.scale_bytes) {
    std::memcpy(t.scales.data() + i, scale_entry, t.scale_bytes);
  }
  seconds_generating_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bytes_served_ += static_cast<int64_t>(t.data.size() + t.scales.size());
  return t;
}

std::vector<float> LazyRandomWeights::Generate(size_t spec_index) const {
  const Spec& s = specs_[spec_index];
  std::vector<float> v(static_cast<size_t>(s.numel()));
  Fill(options_.seed * kGolden ^ NameHash(s.name), s.mean, kSqrt3 * s.stddev,
       options_.num_threads, &v);
  return v;
}

absl::StatusOr<std::vector<float>> LazyRandomWeights::ReadFloat(const std::string& name,
                                                                std::vector<int64_t>* shape) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "tensor ", name, " is not part of the random checkpoint of this config (",
        specs_.size(), " tensors); the model asks for a tensor the config does not imply"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const size_t idx = it->second;
  std::vector<float> data;
  if (pending_.valid()) {
    std::vector<float> prefetched = pending_.get();
    if (pending_index_ == idx) data = std::move(prefetched);
  }
  if (data.empty() && specs_[idx].numel() > 0) data = Generate(idx);
  // Prefetch the next tensor unless the loader will take it as fp8 (ReadFp8Block, no fp32 copy).
  if (options_.prefetch && idx + 1 < specs_.size() && !IsFp8Block(specs_[idx + 1].name) &&
      !QuantizedInfoOf(specs_[idx + 1].name).has_value()) {
    pending_index_ = idx + 1;
    pending_ = std::async(std::launch::async, [this, next = idx + 1] { return Generate(next); });
  }
  seconds_generating_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bytes_served_ += static_cast<int64_t>(data.size() * sizeof(float));
  if (shape != nullptr) *shape = specs_[idx].shape;
  return data;
}

}  // namespace glm::engine
