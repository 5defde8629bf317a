// sample_rows: one CTA of kSampleThreads per row, the rule of kernels/sample_rule.h, no sort.
//
// Algorithm (every step exact; integer weights make all sums order-free and deterministic):
//  1. One pass: the largest key and its lowest id (greedy answer), and an online log-sum-exp for
//     the logprob. Greedy rows stop here.
//  2. Each "find the prefix of the order (key desc, id asc) whose cumulative weight first reaches
//     a target" (top-k with weight 1, top-p and the draw with weight q) is a radix search over the
//     32-bit key: three passes over the row with 11/11/10-bit digits, each building a 2048-bin
//     shared-memory histogram of the weight of the elements that match the digits chosen so far;
//     a block-wide scan over the bins from the top picks the digit where the target is crossed.
//     After three levels the crossing key K is exact; every element with key K has the same
//     weight, so the number j of K-ties inside the prefix is ceil((target - above) / q(K)).
//     Histogram adds are warp-aggregated (one shared atomic per distinct digit per warp).
//  3. A kept set is always "keys > K_min, plus the first t ties at K_min" (top-k, then top-p), so
//     later searches skip keys <= K_min and add t * q(K_min) to K_min's bin by hand.
//  4. The drawn token is the j-th lowest id with key K_d: the last level keeps the minimum id per
//     digit (j == 1, the usual case); else one more pass counts ties in id order.
// Passes over the row: greedy 1; temperature only 4; top-p 7; top-k + top-p 10 (+1 for a draw
// that lands on the j >= 2-th of several equal logits). Limits: vocab < 2^22 (64-bit masses).
// NOTE: one CTA per row: at batch 1 one SM does the work (latency bound; see docs/benchmarks.md).
#pragma once

#include <cstdint>

#include "kernels/sample_rule.h"

