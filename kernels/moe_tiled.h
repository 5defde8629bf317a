// Tiled grouped GEMM of the routed experts (moe_tiled.cuh): the large-shape path and the
// reference. Launchers for kernels/moe.cu (CUDA sources only: op_util.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe_common.h"
#include "kernels/op_util.h"

namespace glm::kernels::moe {

inline constexpr int kThreads = 256;
inline constexpr int kBM = 64, kBN = 128, kBK = 32, kPad = 4, kRowF = kBK + kPad;
inline constexpr int kRowsPerWarp = 8;

struct GemmParams {
  const float* a;  // fused: x [tokens, K] (rows gathered by token); else act [pairs, K]
  int64_t a_ld;
  int top_k;       // fused: token = row_pair[row] / top_k
  const MoeExpert* experts;
  const int32_t* expert_off;
  const int32_t* tile_off;
  const int32_t* row_pair;
  int num_experts;
  int n, k;        // output columns, reduction length
  float* c;        // [pairs, n]
};

template <bool kFused, int kStages>
constexpr int GemmSmemFloats() {
  return kStages * (kBM + (kFused ? 2 : 1) * kBN) * kRowF;
}

// Worst-case tiles of `pairs` rows over at most min(num_experts, pairs) experts.
inline int64_t MaxTiles(int64_t pairs, int64_t num_experts) {
  return detail::CeilDiv(pairs, kBM) + (num_experts < pairs ? num_experts : pairs);
}

// MoeRouteKernel: expert_off / tile_off [num_experts + 1], row_pair / pair_row [pairs].
absl::Status LaunchTiledRoute(const int32_t* ids, int pairs, int num_experts, int32_t* expert_off,
                              int32_t* tile_off, int32_t* row_pair, int32_t* pair_row,
                              cudaStream_t stream);

// MoeGemmKernel: one weight pass (fused: gate|up into act; else down into y) over max_tiles
// row tiles; 4 pipeline stages where the device's shared memory allows, else 2.
absl::Status LaunchTiledGemm(bool fused, int wt, const GemmParams& p, int64_t max_tiles,
                             const detail::DeviceInfo& info, cudaStream_t stream);

// MoeCombineKernel: out [tokens, hidden] += sum_j weights[t, j] * y[pair_row[t, j]].
absl::Status LaunchTiledCombine(const float* y, const int32_t* pair_row, const float* weights,
                                int top_k, int64_t tokens, int hidden, float* out,
                                int64_t out_ld, cudaStream_t stream);

}  // namespace glm::kernels::moe
