// rope_interleaved: grid (row chunks, rows). A CTA takes kRopeItems (head, pair) items per thread
// of one row (the heads of the first set, then those of the optional second); each thread first
// issues the loads of its pairs (one 2-element access per pair when aligned), then the CTA computes
// cos/sin of the row's num_freqs angles into shared memory (fp64 sincos of the fp32 angle, matching
// the CPU reference) while those loads are in flight, then rotates and stores. So a decode row
// (1..16 rows, up to heads * num_freqs pairs) spreads over several CTAs and costs about one memory
// round trip. Limits: num_freqs <= kRopeMaxFreqs (8 KiB of shared memory).
#pragma once

#include <cstdint>

#include "kernels/dtype_util.cuh"
#include "kernels/launch.cuh"

namespace glm::kernels::detail {

inline constexpr int kRopeThreads = 256;
inline constexpr int kRopeItems = 2;

template <typename T>
struct alignas(2 * sizeof(T)) RopePair {
  T a, b;
};

// kPairVec: (2i, 2i+1) is one aligned access (x, row_stride and head_stride even).
// Heads [0, heads) of x, then heads2 more of x2 (0: none), same row stride.
template <typename T, bool kPairVec>
__global__ void __launch_bounds__(kRopeThreads)
    RopeInterleavedKernel(T* x, int64_t heads, int64_t row_stride, int64_t head_stride,
                          const int32_t* positions, const float* inv_freq, int num_freqs, T* x2,
                          int64_t heads2, int64_t head_stride2) {
  PdlEnter();
  __shared__ float s_cos[1024];
  __shared__ float s_sin[1024];
  const int64_t row = blockIdx.y;
  T* xr = x + row * row_stride;
  T* xr2 = x2 + row * row_stride;  // only used when heads2 > 0
  const int64_t pairs1 = heads * num_freqs;
  const int64_t pairs = pairs1 + heads2 * num_freqs;
  const int64_t per_cta = static_cast<int64_t>(kRopeThreads) * kRopeItems;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * per_cta; base < pairs;
       base += static_cast<int64_t>(gridDim.x) * per_cta) {
    float a[kRopeItems], b[kRopeItems];
    T* p[kRopeItems];
    int fi[kRopeItems];
#pragma unroll
    for (int it = 0; it < kRopeItems; ++it) {
      const int64_t j = base + static_cast<int64_t>(it) * kRopeThreads + threadIdx.x;
      p[it] = nullptr;
      fi[it] = 0;
      if (j < pairs) {
        const bool first = j < pairs1;
        const int64_t jj = first ? j : j - pairs1;
        const int64_t h = jj / num_freqs;
        fi[it] = static_cast<int>(jj - h * num_freqs);
        p[it] = (first ? xr + h * head_stride : xr2 + h * head_stride2) + 2 * fi[it];
        if constexpr (kPairVec) {
          const RopePair<T> v = *reinterpret_cast<const RopePair<T>*>(p[it]);
          a[it] = ToFloat(v.a);
          b[it] = ToFloat(v.b);
        } else {
          a[it] = ToFloat(p[it][0]);
          b[it] = ToFloat(p[it][1]);
        }
      }
    }
    if (base == static_cast<int64_t>(blockIdx.x) * per_cta) {  // first chunk of this CTA
      const float pos = static_cast<float>(positions[row]);
      for (int i = threadIdx.x; i < num_freqs; i += blockDim.x) {
        const float angle = pos * inv_freq[i];
        double s, c;
        sincos(static_cast<double>(angle), &s, &c);
        s_cos[i] = static_cast<float>(c);
        s_sin[i] = static_cast<float>(s);
      }
      __syncthreads();
    }
#pragma unroll
    for (int it = 0; it < kRopeItems; ++it) {
      if (p[it] == nullptr) continue;
      const float c = s_cos[fi[it]], s = s_sin[fi[it]];
      const T ra = FromFloat<T>(a[it] * c - b[it] * s);
      const T rb = FromFloat<T>(b[it] * c + a[it] * s);
      if constexpr (kPairVec) {
        *reinterpret_cast<RopePair<T>*>(p[it]) = RopePair<T>{ra, rb};
      } else {
        p[it][0] = ra;
        p[it][1] = rb;
      }
    }
  }
}

}  // namespace glm::kernels::detail
