// The heavy ops of the CUDA backend (attention, indexer scoring + top-k, routed experts), kept
// apart from cuda_backend.cc so each can be tested against the CPU backend on its own. CudaBackend
// (cuda_backend.cc) forwards Backend::Attention / IndexerTopK / MoeExperts here.
//
// Contract: arguments are exactly those of engine/backend/backend.h (same semantics, same
// tie rules: IndexerTopK ties go to the lower position, like the CPU backend); every pointer in
// them is device memory except the host arrays inside ExpertWeights (gate/up/down views, whose
// data pointers are device memory). Work is enqueued on `stream`; nothing synchronizes with the
// host. Temporary device memory comes only from `scratch`, so once scratch has grown to a step's
// size, a step of the same shape allocates nothing and can be captured in a CUDA graph.
// Errors (CUDA failures, shapes beyond what a kernel supports) come back as absl::Status naming
// the op and the limit; the backend turns them into a fatal error with that message.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace glm::kernels {
struct MoeRunInfo;  // kernels/moe.h
}  // namespace glm::kernels

namespace glm::engine::cuda {

// Grow-only device scratch owned by the backend. Get() returns at least `bytes` of device memory
// (256-byte aligned), valid until the next Get() call of the same slot. Slots let one op hold
// several buffers at once. Growing reallocates (only outside graph capture: a capture with a
// scratch that must grow fails with FailedPrecondition).
class Scratch {
 public:
  virtual ~Scratch() = default;
  virtual absl::StatusOr<void*> Get(int slot, size_t bytes) = 0;
};
inline constexpr int kScratchSlots = 8;

// kernels/mla_attention.h on the backend's views; policy.attention picks a forced kernel (tests,
// benches), policy.smem_cap_bytes caps the launch plan's shared memory. Partials in scratch
// slots 0 and 1.
absl::Status Attention(const AttentionArgs& args, const kernels::KernelPolicy& policy,
                       Scratch& scratch, cudaStream_t stream);
// IndexerTopK: cuda_indexer.h (kernels/dsa_indexer.h).
// fp8 KV cache (kernels/kv_fp8.h via cuda_ops_kv_fp8.cc; bytes bit-identical to the CPU
// backend's).
absl::Status WriteLatentFp8(const MatView& src, const int32_t* slots, const Fp8LatentCache& dst,
                            cudaStream_t stream);
absl::Status WriteIndexKeysFp8(const MatView& src, const int32_t* slots, const Fp8IndexCache& dst,
                               cudaStream_t stream);
absl::Status GatherLatentFp8(const Fp8LatentCache& src, const int32_t* slots, const MatView& out,
                             cudaStream_t stream);
// Routed experts (cuda_moe.cc over kernels/moe.h): device-side grouping, no host loop over
// experts, no host synchronization. policy.moe picks the path (kAuto in production; tests and
// benches force one); info, when set, receives the path that ran.
absl::Status MoeExperts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                        const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                        cudaStream_t stream,
                        const kernels::KernelPolicy& policy = kernels::KernelPolicy(),
                        kernels::MoeRunInfo* info = nullptr);
// Backend::MoeRouteExperts: at decode shapes of at most kernels::kMoeRouteFuseMaxTokens tokens
// the gate|up kernel routes for itself (one launch fewer), else kernels::MoeRoute then the
// experts.
absl::Status MoeRouteExperts(const MatView& logits, const MoeRouteArgs& r, const MatView& x,
                             const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                             cudaStream_t stream,
                             const kernels::KernelPolicy& policy = kernels::KernelPolicy(),
                             kernels::MoeRunInfo* info = nullptr);

// INT4 / INT8 / NVFP4 experts read narrow (cuda_moe.cc over kernels/moe_quant.h): whether the
// layer's experts take that path for `pairs` = tokens * top_k >= 1 (every projection of every
// expert in one quantized dtype with one group size); the backend widens the experts to bf16
// otherwise (QuantLinear::WidenExperts: layers that mix formats). More tokens than
// kernels::kMoeQuantMaxPairs / top_k run as consecutive pieces of that many (prefill). The
// per-expert device table is built once per layer, keyed by experts.gate. Same contract as
// MoeExperts / MoeRouteExperts above (scratch slots 0-2).
bool QuantExpertsNarrow(const ExpertWeights& experts, int64_t pairs);
absl::Status MoeQuantExperts(const MatView& x, const int32_t* ids, const float* weights,
                             int top_k, const ExpertWeights& experts, const MatView& out,
                             Scratch& scratch, cudaStream_t stream,
                             const kernels::KernelPolicy& policy = kernels::KernelPolicy());
absl::Status MoeQuantRouteExperts(const MatView& logits, const MoeRouteArgs& r, const MatView& x,
                                  const ExpertWeights& experts, const MatView& out,
                                  Scratch& scratch, cudaStream_t stream,
                                  const kernels::KernelPolicy& policy = kernels::KernelPolicy());

}  // namespace glm::engine::cuda
