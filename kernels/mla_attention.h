// Sparse MLA attention, fp32 (the engine's Backend::Attention on the CUDA backend): prefill in the
// expanded form (per-head keys and values) and decode in the absorbed form (keys = values = the
// latent c_kv | k_pe, shared by every head), over fp32 key views or the fp8 latent cache.
//
//   out[t, h, :] = sum_j p_j v[r_j, h, :],  p = softmax_j(scale * (q_a[t, h] . k_a[r_j, h] +
//                                                                  q_b[t, h] . k_b[r_j, h]))
// where r_j = slots[row_offset[t] + pos_j] for the row's positions pos_j: indices[t, j] for
// j < index_width when indices is set (the DSA top-k; -1 and positions outside
// [0, row_num_keys[t]) are skipped), else every pos in [0, row_num_keys[t]). A row with no
// position gets zeros.
//
// Kernels (mla_attention.cuh), chosen by shape (MlaAttentionPath::kByShape):
// - tensor core: fp8 latent cache at GLM-5 widths (kv_lora_rank 512, rope 64) with the head count
//   a multiple of 16; split-bf16 mma.sync, within ~1e-5 relative of the fp32 kernels.
// - staged: 16 heads per CTA over broadcast keys (the absorbed form), key tiles staged in shared
//   memory: fp8 rows always, fp32 rows at up to 2 tiles per CTA (batch 1-2 decode).
// - split: every other call (per-head keys of the expanded prefill, fewer than 16 heads, fp32
//   absorbed rows at more than 2 tiles per CTA). The plain flash-decoding kernel.
// NOTE: the tensor-core kernel replaced the staged one for the fp8 cache: H200, 64 heads, 2048
// selected keys, batch 1 / 8 / 64 in 15.4 / 40 / 232 us vs 33 / 170 / 1274 us (cuda_kv_bench).
// Deterministic: the same inputs give the same bits on every launch (fixed summation orders).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernel_policy.h"

namespace glm::kernels {

// [rows, heads, dim] fp32 on the device: element (r, h, d) at data[r * row_stride +
// h * head_stride + d]. head_stride 0 broadcasts one vector to every head.
struct MlaHeads {
  const float* data = nullptr;
  int64_t rows = 0, heads = 0, dim = 0;
  int64_t row_stride = 0, head_stride = 0;
};

// The output view: as MlaHeads, written.
struct MlaHeadsOut {
  float* data = nullptr;
  int64_t rows = 0, heads = 0, dim = 0;
  int64_t row_stride = 0, head_stride = 0;
};

struct MlaAttentionArgs {
  MlaHeads q_a, q_b;  // [num_tokens, num_heads, da] / [.., db] queries
  MlaHeads k_a, k_b;  // [num_key_rows, heads or broadcast, da] / [.., db] keys
  MlaHeads v;         // [num_key_rows, heads or broadcast, dv] values
  MlaHeadsOut out;    // [num_tokens, num_heads, dv]
  // Paged key table (device int32): row t's positions map to key rows
  // slots[row_offset[t] + pos]; max_num_keys >= every row_num_keys[t] (host value).
  const int32_t* slots = nullptr;
  const int32_t* row_offset = nullptr;
  const int32_t* row_num_keys = nullptr;
  int64_t max_num_keys = 0;
  // [num_tokens, index_width] selected positions (device), or null for every position.
  const int32_t* indices = nullptr;
  int64_t index_width = 0;
  float scale = 1.0f;
  // fp8 latent cache (kv_fp8_layout.h rows of kv_lora_rank + rope_dim), or null. When set, keys
  // and values are read from its rows (da == dv == kv_lora_rank, db == rope_dim): the k_a / k_b /
  // v views then only give dims (their data is not read). 16-byte aligned.
  const uint8_t* latent_fp8 = nullptr;
  int64_t kv_lora_rank = 0, rope_dim = 0;
};

// Device memory for the split partials: slot 0 and 1, at least `bytes` each, valid until the
// call returns (the caller's grow-only scratch; a graph-captured call must get the same memory).
using MlaWorkspace = absl::FunctionRef<absl::StatusOr<void*>(int slot, size_t bytes)>;

// Enqueues the attention on `stream`; returns the kernel it ran (never kByShape). policy.path /
// tc_heads_per_cta force a kernel where it applies (kernel_policy.h); smem_cap_bytes lowers the
// device's opt-in shared memory for the launch plan (KernelPolicy::smem_cap_bytes, 0 = none).
// InvalidArgument naming the limit for shapes the kernels do not take (mismatched dims, views not
// 16-byte aligned with strides multiple of 4 floats, dv > 1024, an fp8 cache whose widths do not
// match the views, a grid past 2^31 CTAs); FailedPrecondition when the shared memory a kernel
// needs exceeds the device's; Internal for CUDA errors. Nothing for num_tokens == 0.
absl::StatusOr<MlaAttentionPath> MlaAttention(const MlaAttentionArgs& args,
                                              const AttentionPolicy& policy,
                                              int64_t smem_cap_bytes, MlaWorkspace workspace,
                                              cudaStream_t stream);

}  // namespace glm::kernels
