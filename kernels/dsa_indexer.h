// DSA lightning indexer (spec §3.3 steps 5-7): scores + causal top-k, fp32 arithmetic.
//   I[t, s] = sum_h w[t, h] * weight_scale * relu(q[t, h] . k[s] * score_scale),  s < num_keys(t)
//   out[t, :] = the positions of the min(top_k, num_keys(t)) largest I[t, .] in ascending order,
//               then -1. Ties go to the lower position; -0.0 == +0.0; NaN ranks below -inf.
// Rows with num_keys <= top_k get 0..num_keys-1 then -1 without scoring. Bit for bit the CPU
// backend's output on scores it computes alike (engine/backend/cpu). Deterministic: a CUDA-graph
// replay gives the eager call's bits.
//
// Kernels: dsa_indexer_score.cuh (fp32 CUDA-core and tensor-core scores), dsa_indexer_select.cuh
// (three radix-select paths); the choice by shape is in dsa_indexer.cu. Every kernel opens with
// PdlEnter (launch.cuh), so the last kernel of a call waits for its predecessor before it lets
// dependents launch. Host-side errors come back as absl::Status naming the op and the limit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernel_policy.h"

namespace glm::kernels {

// Device pointers; shapes in elements.
struct DsaIndexerArgs {
  // Queries [rows, heads, dim] fp32 (roped): (t, h, d) at q[t * q_row_stride + h * q_head_stride
  // + d]. float4 loads where q is 16-byte aligned with strides multiples of 4, else scalar.
  const float* q = nullptr;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t dim = 0;  // index_head_dim: a positive multiple of 4 (float4 loads)
  int64_t q_row_stride = 0;
  int64_t q_head_stride = 0;
  const float* weights = nullptr;  // [rows, >= heads], row stride weights_ld
  int64_t weights_ld = 0;
  // fp32 key rows [num_key_rows, dim], row stride keys_ld (a multiple of 4, 16-byte aligned
  // data); unused when keys_fp8 is set.
  const float* keys = nullptr;
  int64_t keys_ld = 0;
  // The fp8 paged key cache (kernels/kv_fp8_layout.h: blocks of block_size slots, block_size * dim
  // e4m3 values then block_size fp32 scales; 16-byte aligned), or null for fp32 keys.
  const uint8_t* keys_fp8 = nullptr;
  int32_t block_size = 0;
  // Row t's keys: slots[row_offset[t] + i], i < row_num_keys[t] <= max_num_keys.
  const int32_t* slots = nullptr;
  const int32_t* row_offset = nullptr;
  const int32_t* row_num_keys = nullptr;
  int32_t max_num_keys = 0;
  float weight_scale = 1.0f;  // index_n_heads^-0.5
  float score_scale = 1.0f;   // index_head_dim^-0.5
  int32_t top_k = 0;
  int32_t* out = nullptr;  // [rows, top_k]
};

// Device memory the launchers take their intermediates from, by slot: returns at least `bytes`
// (16-byte aligned at least), valid until the enqueued work has run. Slot 0: the scores [rows,
// scores_ld] fp32 (DsaIndexerLaunch::scores_ld; tests read them there); slot 1: the select
// histograms and look-back words (zeroed by the launcher). During graph capture the memory must
// already be there (the engine's Scratch fails a capture that would grow it).
using DsaIndexerWorkspace = absl::FunctionRef<absl::StatusOr<void*>(int slot, size_t bytes)>;

// What a call ran (tests check that the choice by shape takes the kernel it should). score:
// kByShape when no row needed scores; select: kByShape when every row had num_keys <= top_k.
struct DsaIndexerLaunch {
  IndexerPolicy::Score score = IndexerPolicy::Score::kByShape;
  IndexerPolicy::Select select = IndexerPolicy::Select::kByShape;
  int64_t scores_ld = 0;  // floats per row of the scores in workspace slot 0
};

// Scores + top-k on `stream`. smem_cap_bytes: KernelPolicy::smem_cap_bytes (0 = the device's
// opt-in limit). The tensor-core score kernel needs sm_80+, index_head_dim 128 and a block_size
// that is a multiple of 4 (else the fp32 kernel scores).
// Limits (InvalidArgument / FailedPrecondition naming them): dim a positive multiple of 4; fp32
// keys 16-byte aligned with keys_ld a multiple of 4; fp8 keys 16-byte aligned, block_size > 0;
// rows < 2^31 and the score / select grids within 2^31 - 1 CTAs; the fp32 kernel's queries plus a
// key tile within the opt-in shared memory.
absl::Status DsaIndexerTopK(const DsaIndexerArgs& args, const IndexerPolicy& policy,
                            int64_t smem_cap_bytes, DsaIndexerWorkspace workspace,
                            cudaStream_t stream, DsaIndexerLaunch* launched = nullptr);

// The top-k select alone on given scores [rows, ld] (device; ld a multiple of 4 and >=
// max_num_keys, 16-byte aligned): the same output contract as DsaIndexerTopK for those scores,
// through the policy's select path (pass 0's histogram built by IndexerHistKernel where the path
// needs one). Uses workspace slot 1 only.
absl::Status DsaIndexerSelect(const float* scores, int64_t ld, int64_t rows,
                              const int32_t* row_num_keys, int32_t max_num_keys, int top_k,
                              int32_t* out, const IndexerPolicy& policy, int64_t smem_cap_bytes,
                              DsaIndexerWorkspace workspace, cudaStream_t stream,
                              DsaIndexerLaunch* launched = nullptr);

}  // namespace glm::kernels
