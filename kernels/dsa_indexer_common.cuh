// Device helpers shared by the DSA indexer's score kernels (dsa_indexer_score.cuh) and select
// kernels (dsa_indexer_select.cuh): the order-preserving uint32 image of a score that the radix
// select works on, and the warp-aggregated histogram add of its digits.
#pragma once

#include <cstdint>

#include "kernels/launch.cuh"

namespace glm::kernels::dsa_indexer {

// Larger float -> larger key; -0.0 == +0.0; NaN lowest.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Adds the warp's digits (256: no bin) into hist_s [256]: one shared atomic per distinct digit
// (integer counts: the order does not matter). Used by the score and the select kernels.
__device__ __forceinline__ void WarpHistAdd(uint32_t digit, int lane, uint32_t* hist_s) {
  const uint32_t peers = __match_any_sync(0xffffffffu, digit);
  if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist_s[digit], __popc(peers));
}

}  // namespace glm::kernels::dsa_indexer
