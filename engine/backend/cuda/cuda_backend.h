// The CUDA backend: engine/backend/backend.h on one GPU, fp32 throughout.
//
// - Memory: Allocate is cudaMalloc + zero-fill on the backend's stream. Copies are stream-ordered
//   (CopyToHost waits for them); every op is enqueued on the backend's own non-blocking stream.
// - Linear / LinearPerHead: cuBLASLt, CUBLAS_COMPUTE_32F (cublaslt_matmul.h), plans cached per
//   shape. Linear with bf16 / fp8 block-scaled weights (backend.h WeightDType): cuda_linear.h;
//   AbsorbPerHead (MLA W_UK / W_UV on kv_b_proj as stored): kernels/per_head_narrow.h up to
//   8 tokens, else the blocks widened to fp32 scratch (PerHeadWidenF32) + the fp32 GEMM;
//   MoeExperts widens bf16 / fp8 expert weights inside its tiles. INT4 / INT8 / NVFP4 weights
//   (Linear and experts) stay as stored: cuda_quant_linear.h (experts read narrow by
//   kernels/moe_quant.h at decode sizes). Small ops: the kernels in kernels/ (rmsnorm,
//   layernorm, rope, silu_mul, rows, moe_route). Attention, IndexerTopK,
//   MoeExperts: cuda_ops.h. Temporary device memory of those comes from a grow-only scratch
//   (cuda_ops.h Scratch) owned by the backend.
// - Errors: ops return void (hot path). The first CUDA / cuBLAS / launch-check error is kept
//   (Backend::status()); every later op is skipped, and the model returns that status after the
//   step (the engine fails fast with it). Asynchronous faults surface at CopyToHost/Synchronize.
// - Threads: one thread at a time (the engine's step thread); the backend binds its device on
//   whichever thread calls it.
// - Side branches (Backend::BeginSide): a second non-blocking stream, forked and joined with
//   events (graph capture turns them into edges).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace glm::engine {

// OK when a CUDA device and driver are usable; otherwise FailedPrecondition saying why (no
// driver, no device) and what to do.
absl::Status CudaDeviceAvailable();

// A backend on device `device_ordinal`. Errors: no usable device/driver (FailedPrecondition),
// ordinal out of range (InvalidArgument), stream/cuBLASLt setup failures (Internal).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    int device_ordinal, const kernels::KernelPolicy& policy = kernels::KernelPolicy());

// Backend::RmsNormLinear runs as one launch with the norm fused (narrow weights: the decode GEMV,
// kernels/gemv_narrow.h GemvNarrowArgs::norm_w; fp32 weights of one row such as the MoE router:
// kernels/per_head_gemv.h PerHeadGemvNorm; the same bits as RmsNorm then Linear) for calls of at
// most 16 rows whose shape takes that kernel; else as the two ops. Whether the last call on a
// CUDA backend ran fused (tests).
bool LastCudaNormLinearFused();

// Backend::AbsorbPerHeadBesidePrevious right after IndexerTopK runs the narrow W_UK kernel beside
// the indexer's last kernel where the device has programmatic dependent launch
// (kernels/per_head_narrow.h PerHeadNarrowArgs::beside_previous: it starts without waiting and
// waits only before it exits; the same y). How many AbsorbPerHead launches so far (all CUDA
// backends, graph captures included) ran that way (tests: the model's decode step takes it).
int64_t CudaAbsorbBesideLaunches();

// MoeExperts / MoeRouteExperts calls with INT4 / INT8 / NVFP4 experts so far (all CUDA backends,
// graph captures included): read narrow (kernels/moe_quant.h) or widened to bf16 first
// (QuantLinear::WidenExperts: beyond kernels::kMoeQuantMaxPairs pairs, or a layer mixing
// formats). Tests: decode steps never widen.
struct CudaQuantExpertCalls {
  int64_t narrow = 0;
  int64_t widened = 0;
};
CudaQuantExpertCalls CudaQuantExpertCallCounts();

}  // namespace glm::engine
