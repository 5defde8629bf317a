// Path selection of the CUDA MoeExperts (cuda_ops_moe.cu) for tests and benches: the decode
// shapes (tokens x top_k <= 64 with 16-byte weight rows) run the weight-streaming decode kernels
// by default; the previous decode GEMV (routing kernel + per-expert CTAs) and the tiled grouped
// GEMM stay reachable so a test can check all three against the CPU backend and a bench can
// report before / after in one process. Larger shapes always take the tiled grouped GEMM.
#pragma once

namespace glm::engine::cuda {

enum class MoeDecodePath {
  kAuto,        // MoeDecodeKernel (default)
  kLegacyGemv,  // MoeRouteKernel + MoeGemvKernel + MoeCombineKernel (before the decode kernels)
  kTiled,       // the grouped GEMM at every size
};

// Process-wide; takes effect at the next MoeExperts call (not for already captured graphs).
void SetMoeDecodePath(MoeDecodePath path);
// Caps the decode kernels' persistent grid at `ctas` CTAs per SM (0: as many as are resident;
// bench tuning only).
void SetMoeDecodeCtasPerSm(int ctas);
// L2 prefetch distance of the decode kernels in 32-chunk iterations (default 0 = off: on an H200
// prefetching 4 / 8 iterations ahead was 6-19 % slower at batch 1 / 8; < 2: off; bench
// tuning only).
void SetMoeDecodeL2Prefetch(int chunks_ahead);
// Decode kernels take tasks statically (default: warp w takes tasks w, w + W, ...) or from a
// device counter (warps that finish early take more; on an H200 4-7 % slower at batch 1, equal at
// batch 8: the per-task atomic costs more than the imbalance it removes). Results are identical.
void SetMoeDecodeDynamicTasks(bool on);
// fp8 weights widened with integer ops instead of the e4m3 conversion instructions (default off:
// 20-30 % slower on an H200; an e4m3 NaN then widens to 480; bench tuning only).
void SetMoeDecodeFp8IntWiden(bool on);

}  // namespace glm::engine::cuda
