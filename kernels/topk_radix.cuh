// topk_radix: top-k indices of each row of fp32 scores by radix select (device code).
//
// Algorithm: scores become order-preserving uint32 keys (NaN lowest, then -inf ... +inf). Four
// 8-bit passes (bits 31..24, ..., 7..0) each build a 256-bin histogram of the keys that still
// match the prefix chosen so far and pick the bin holding the k-th largest; a pass whose bin
// count equals the remaining k ends early. Emission writes every key above the prefix, then keys
// equal to it ("ties") until k are written. Order of the output is unspecified.
//
// Tiling: a row is split over `ctas_per_group` CTAs of kTopkThreads threads, `chunk` columns each.
// With more than one CTA, the group merges its histograms into a per-row RowState in global
// memory and meets at a spin barrier after each pass (all CTAs co-resident: see topk_plan.h).
// In cached mode each CTA keeps its chunk in shared memory as keys (HBM is read once); in
// streaming mode it re-reads the chunk from global memory on each pass. After pass 0 each CTA
// compacts the keys still in play (column + key) into a candidate buffer when they fit, and the
// later passes and the emission scan only those.
//
// Limits: columns < 2^31; k >= 1; out[row] has k slots, -1 past min(k, len).
// NOTE: histogram adds are aggregated per warp with __match_any_sync (sm_70+), since the top
// byte of real scores falls in a handful of bins and plain shared atomics would serialize.
#pragma once

#include <cstdint>

namespace glm::kernels::topk_detail {

struct RowState {
  unsigned int hist[4][256];  // merged histogram per pass
  unsigned int arrive[4];     // barrier counter per pass
  unsigned int gt_count;      // output cursor for keys above the pivot prefix
  unsigned int tie_count;     // output cursor for ties
  unsigned int pad[2];
};

struct TopkParams {
  const float* scores;     // [rows, row_stride]
  int64_t row_stride;      // elements
  const int32_t* lengths;  // [rows] valid columns per row, or null (all max_len)
  int64_t rows;
  int32_t max_len;
  int32_t k;
  int32_t* out;            // [rows, k]
  RowState* states;        // [rows] when ctas_per_group > 1, zeroed
  int32_t ctas_per_group;
  int64_t num_groups;
  int32_t chunk;
  int32_t candidates;      // candidate buffer entries (0: none)
  bool vec4;               // scores and row_stride allow 16-byte loads
};

__device__ __forceinline__ uint32_t FloatToKey(float f) {
  const uint32_t u = __float_as_uint(f);
  if (f != f) return 0u;  // NaN: below -inf
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned int LoadAcquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// All CTAs of a group arrive at `counter` once; returns when `expected` have. Same pattern as
// cooperative_groups' grid sync: bar.sync, one thread fences + arrives + spins, bar.sync.
__device__ __forceinline__ void GroupBarrier(unsigned int* counter, unsigned int expected) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (LoadAcquire(counter) < expected) __nanosleep(20);
    __threadfence();
  }
  __syncthreads();
}

