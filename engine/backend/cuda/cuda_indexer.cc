#include "engine/backend/cuda/cuda_indexer.h"

#include "absl/strings/str_cat.h"

namespace glm::engine::cuda {

absl::Status IndexerTopK(const IndexerTopKArgs& args, const kernels::KernelPolicy& policy,
                         Scratch& scratch, cudaStream_t stream,
                         kernels::DsaIndexerLaunch* launched) {
  if (launched != nullptr) *launched = kernels::DsaIndexerLaunch{};
  const int64_t rows = args.q.rows;
  if (rows == 0 || args.top_k <= 0) return absl::OkStatus();
  // The engine's views carry the widths more than once: they must agree.
  const bool fp8 = args.keys_fp8.data != nullptr;
  if (args.keys.cols != args.q.dim || args.weights.cols < args.q.heads ||
      args.weights.rows < rows || (fp8 && args.keys_fp8.dim != args.q.dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda IndexerTopK: mismatched shapes: q [", rows, ", ", args.q.heads, ", ", args.q.dim,
        "], keys cols ", args.keys.cols, ", weights [", args.weights.rows, ", ",
        args.weights.cols, "], fp8 key cache dim ", fp8 ? args.keys_fp8.dim : 0,
        " (keys and the fp8 cache need dim == index_head_dim)"));
  }
  kernels::DsaIndexerArgs k;
  k.q = args.q.data;
  k.rows = rows;
  k.heads = args.q.heads;
  k.dim = args.q.dim;
  k.q_row_stride = args.q.row_stride;
  k.q_head_stride = args.q.head_stride;
  k.weights = args.weights.data;
  k.weights_ld = args.weights.ld;
  k.keys = args.keys.data;
  k.keys_ld = args.keys.ld;
  if (fp8) {
    k.keys_fp8 = args.keys_fp8.data;
    k.block_size = args.keys_fp8.block_size;
  }
  k.slots = args.table.slots;
  k.row_offset = args.table.row_offset;
  k.row_num_keys = args.table.row_num_keys;
  k.max_num_keys = args.table.max_num_keys;
  k.weight_scale = args.weight_scale;
  k.score_scale = args.score_scale;
  k.top_k = args.top_k;
  k.out = args.out;
  return kernels::DsaIndexerTopK(
      k, policy.indexer, policy.smem_cap_bytes,
      [&scratch](int slot, size_t bytes) { return scratch.Get(slot, bytes); }, stream, launched);
}

}  // namespace glm::engine::cuda
