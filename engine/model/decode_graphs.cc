#include "engine/model/decode_graphs.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/model/layers.h"

namespace glm::engine {

int32_t DecodeGraphs::KeyBucket(int32_t max_num_keys) {
  int64_t b = 64;
  while (b < max_num_keys) b *= 2;
  return static_cast<int32_t>(std::min<int64_t>(b, int64_t{1} << 30));
}

DecodeGraphs::Tables DecodeGraphs::Upload(const std::vector<int32_t>& tokens,
                                          const std::vector<int32_t>& positions,
                                          const std::vector<int32_t>& new_slots,
                                          const std::vector<int32_t>& row_offset,
                                          const std::vector<int32_t>& row_num_keys,
                                          const int32_t* key_slots) {
  constexpr size_t kHead = 5 * kMaxBatch;
  if (tables_ == nullptr) {
    tables_ = backend_->Allocate(kHead * sizeof(int32_t));
    staging_.assign(kHead, 0);
  }
  if (key_slots != key_slots_) {
    Clear();  // the graphs read the old key-slot table
    key_slots_ = key_slots;
  }
  const std::vector<int32_t>* small[] = {&tokens, &positions, &new_slots, &row_offset,
                                         &row_num_keys};
  size_t batch = 0;
  for (int i = 0; i < 5; ++i) {
    std::memcpy(staging_.data() + i * kMaxBatch, small[i]->data(),
                small[i]->size() * sizeof(int32_t));
    batch = std::max(batch, small[i]->size());
  }
  // Only the rows in use: [4 * kMaxBatch + batch) covers every table's first `batch` entries.
  backend_->CopyToDevice(tables_->data(), staging_.data(),
                         (4 * kMaxBatch + batch) * sizeof(int32_t));
  const int32_t* base = tables_->i32();
  Tables t;
  t.tokens = base;
  t.positions = base + kMaxBatch;
  t.new_slots = base + 2 * kMaxBatch;
  t.row_offset = base + 3 * kMaxBatch;
  t.row_num_keys = base + 4 * kMaxBatch;
  t.key_slots = key_slots;
  return t;
}

int64_t DecodeGraphs::Epoch() const { return backend_->scratch_epoch(); }

absl::Status DecodeGraphs::Run(int batch, int32_t key_bucket, bool use_graphs,
                               const std::function<void()>& body) {
  ++decode_steps_;
  if (!use_graphs) {
    ++eager_steps_;
    body();
    return backend_->status();
  }
  const std::pair<int, int32_t> key{batch, key_bucket};
  auto it = graphs_.find(key);
  if (it != graphs_.end() && it->second.epoch == Epoch()) {
    ++replays_;
    backend_->ReplayGraph(*it->second.graph);
    return backend_->status();
  }
  if (it != graphs_.end()) {
    graphs_.erase(it);
    ++invalidations_;
    --num_graphs_;
  }
  // Eager run: grows workspace and scratch to this shape and produces this step's output.
  ++eager_steps_;
  body();
  GLM_RETURN_IF_ERROR(backend_->status());
  // The eager run validated every pointer; no per-launch driver queries from here on.
  backend_->SetPointerChecks(false);
  backend_->BeginCapture();
  body();
  std::unique_ptr<BackendGraph> graph = backend_->EndCapture();
  if (graph == nullptr) {
    return Annotate(backend_->status(),
                    absl::StrCat("capturing the decode graph of batch ", batch, ", key bucket ",
                                 key_bucket, " (run with cuda_graphs off to bypass)"));
  }
  ++captures_;
  ++num_graphs_;
  graphs_[key] = Entry{std::move(graph), Epoch()};
  return backend_->status();
}

void DecodeGraphs::Clear() {
  invalidations_ += static_cast<int64_t>(graphs_.size());
  graphs_.clear();
  num_graphs_ = 0;
}

DecodeGraphStats DecodeGraphs::stats() const {
  DecodeGraphStats s;
  s.decode_steps = decode_steps_;
  s.eager_steps = eager_steps_;
  s.captures = captures_;
  s.replays = replays_;
  s.invalidations = invalidations_;
  s.num_graphs = num_graphs_;
  return s;
}

}  // namespace glm::engine