template <bool kMulti, bool kCache>
__global__ void __launch_bounds__(512, 2) TopkRadixKernel(TopkParams p) {
  constexpr int kThreads = 512;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned int* s_hist = reinterpret_cast<unsigned int*>(smem_raw);  // [256]
  unsigned int* s_scan = s_hist + 256;                                  // [256]
  unsigned int* s_misc = s_scan + 256;                                  // [64]
  uint32_t* s_ckey = reinterpret_cast<uint32_t*>(smem_raw + 2304);      // [candidates]
  int32_t* s_ccol = reinterpret_cast<int32_t*>(s_ckey + p.candidates);  // [candidates]
  uint32_t* s_keys = s_ckey + 2 * p.candidates;                         // [chunk]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int64_t group = blockIdx.x / p.ctas_per_group;
  const int part = blockIdx.x % p.ctas_per_group;
  const int k = p.k;

  for (int64_t row = group; row < p.rows; row += p.num_groups) {
    int32_t len = p.lengths != nullptr ? p.lengths[row] : p.max_len;
    len = len < 0 ? 0 : (len > p.max_len ? p.max_len : len);
    int32_t* out = p.out + row * static_cast<int64_t>(k);
    if (len <= k) {
      if (part == 0) {
        for (int i = tid; i < k; i += kThreads) out[i] = i < len ? i : -1;
      }
      continue;
    }
    const float* src = p.scores + row * p.row_stride;
    const int64_t begin64 = static_cast<int64_t>(part) * p.chunk;
    const int32_t begin = begin64 < len ? static_cast<int32_t>(begin64) : len;
    const int32_t end = begin + p.chunk < len ? begin + p.chunk : len;
    const int32_t n = end - begin;
    RowState* st = kMulti ? p.states + row : nullptr;

    if constexpr (kCache) {
      if (p.vec4) {
        const int32_t n4 = n / 4;
        const float4* src4 = reinterpret_cast<const float4*>(src + begin);
        for (int32_t i = tid; i < n4; i += kThreads) {
          const float4 v = __ldg(src4 + i);
          s_keys[4 * i + 0] = FloatToKey(v.x);
          s_keys[4 * i + 1] = FloatToKey(v.y);
          s_keys[4 * i + 2] = FloatToKey(v.z);
          s_keys[4 * i + 3] = FloatToKey(v.w);
        }
        for (int32_t i = 4 * n4 + tid; i < n; i += kThreads) s_keys[i] = FloatToKey(src[begin + i]);
      } else {
        for (int32_t i = tid; i < n; i += kThreads) s_keys[i] = FloatToKey(src[begin + i]);
      }
    }
    auto key_at = [&](int32_t i) -> uint32_t {
      if constexpr (kCache) {
        return s_keys[i];
      } else {
        return FloatToKey(src[begin + i]);
      }
    };

    // After pass 0, `use_cand` switches the scans below from the chunk to the candidates.
    bool use_cand = false;
    int32_t n_scan = n;
    auto scan_key = [&](int32_t j) -> uint32_t { return use_cand ? s_ckey[j] : key_at(j); };
    auto scan_col = [&](int32_t j) -> int32_t { return use_cand ? s_ccol[j] : j; };

    uint32_t prefix = 0, mask = 0;
    int32_t k_rem = k;
    for (int pass = 0; pass < 4; ++pass) {
      const int shift = 24 - 8 * pass;
      if (pass == 1 && p.candidates > 0) {
        // Compact the keys still in play (above or inside the chosen top-byte bin).
        if (tid == 0) s_misc[8] = 0;
        __syncthreads();
        for (int32_t base = 0; base < n; base += kThreads) {
          const int32_t i = base + tid;
          uint32_t key = 0;
          bool keep = false;
          if (i < n) {
            key = key_at(i);
            keep = (key & mask) >= prefix;
          }
          const unsigned bk = __ballot_sync(0xffffffffu, keep);
          if (bk == 0) continue;
          unsigned int wbase = 0;
          if (lane == 0) wbase = atomicAdd(&s_misc[8], __popc(bk));
          wbase = __shfl_sync(0xffffffffu, wbase, 0);
          const unsigned int pos = wbase + __popc(bk & ((1u << lane) - 1u));
          if (keep && pos < static_cast<unsigned int>(p.candidates)) {
            s_ckey[pos] = key;
            s_ccol[pos] = i;
          }
        }
        __syncthreads();
        if (s_misc[8] <= static_cast<unsigned int>(p.candidates)) {
          use_cand = true;
          n_scan = static_cast<int32_t>(s_misc[8]);
        }
      }
      if (tid < 256) s_hist[tid] = 0;
      __syncthreads();
      for (int32_t base = 0; base < n_scan; base += kThreads) {
        const int32_t i = base + tid;
        uint32_t bin = 256;
        if (i < n_scan) {
          const uint32_t key = scan_key(i);
          if ((key & mask) == prefix) bin = (key >> shift) & 255u;
        }
        // Past pass 0 few keys still match the prefix: skip the (costly) match when none does.
        if (pass > 0 && !__any_sync(0xffffffffu, bin < 256)) continue;
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&s_hist[bin], __popc(peers));
      }
      __syncthreads();
      if constexpr (kMulti) {
        if (tid < 256 && s_hist[tid] != 0) atomicAdd(&st->hist[pass][tid], s_hist[tid]);
        GroupBarrier(&st->arrive[pass], static_cast<unsigned int>(p.ctas_per_group));
        if (tid < 256) s_hist[tid] = __ldcg(&st->hist[pass][tid]);
        __syncthreads();
      }
      // Suffix sums: s_scan[b] = sum of hist[j] for j >= b (Hillis-Steele over 256 bins).
      if (tid < 256) s_scan[tid] = s_hist[tid];
      __syncthreads();
      for (int off = 1; off < 256; off <<= 1) {
        unsigned int v = 0;
        if (tid < 256 && tid + off < 256) v = s_scan[tid + off];
        __syncthreads();
        if (tid < 256) s_scan[tid] += v;
        __syncthreads();
      }
      if (tid < 256) {
        const unsigned int above = tid == 255 ? 0u : s_scan[tid + 1];
        if (above < static_cast<unsigned int>(k_rem) && s_scan[tid] >= static_cast<unsigned int>(k_rem)) {
          s_misc[0] = tid;
          s_misc[1] = above;
          s_misc[2] = s_hist[tid];
        }
      }
      __syncthreads();
      const uint32_t b = s_misc[0];
      k_rem -= static_cast<int32_t>(s_misc[1]);
      const bool whole_bin = s_misc[2] == static_cast<unsigned int>(k_rem);
      prefix |= b << shift;
      mask |= 255u << shift;
      __syncthreads();  // s_misc is rewritten by the next pass
      if (whole_bin) break;
    }

    // Emission. Keys above the prefix go to [0, k - k_rem), ties to [k - k_rem, k).
    if (tid == 0) { s_misc[4] = 0; s_misc[5] = 0; }
    __syncthreads();
    for (int32_t base = 0; base < n_scan; base += kThreads) {
      const int32_t i = base + tid;
      bool gt = false, tie = false;
      if (i < n_scan) {
        const uint32_t km = scan_key(i) & mask;
        gt = km > prefix;
        tie = km == prefix;
      }
      const unsigned bg = __ballot_sync(0xffffffffu, gt);
      const unsigned bt = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) {
        if (bg) atomicAdd(&s_misc[4], __popc(bg));
        if (bt) atomicAdd(&s_misc[5], __popc(bt));
      }
    }
    __syncthreads();
    if (tid == 0) {
      if constexpr (kMulti) {
        s_misc[6] = s_misc[4] ? atomicAdd(&st->gt_count, s_misc[4]) : 0u;
        s_misc[7] = s_misc[5] ? atomicAdd(&st->tie_count, s_misc[5]) : 0u;
      } else {
        s_misc[6] = 0;
        s_misc[7] = 0;
      }
      s_misc[4] = 0;
      s_misc[5] = 0;
    }
    __syncthreads();
    const unsigned int gt_base = s_misc[6];
    const unsigned int tie_base = s_misc[7];
    const unsigned int gt_total = static_cast<unsigned int>(k - k_rem);
    if (tie_base < static_cast<unsigned int>(k_rem) || gt_base < gt_total) {
      for (int32_t base = 0; base < n_scan; base += kThreads) {
        const int32_t i = base + tid;
        bool gt = false, tie = false;
        if (i < n_scan) {
          const uint32_t km = scan_key(i) & mask;
          gt = km > prefix;
          tie = km == prefix;
        }
        const unsigned bg = __ballot_sync(0xffffffffu, gt);
        const unsigned bt = __ballot_sync(0xffffffffu, tie);
        unsigned int wg = 0, wt = 0;
        if (lane == 0) {
          if (bg) wg = atomicAdd(&s_misc[4], __popc(bg));
          if (bt) wt = atomicAdd(&s_misc[5], __popc(bt));
        }
        wg = __shfl_sync(0xffffffffu, wg, 0);
        wt = __shfl_sync(0xffffffffu, wt, 0);
        const unsigned below = (1u << lane) - 1u;
        if (gt) {
          const unsigned int pos = gt_base + wg + __popc(bg & below);
          out[pos] = begin + scan_col(i);
        } else if (tie) {
          const unsigned int t = tie_base + wt + __popc(bt & below);
          if (t < static_cast<unsigned int>(k_rem)) out[gt_total + t] = begin + scan_col(i);
        }
      }
    }
    __syncthreads();  // shared memory is reused by the next row
  }
}

}  // namespace glm::kernels::topk_detail
