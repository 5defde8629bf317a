// Backend::Attention on the CUDA backend: AttentionArgs (backend.h) as kernels/mla_attention.h's
// plain arguments; the kernels, their choice by shape and their limits are documented there.
#include <atomic>

#include "absl/status/statusor.h"
#include "common/status_util.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_ops_hooks.h"
#include "kernels/mla_attention.h"

namespace glm::engine::cuda {
namespace {

// The kernel of the last Attention call (LastAttentionPathForTest).
std::atomic<kernels::MlaAttentionPath> g_last_path{kernels::MlaAttentionPath::kByShape};

kernels::MlaHeads Heads(const HeadsView& x) {
  return {x.data, x.rows, x.heads, x.dim, x.row_stride, x.head_stride};
}

}  // namespace

kernels::MlaAttentionPath LastAttentionPathForTest() { return g_last_path.load(); }

absl::Status Attention(const AttentionArgs& a, const kernels::KernelPolicy& policy,
                       Scratch& scratch, cudaStream_t stream) {
  kernels::MlaAttentionArgs k;
  k.q_a = Heads(a.q_a);
  k.q_b = Heads(a.q_b);
  k.k_a = Heads(a.k_a);
  k.k_b = Heads(a.k_b);
  k.v = Heads(a.v);
  k.out = {a.out.data, a.out.rows, a.out.heads, a.out.dim, a.out.row_stride, a.out.head_stride};
  k.slots = a.table.slots;
  k.row_offset = a.table.row_offset;
  k.row_num_keys = a.table.row_num_keys;
  k.max_num_keys = a.table.max_num_keys;
  k.indices = a.indices;
  k.index_width = a.index_width;
  k.scale = a.scale;
  k.latent_fp8 = a.latent_fp8.data;
  k.kv_lora_rank = a.latent_fp8.kv_lora_rank;
  k.rope_dim = a.latent_fp8.rope_dim;
  GLM_ASSIGN_OR_RETURN(
      const kernels::MlaAttentionPath path,
      kernels::MlaAttention(k, policy.attention, policy.smem_cap_bytes,
                            [&](int slot, size_t bytes) { return scratch.Get(slot, bytes); },
                            stream));
  if (a.q_a.rows > 0 && a.q_a.heads > 0) g_last_path.store(path, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace glm::engine::cuda