namespace glm::kernels::detail {

inline constexpr int kSampleThreads = 1024;
inline constexpr int kSampleWarps = kSampleThreads / 32;
inline constexpr int kSampleBins = 2048;
inline constexpr unsigned kFull = 0xffffffffu;

struct SampleSmem {
  unsigned long long hist[kSampleBins];
  uint32_t min_id[kSampleBins / 2];  // last level (10-bit digits)
  unsigned long long warp_u64[kSampleWarps];
  uint32_t warp_key[kSampleWarps];
  int32_t warp_id[kSampleWarps];
  float warp_m[kSampleWarps];
  float warp_s[kSampleWarps];
  // Broadcast results.
  uint32_t digit;
  unsigned long long above;
  unsigned long long total;
  int32_t found_id;
};

__device__ __forceinline__ unsigned long long WarpSumU64(unsigned long long v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// Exclusive prefix sum over the block's threads (thread order). All threads must call.
__device__ unsigned long long BlockExclusiveScanU64(unsigned long long v, SampleSmem& sm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long incl = v;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned long long o = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += o;
  }
  __syncthreads();  // warp_u64 may still be read by a previous call
  if (lane == 31) sm.warp_u64[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    unsigned long long t = sm.warp_u64[lane];
    for (int off = 1; off < 32; off <<= 1) {
      const unsigned long long o = __shfl_up_sync(kFull, t, off);
      if (lane >= off) t += o;
    }
    sm.warp_u64[lane] = t;  // inclusive over warps
  }
  __syncthreads();
  return incl - v + (warp > 0 ? sm.warp_u64[warp - 1] : 0ull);
}

// The kept set: keys > k_min, plus the first t_min ties at k_min (has_min), else everything.
struct KeptSet {
  bool has_min = false;
  uint32_t k_min = 0;
  unsigned long long t_min = 0;
};

struct SearchResult {
  uint32_t key;
  unsigned long long above;  // weight of kept elements with larger keys
  unsigned long long j;      // 1-based: the prefix ends at the j-th tie of `key`
  uint32_t min_id;           // lowest id with this key (valid when key != k_min)
  unsigned long long target;
};

enum class Target { kFixed, kTopP, kDraw };

// Radix search for the shortest prefix of the kept set whose weight reaches the target.
// by_mass: weight q (else 1). kTopP / kDraw compute the target from the set's total (level 0).
__device__ SearchResult RadixSearch(const float* __restrict__ row, int32_t vocab,
                                    const sample_rule::RowParams& rp, bool by_mass,
                                    const KeptSet& set, Target kind, unsigned long long target,
                                    float top_p, uint64_t seed, int64_t index, SampleSmem& sm) {
  const int lane = threadIdx.x % 32;
  constexpr int kShift[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
  uint32_t prefix = 0;
  int prefix_shift = 32;
  unsigned long long above = 0;
  const unsigned long long min_weight =
      set.has_min ? (by_mass ? sample_rule::Weight(sample_rule::KeyToFloat(set.k_min), rp) : 1ull)
                  : 0ull;
  for (int level = 0; level < 3; ++level) {
    const int shift = kShift[level];
    const uint32_t mask = (1u << kBits[level]) - 1;
    const int nbins = 1 << kBits[level];
    const bool last = level == 2;
    for (int b = threadIdx.x; b < nbins; b += blockDim.x) {
      sm.hist[b] = 0;
      if (last) sm.min_id[b] = 0xffffffffu;
    }
    __syncthreads();
    constexpr int kUnroll = 8;
    for (int32_t base = 0; base < vocab; base += kUnroll * kSampleThreads) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t i = base + u * kSampleThreads + threadIdx.x;
        v[u] = i < vocab ? __ldg(row + i) : __int_as_float(0x7fffffff);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t i = base + u * kSampleThreads + threadIdx.x;
        const uint32_t k = sample_rule::Key(v[u]);
        bool valid = i < vocab && (!set.has_min || k > set.k_min) &&
                     (prefix_shift == 32 || (k >> prefix_shift) == prefix);
        unsigned long long w = 1;
        if (valid && by_mass) {
          w = sample_rule::Weight(v[u], rp);
          valid = w > 0;
        }
        const uint32_t digit = (k >> shift) & mask;
        // Lanes with the same digit add once: weights (<= 2^40) are summed as two 20-bit halves
        // with the warp-reduce unit, the group's lowest lane does the shared atomic.
        const unsigned act = __ballot_sync(kFull, valid);
        if (act == 0) continue;
        if (valid) {
          const unsigned grp = __match_any_sync(act, digit);
          unsigned long long sum;
          if (by_mass) {
            const uint32_t lo = __reduce_add_sync(grp, static_cast<uint32_t>(w & 0xfffffu));
            const uint32_t hi = __reduce_add_sync(grp, static_cast<uint32_t>(w >> 20));
            sum = (static_cast<unsigned long long>(hi) << 20) + lo;
          } else {
            sum = static_cast<unsigned long long>(__popc(grp));
          }
          if (lane == __ffs(grp) - 1) atomicAdd(&sm.hist[digit], sum);
          if (last) {
            const uint32_t mid = __reduce_min_sync(grp, static_cast<uint32_t>(i));
            if (lane == __ffs(grp) - 1) atomicMin(&sm.min_id[digit], mid);
          }
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0 && set.has_min &&
        (prefix_shift == 32 || (set.k_min >> prefix_shift) == prefix)) {
      sm.hist[(set.k_min >> shift) & mask] += set.t_min * min_weight;
    }
    __syncthreads();
    // Thread t owns bins nbins-1-2t and nbins-2-2t (descending key order).
    unsigned long long own[2] = {0, 0};
    for (int s = 0; s < 2; ++s) {
      const int b = nbins - 1 - 2 * static_cast<int>(threadIdx.x) - s;
      if (b >= 0) own[s] = sm.hist[b];
    }
    const unsigned long long excl = BlockExclusiveScanU64(own[0] + own[1], sm);
    if (level == 0 && kind != Target::kFixed) {
      // The last thread's inclusive sum is the kept set's total weight.
      if (threadIdx.x == blockDim.x - 1) sm.total = excl + own[0] + own[1];
      __syncthreads();
      const unsigned long long total = sm.total;
      target = kind == Target::kTopP ? sample_rule::TopPTarget(total, top_p)
                                     : sample_rule::DrawTarget(total, seed, index);
    }
    const unsigned long long start = above + excl;
    if (start < target && target <= start + own[0] + own[1]) {
      const int s = start + own[0] >= target ? 0 : 1;
      sm.digit = static_cast<uint32_t>(nbins - 1 - 2 * static_cast<int>(threadIdx.x) - s);
      sm.above = s == 0 ? start : start + own[0];
    }
    __syncthreads();
    prefix = (prefix << kBits[level]) | sm.digit;
    prefix_shift = shift;
    above = sm.above;
    __syncthreads();
  }
  SearchResult r;
  r.key = prefix;
  r.above = above;
  r.target = target;
  const unsigned long long wk =
      by_mass ? sample_rule::Weight(sample_rule::KeyToFloat(prefix), rp) : 1ull;
  r.j = (target - above + wk - 1) / wk;
  r.min_id = sm.min_id[prefix & 0x3ffu];
  __syncthreads();
  return r;
}

// The id of the j-th (1-based) element with key `key`, in id order.
__device__ int32_t NthTie(const float* __restrict__ row, int32_t vocab, uint32_t key,
                          unsigned long long j, SampleSmem& sm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long before = 0;
  if (threadIdx.x == 0) sm.found_id = -1;
  __syncthreads();
  for (int32_t base = 0; base < vocab; base += kSampleThreads) {
    const int32_t i = base + threadIdx.x;
    const bool match = i < vocab && sample_rule::Key(__ldg(row + i)) == key;
    const int count = __syncthreads_count(match);
    if (before + static_cast<unsigned long long>(count) >= j) {
      const unsigned bal = __ballot_sync(kFull, match);
      if (lane == 0) sm.warp_key[warp] = __popc(bal);
      __syncthreads();
      unsigned long long rank = before + __popc(bal & ((1u << lane) - 1));
      for (int w = 0; w < warp; ++w) rank += sm.warp_key[w];
      if (match && rank + 1 == j) sm.found_id = i;
      __syncthreads();
      break;
    }
    before += static_cast<unsigned long long>(count);
  }
  __syncthreads();
  return sm.found_id;
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const float* __restrict__ logits, int64_t ld, int32_t vocab,
                     const float* __restrict__ temperature, const int32_t* __restrict__ top_k,
                     const float* __restrict__ top_p, const uint64_t* __restrict__ seed,
                     const int64_t* __restrict__ index, int32_t* __restrict__ out_ids,
                     float* __restrict__ out_logprobs) {
  __shared__ SampleSmem sm;
  const int64_t r = blockIdx.x;
  const float* row = logits + r * ld;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool want_logprob = out_logprobs != nullptr;

  // 1. Largest key (lowest id on ties) and online log-sum-exp of the finite logits.
  uint32_t best_key = 0;
  int32_t best_id = 0x7fffffff;
  float m = -INFINITY, s = 0.0f;
  constexpr int kUnroll0 = 8;  // independent loads in flight per thread (latency bound)
  for (int32_t base = 0; base < vocab; base += kUnroll0 * kSampleThreads) {
    float v[kUnroll0];
#pragma unroll
    for (int u = 0; u < kUnroll0; ++u) {
      const int32_t i = base + u * kSampleThreads + threadIdx.x;
      v[u] = i < vocab ? __ldg(row + i) : __int_as_float(0x7fffffff);
    }
#pragma unroll
    for (int u = 0; u < kUnroll0; ++u) {
      const int32_t i = base + u * kSampleThreads + threadIdx.x;
      const float x = v[u];
      const uint32_t k = i < vocab ? sample_rule::Key(x) : 0u;
      if (i < vocab && (k > best_key || (k == best_key && i < best_id))) {
        best_key = k;
        best_id = i;
      }
      if (want_logprob && k > sample_rule::kNegInfKey && x != INFINITY) {
        if (x > m) {
          s = s * __expf(m - x) + 1.0f;
          m = x;
        } else {
          s += __expf(x - m);
        }
      }
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const uint32_t ok = __shfl_xor_sync(kFull, best_key, off);
    const int32_t oi = __shfl_xor_sync(kFull, best_id, off);
    if (ok > best_key || (ok == best_key && oi < best_id)) {
      best_key = ok;
      best_id = oi;
    }
    const float om = __shfl_xor_sync(kFull, m, off);
    const float os = __shfl_xor_sync(kFull, s, off);
    const float nm = fmaxf(m, om);
    s = (m == -INFINITY ? 0.0f : s * __expf(m - nm)) + (om == -INFINITY ? 0.0f : os * __expf(om - nm));
    m = nm;
  }
  if (lane == 0) {
    sm.warp_key[warp] = best_key;
    sm.warp_id[warp] = best_id;
    sm.warp_m[warp] = m;
    sm.warp_s[warp] = s;
  }
  __syncthreads();
  best_key = sm.warp_key[lane];
  best_id = sm.warp_id[lane];
  m = sm.warp_m[lane];
  s = sm.warp_s[lane];
  for (int off = 16; off > 0; off >>= 1) {
    const uint32_t ok = __shfl_xor_sync(kFull, best_key, off);
    const int32_t oi = __shfl_xor_sync(kFull, best_id, off);
    if (ok > best_key || (ok == best_key && oi < best_id)) {
      best_key = ok;
      best_id = oi;
    }
    const float om = __shfl_xor_sync(kFull, m, off);
    const float os = __shfl_xor_sync(kFull, s, off);
    const float nm = fmaxf(m, om);
    s = (m == -INFINITY ? 0.0f : s * __expf(m - nm)) + (om == -INFINITY ? 0.0f : os * __expf(om - nm));
    m = nm;
  }
  __syncthreads();  // everyone has read warp_*

  const float t = temperature[r];
  const int32_t k = top_k[r];
  int32_t token = best_id;
  if (!sample_rule::IsGreedy(t, k) && best_key > sample_rule::kNegInfKey) {
    sample_rule::RowParams rp;
    rp.inv_t = 1.0 / static_cast<double>(t);
    rp.max_logit = static_cast<double>(sample_rule::KeyToFloat(best_key));
    KeptSet set;
    if (k > 0 && k < vocab) {
      const SearchResult sk = RadixSearch(row, vocab, rp, /*by_mass=*/false, set, Target::kFixed,
                                          static_cast<unsigned long long>(k), 1.0f, 0, 0, sm);
      set = {true, sk.key, sk.j};
    }
    const float p = top_p[r];
    SearchResult sd;
    if (p < 1.0f) {
      const SearchResult sp =
          RadixSearch(row, vocab, rp, true, set, Target::kTopP, 0, p, 0, 0, sm);
      const unsigned long long mass =
          sp.above + sp.j * sample_rule::Weight(sample_rule::KeyToFloat(sp.key), rp);
      set = {true, sp.key, sp.j};
      sd = RadixSearch(row, vocab, rp, true, set, Target::kFixed,
                       sample_rule::DrawTarget(mass, seed[r], index[r]), 1.0f, 0, 0, sm);
    } else {
      sd = RadixSearch(row, vocab, rp, true, set, Target::kDraw, 0, 1.0f, seed[r], index[r], sm);
    }
    if (sd.j == 1 && !(set.has_min && sd.key == set.k_min)) {
      token = static_cast<int32_t>(sd.min_id);
    } else {
      token = NthTie(row, vocab, sd.key, sd.j, sm);
    }
  }
  if (threadIdx.x == 0) {
    out_ids[r] = token;
    if (want_logprob) {
      const float x = row[token];
      float lp;
      if (best_key <= sample_rule::kNegInfKey || sample_rule::Key(x) <= sample_rule::kNegInfKey) {
        lp = -INFINITY;
      } else if (sample_rule::KeyToFloat(best_key) == INFINITY) {
        lp = x == INFINITY ? 0.0f : -INFINITY;
      } else {
        lp = static_cast<float>(static_cast<double>(x) - m - log(static_cast<double>(s)));
      }
      out_logprobs[r] = lp;
    }
  }
}

}  // namespace glm::kernels::detail
