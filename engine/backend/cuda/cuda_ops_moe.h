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

// Tried on an H200 at GLM-5 widths (256 experts top-8) and removed as slower than the kernels
// above: L2 prefetch 4 / 8 chunk iterations ahead in the decode kernels, 6-19 % slower at batch
// 1 / 8; decode tasks fetched from a device counter (warps that finish early take more), 4-7 %
// slower at batch 1, equal at batch 8; fp8 widened with integer ops instead of the e4m3
// conversion instructions, 20-30 % slower; listed decode fp8 with 2 / 4 token rows per pass
// (1 CTA per SM) instead of 1, us per call at batch 8 / 16 / 32 / 64: 1 row 640 / 1225 / 2386 /
// 4716, 2 rows 857 / 1570 / 2837 / 5105, 4 rows 854 / 1555 / 2755 / 4705; a cap on the decode
// kernels' CTAs per SM was a bench knob with no recorded gain. (And in
// kernels/moe_route: a rolled top-k loop over shared memory, 11.9 vs 8.7 us per launch.)

}  // namespace glm::engine::cuda
