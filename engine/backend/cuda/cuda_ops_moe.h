// Path selection of the CUDA MoeExperts (cuda_ops_moe.cu) for tests and benches: the decode
// shapes (tokens x top_k <= kMoeDecodeMaxPairs with 16-byte weight rows) run the weight-streaming
// decode kernels that route from ids in registers; up to kMoeListedMaxPairs pairs (decode batches
// up to 64 tokens with top-8) the listed decode kernels (the same weight streaming, with the
// per-expert token lists built by a one-CTA device routing kernel); larger shapes the tiled
// grouped GEMM. The previous decode GEMV (routing kernel + per-expert CTAs), the listed kernels
// at any size up to kMoeListedForceMaxPairs and the tiled GEMM stay reachable so a test can check
// every path against the CPU backend and a bench can report before / after in one process.
#pragma once

namespace glm::engine::cuda {

inline constexpr int kMoeDecodeMaxPairs = 64;
inline constexpr int kMoeListedMaxPairs = 512;  // kAuto's cut-over to the tiled GEMM
inline constexpr int kMoeListedForceMaxPairs = 4096;

enum class MoeDecodePath {
  kAuto,        // MoeDecodeKernel (<= 64 pairs), listed decode (<= 512), tiled (default)
  kLegacyGemv,  // MoeRouteKernel + MoeGemvKernel + MoeCombineKernel (before the decode kernels;
                // <= 64 pairs, else tiled)
  kTiled,       // the grouped GEMM at every size
  kListed,      // MoeListRouteKernel + MoeDecodeListKernel at every size <= 4096 pairs (else
                // tiled)
};

// The kernels the last MoeExperts call of this process launched (tests check the selection).
enum class MoeRanPath { kNone, kDecode, kListed, kLegacyGemv, kTiled };
MoeRanPath LastMoeRanPath();

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
// Token rows per pass over a task's weights in the listed decode kernels for fp8 experts: 1, 2 or
// 4 (0: the default, 1; others are rounded to those). 1 re-reads a task's weight rows per token
// row (mostly L2 hits) with 2 CTAs per SM; 2 / 4 read them once per 2 / 4 rows with 1 CTA per SM
// (149-218 registers): on an H200 2 was 8-34 % and 4 0-33 % slower than 1 at batch 8..64 (bench
// tuning only). bf16 / fp32 always take 2 rows per pass. Results are identical.
void SetMoeListedFp8Rows(int rows);

}  // namespace glm::engine::cuda
