// The CUDA backend: engine/backend/backend.h on one GPU, fp32 throughout.
//
// - Memory: Allocate is cudaMalloc + zero-fill on the backend's stream. Copies are stream-ordered
//   (CopyToHost waits for them); every op is enqueued on the backend's own non-blocking stream.
// - Linear / LinearPerHead: cuBLASLt, CUBLAS_COMPUTE_32F (cublaslt_matmul.h), plans cached per
//   shape. Linear with bf16 / fp8 block-scaled weights (backend.h WeightDType): cuda_linear.h;
//   AbsorbPerHead (MLA W_UK / W_UV on kv_b_proj as stored): kernels/per_head_narrow.h up to
//   8 tokens, else the blocks widened to fp32 scratch (PerHeadWidenF32) + the fp32 GEMM;
//   MoeExperts widens bf16 / fp8 expert weights inside its tiles. Small ops: the kernels in
//   kernels/ (rmsnorm, layernorm, rope, silu_mul, rows, moe_route). Attention, IndexerTopK,
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
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_ordinal);

// For A/B runs in one process (benches), every CUDA backend: false makes BeginSide, EndSide and
// JoinSide no-ops from the next op on (a branch's ops then run in order on the main stream);
// call it between steps. Graphs captured under the other setting are recaptured (the change
// moves scratch_epoch()).
void AllowCudaSideBranches(bool allowed);

// For A/B runs in one process (benches), every CUDA backend: false sends fp32 Linears of one row
// with small weights (the MoE router) to cuBLASLt instead of kernels::PerHeadGemv (the default
// since the seventh session: a launch that takes part in programmatic dependent launch). Graphs
// captured under the other setting are recaptured.
void AllowCudaSmallF32Gemv(bool allowed);

}  // namespace glm::engine
