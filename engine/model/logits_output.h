// The last step of a forward pass: the lm_head rows of a step become SequenceOutputs, either as
// host logits or, for slices that ask for it (SequenceSlice::sample), as a token picked on the
// backend (Backend::Sample), so that only token ids cross to the host for those.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/forward_batch.h"

namespace glm::engine {

// Owns small backend buffers (grown on demand, outside any captured region). One per model; used
// from the model's step thread only.
class LogitsOutput {
 public:
  // logits: [R, vocab] backend memory; sequence i owns rows [row_begin[i], row_begin[i + 1])
  // (the last up to R). Fills result->seqs[i].logits or .sampled_token. Host copies wait for the
  // backend; errors land in backend->status() as for any op.
  void Emit(Backend* backend, const ForwardBatch& batch, const std::vector<int64_t>& row_begin,
            const MatView& logits, ForwardResult* result) {
    const size_t n = batch.seqs.size();
    const int64_t R = logits.rows, V = logits.cols;
    result->seqs.resize(n);
    std::vector<int64_t> rows;  // logits rows to sample, in sequence order
    std::vector<size_t> owners;
    for (size_t i = 0; i < n; ++i) {
      const int64_t begin = row_begin[i], end = i + 1 < n ? row_begin[i + 1] : R;
      SequenceOutput& out = result->seqs[i];
      out.sampled_token = -1;
      const SequenceSlice& s = batch.seqs[i];
      if (s.sample.enabled && !s.all_logits && end - begin == 1) {
        rows.push_back(begin);
        owners.push_back(i);
        out.logits.clear();
        continue;
      }
      out.logits.resize((end - begin) * V);
      backend->CopyToHost(out.logits.data(), logits.Row(begin), (end - begin) * V * sizeof(float));
    }
    if (rows.empty()) return;
    const int64_t m = static_cast<int64_t>(rows.size());
    // Packed parameters: seed[m] u64 | index[m] i64 | temperature[m] f32 | top_p[m] f32 |
    // top_k[m] i32 | rows[m] i32 | out_ids[m] i32.
    const size_t bytes = static_cast<size_t>(m) * (8 + 8 + 4 + 4 + 4 + 4 + 4);
    if (params_ == nullptr || params_->bytes() < bytes) params_ = backend->Allocate(bytes * 2);
    std::vector<unsigned char> host(bytes);
    unsigned char* p = host.data();
    for (int64_t j = 0; j < m; ++j) {
      const SequenceSlice::DeviceSample& d = batch.seqs[owners[j]].sample;
      const int32_t row = static_cast<int32_t>(rows[j]);
      std::memcpy(p + j * 8, &d.seed, 8);
      std::memcpy(p + m * 8 + j * 8, &d.index, 8);
      std::memcpy(p + m * 16 + j * 4, &d.temperature, 4);
      std::memcpy(p + m * 20 + j * 4, &d.top_p, 4);
      std::memcpy(p + m * 24 + j * 4, &d.top_k, 4);
      std::memcpy(p + m * 28 + j * 4, &row, 4);
    }
    unsigned char* dev = static_cast<unsigned char*>(params_->data());
    backend->CopyToDevice(dev, host.data(), static_cast<size_t>(m) * 32);
    SampleArgs a;
    a.seed = reinterpret_cast<const uint64_t*>(dev);
    a.index = reinterpret_cast<const int64_t*>(dev + m * 8);
    a.temperature = reinterpret_cast<const float*>(dev + m * 16);
    a.top_p = reinterpret_cast<const float*>(dev + m * 20);
    a.top_k = reinterpret_cast<const int32_t*>(dev + m * 24);
    a.out_ids = reinterpret_cast<int32_t*>(dev + m * 32);
    bool contiguous = true;
    for (int64_t j = 1; j < m; ++j) contiguous = contiguous && rows[j] == rows[0] + j;
    if (contiguous) {
      a.logits = logits.Rows(rows[0], m);
    } else {  // [m, V] copy of the sampled rows
      const size_t need = static_cast<size_t>(m * V) * sizeof(float);
      if (gathered_ == nullptr || gathered_->bytes() < need) gathered_ = backend->Allocate(need);
      a.logits = {gathered_->f32(), m, V, V};
      backend->GatherRows(logits, reinterpret_cast<const int32_t*>(dev + m * 28), a.logits);
    }
    backend->Sample(a);
    std::vector<int32_t> ids(static_cast<size_t>(m), -1);
    backend->CopyToHost(ids.data(), a.out_ids, static_cast<size_t>(m) * sizeof(int32_t));
    for (int64_t j = 0; j < m; ++j) result->seqs[owners[j]].sampled_token = ids[j];
  }

 private:
  std::unique_ptr<Buffer> params_;    // packed per-row parameters and output ids
  std::unique_ptr<Buffer> gathered_;  // [m, vocab] when the sampled rows are not contiguous
};

}  // namespace glm::engine
