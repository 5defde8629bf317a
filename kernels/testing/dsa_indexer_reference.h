// Host reference of the DSA indexer's top-k contract, for the tests of kernels/dsa_indexer and of
// the CUDA backend's IndexerTopK: on one row of n scores, the top_k largest in ascending position
// order, ties to the lower position, then -1 padding. Scores compare as the kernels' radix keys
// do (OrderedKeyHost: -0 == +0, NaN lowest).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace glm::kernels::testing {

// The float's order-preserving unsigned key (the select kernels' radix key).
inline uint32_t OrderedKeyHost(float f) {
  if (std::isnan(f)) return 0u;
  if (f == 0.f) f = 0.f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// s: [n] scores of one row. Returns [top_k] positions.
inline std::vector<int32_t> RefTopK(const float* s, int n, int top_k) {
  std::vector<int32_t> out(top_k, -1);
  if (n <= top_k) {
    std::iota(out.begin(), out.begin() + n, 0);
    return out;
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + (top_k - 1), order.end(),
                   [&](int32_t a, int32_t b) {
                     const uint32_t ka = OrderedKeyHost(s[a]), kb = OrderedKeyHost(s[b]);
                     return ka != kb ? ka > kb : a < b;
                   });
  std::sort(order.begin(), order.begin() + top_k);
  std::copy_n(order.begin(), top_k, out.begin());
  return out;
}

}  // namespace glm::kernels::testing
