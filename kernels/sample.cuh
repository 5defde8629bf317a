// sample_rows: one thread-block cluster of C CTAs (kSampleThreads each) per row, the rule of
// kernels/sample_rule.h, no sort. CTA r of a row's cluster owns the ids
// [r * chunk, (r + 1) * chunk) (chunk = ceil(vocab / C)); per-CTA partial results are combined
// through distributed shared memory (every CTA reads its peers' values in rank order and
// reaches the same answer, so no broadcast is needed and every decision is identical across the
// cluster). C = 1 is the plain one-CTA-per-row kernel (any architecture); C > 1 needs sm_90+
// code (the launcher sizes C from the device, the vocab and the rows: SampleClusterSize).
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
#pragma once

#include <cstdint>

#if defined(__CUDACC__) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#include <cooperative_groups.h>
#define GLM_SAMPLE_CLUSTERS 1
#endif

#include "kernels/launch.cuh"
#include "kernels/sample_rule.h"

namespace glm::kernels::detail {

// The cluster this CTA belongs to (size 1 without a cluster launch or below sm_90).
__device__ __forceinline__ unsigned ClusterRank() {
#if defined(GLM_SAMPLE_CLUSTERS) && defined(__CUDA_ARCH__)
  return cooperative_groups::this_cluster().block_rank();
#else
  return 0;
#endif
}
__device__ __forceinline__ unsigned ClusterSize() {
#if defined(GLM_SAMPLE_CLUSTERS) && defined(__CUDA_ARCH__)
  return cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}
// Every thread of every CTA of the cluster must call it (all CTAs take the same branches).
__device__ __forceinline__ void ClusterSync() {
#if defined(GLM_SAMPLE_CLUSTERS) && defined(__CUDA_ARCH__)
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}
// `p` (this CTA's shared memory) as seen in CTA `rank` of the cluster.
template <typename T>
__device__ __forceinline__ T* PeerSmem(T* p, unsigned rank) {
#if defined(GLM_SAMPLE_CLUSTERS) && defined(__CUDA_ARCH__)
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  (void)rank;
  return p;
#endif
}

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
  // This CTA's partial results, read by its peers.
  uint32_t cta_key;
  int32_t cta_id;
  float cta_m;
  float cta_s;
  unsigned long long cta_count;
  // Broadcast results (within the CTA).
  uint32_t digit;
  unsigned long long above;
  unsigned long long total;
  int32_t found_id;  // NthTie's answer, written into rank 0's copy by the CTA that finds it
};

// The CTA's slice of a row: ids [lo, hi).
struct Slice {
  int32_t lo;
  int32_t hi;
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
// Each CTA histograms its slice; the bins are summed over the cluster's CTAs (rank order) by
// every CTA, which then all scan the same sums and pick the same digit.
__device__ SearchResult RadixSearch(const float* __restrict__ row, Slice slice,
                                    const sample_rule::RowParams& rp, bool by_mass,
                                    const KeptSet& set, Target kind, unsigned long long target,
                                    float top_p, uint64_t seed, int64_t index, SampleSmem& sm) {
  const int lane = threadIdx.x % 32;
  const unsigned csize = ClusterSize();
  constexpr int kShift[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
  uint32_t prefix = 0;
  int prefix_shift = 32;
  unsigned long long above = 0;
  uint32_t min_id = 0xffffffffu;
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
    for (int32_t base = slice.lo; base < slice.hi; base += kUnroll * kSampleThreads) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t i = base + u * kSampleThreads + threadIdx.x;
        v[u] = i < slice.hi ? __ldg(row + i) : __int_as_float(0x7fffffff);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t i = base + u * kSampleThreads + threadIdx.x;
        const uint32_t k = sample_rule::Key(v[u]);
        bool valid = i < slice.hi && (!set.has_min || k > set.k_min) &&
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
    ClusterSync();  // every CTA's histogram is complete
    // Thread t owns bins nbins-1-2t and nbins-2-2t (descending key order), summed over the
    // cluster in rank order; the kept ties at k_min are added by hand (once: after the sum).
    unsigned long long own[2] = {0, 0};
    for (int s = 0; s < 2; ++s) {
      const int b = nbins - 1 - 2 * static_cast<int>(threadIdx.x) - s;
      if (b < 0) continue;
      for (unsigned c = 0; c < csize; ++c) own[s] += PeerSmem(sm.hist, c)[b];
      if (set.has_min && (prefix_shift == 32 || (set.k_min >> prefix_shift) == prefix) &&
          static_cast<uint32_t>(b) == ((set.k_min >> shift) & mask)) {
        own[s] += set.t_min * min_weight;
      }
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
    if (last) {
      for (unsigned c = 0; c < csize; ++c) {
        min_id = min(min_id, PeerSmem(sm.min_id, c)[sm.digit]);
      }
    }
    ClusterSync();  // peers are done reading this CTA's bins (the next level clears them)
  }
  SearchResult r;
  r.key = prefix;
  r.above = above;
  r.target = target;
  const unsigned long long wk =
      by_mass ? sample_rule::Weight(sample_rule::KeyToFloat(prefix), rp) : 1ull;
  r.j = (target - above + wk - 1) / wk;
  r.min_id = min_id;
  return r;
}

// The id of the j-th (1-based) element with key `key` of the row, in id order. Every CTA of the
// cluster calls it; the answer is valid in rank 0.
__device__ int32_t NthTie(const float* __restrict__ row, Slice slice, uint32_t key,
                          unsigned long long j, SampleSmem& sm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned rank = ClusterRank();
  // Matches in this CTA's slice, then the matches of the slices before it.
  unsigned long long mine = 0;
  for (int32_t base = slice.lo; base < slice.hi; base += kSampleThreads) {
    const int32_t i = base + threadIdx.x;
    mine += static_cast<unsigned long long>(
        __syncthreads_count(i < slice.hi && sample_rule::Key(__ldg(row + i)) == key));
  }
  if (threadIdx.x == 0) {
    sm.cta_count = mine;
    sm.found_id = -1;
  }
  ClusterSync();
  unsigned long long before = 0;
  for (unsigned c = 0; c < rank; ++c) before += PeerSmem(&sm.cta_count, c)[0];
  if (before < j && j <= before + mine) {
    for (int32_t base = slice.lo; base < slice.hi; base += kSampleThreads) {
      const int32_t i = base + threadIdx.x;
      const bool match = i < slice.hi && sample_rule::Key(__ldg(row + i)) == key;
      const int count = __syncthreads_count(match);
      if (before + static_cast<unsigned long long>(count) >= j) {
        const unsigned bal = __ballot_sync(kFull, match);
        if (lane == 0) sm.warp_key[warp] = __popc(bal);
        __syncthreads();
        unsigned long long pos = before + __popc(bal & ((1u << lane) - 1));
        for (int w = 0; w < warp; ++w) pos += sm.warp_key[w];
        if (match && pos + 1 == j) PeerSmem(&sm.found_id, 0)[0] = i;
        break;
      }
      before += static_cast<unsigned long long>(count);
    }
  }
  ClusterSync();
  return sm.found_id;  // meaningful in rank 0
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const float* __restrict__ logits, int64_t ld, int32_t vocab,
                     const float* __restrict__ temperature, const int32_t* __restrict__ top_k,
                     const float* __restrict__ top_p, const uint64_t* __restrict__ seed,
                     const int64_t* __restrict__ index, int32_t* __restrict__ out_ids,
                     float* __restrict__ out_logprobs) {
  PdlEnter();
  __shared__ SampleSmem sm;
  const unsigned rank = ClusterRank(), csize = ClusterSize();
  const int64_t r = blockIdx.x / csize;
  const float* row = logits + r * ld;
  const int32_t chunk = static_cast<int32_t>((vocab + csize - 1) / csize);
  const int64_t lo = int64_t{rank} * chunk, hi = lo + chunk;
  const Slice slice{static_cast<int32_t>(lo < vocab ? lo : vocab),
                    static_cast<int32_t>(hi < vocab ? hi : vocab)};
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool want_logprob = out_logprobs != nullptr;

  // 1. Largest key (lowest id on ties) and online log-sum-exp of the finite logits: per CTA over
  //    its slice, then over the cluster in rank order.
  uint32_t best_key = 0;
  int32_t best_id = 0x7fffffff;
  float m = -INFINITY, s = 0.0f;
  constexpr int kUnroll0 = 8;  // independent loads in flight per thread (latency bound)
  for (int32_t base = slice.lo; base < slice.hi; base += kUnroll0 * kSampleThreads) {
    float v[kUnroll0];
#pragma unroll
    for (int u = 0; u < kUnroll0; ++u) {
      const int32_t i = base + u * kSampleThreads + threadIdx.x;
      v[u] = i < slice.hi ? __ldg(row + i) : __int_as_float(0x7fffffff);
    }
#pragma unroll
    for (int u = 0; u < kUnroll0; ++u) {
      const int32_t i = base + u * kSampleThreads + threadIdx.x;
      const float x = v[u];
      const uint32_t k = i < slice.hi ? sample_rule::Key(x) : 0u;
      if (i < slice.hi && (k > best_key || (k == best_key && i < best_id))) {
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
  auto combine = [](uint32_t& bk, int32_t& bi, float& bm, float& bs, uint32_t ok, int32_t oi,
                    float om, float os) {
    if (ok > bk || (ok == bk && oi < bi)) {
      bk = ok;
      bi = oi;
    }
    const float nm = fmaxf(bm, om);
    bs = (bm == -INFINITY ? 0.0f : bs * __expf(bm - nm)) +
         (om == -INFINITY ? 0.0f : os * __expf(om - nm));
    bm = nm;
  };
  for (int off = 16; off > 0; off >>= 1) {
    combine(best_key, best_id, m, s, __shfl_xor_sync(kFull, best_key, off),
            __shfl_xor_sync(kFull, best_id, off), __shfl_xor_sync(kFull, m, off),
            __shfl_xor_sync(kFull, s, off));
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
    combine(best_key, best_id, m, s, __shfl_xor_sync(kFull, best_key, off),
            __shfl_xor_sync(kFull, best_id, off), __shfl_xor_sync(kFull, m, off),
            __shfl_xor_sync(kFull, s, off));
  }
  if (threadIdx.x == 0) {
    sm.cta_key = best_key;
    sm.cta_id = best_id;
    sm.cta_m = m;
    sm.cta_s = s;
  }
  ClusterSync();  // every CTA's partials are in place (and everyone has read warp_*)
  if (csize > 1) {
    best_key = 0;
    best_id = 0x7fffffff;
    m = -INFINITY;
    s = 0.0f;
    for (unsigned c = 0; c < csize; ++c) {
      const SampleSmem* peer = PeerSmem(&sm, c);
      combine(best_key, best_id, m, s, peer->cta_key, peer->cta_id, peer->cta_m, peer->cta_s);
    }
    ClusterSync();  // peers have read this CTA's partials (greedy rows exit next)
  }

  const float t = temperature[r];
  const int32_t k = top_k[r];
  int32_t token = best_id;
  if (!sample_rule::IsGreedy(t, k) && best_key > sample_rule::kNegInfKey) {
    sample_rule::RowParams rp;
    rp.inv_t = 1.0 / static_cast<double>(t);
    rp.max_logit = static_cast<double>(sample_rule::KeyToFloat(best_key));
    KeptSet set;
    if (k > 0 && k < vocab) {
      const SearchResult sk = RadixSearch(row, slice, rp, /*by_mass=*/false, set, Target::kFixed,
                                          static_cast<unsigned long long>(k), 1.0f, 0, 0, sm);
      set = {true, sk.key, sk.j};
    }
    const float p = top_p[r];
    SearchResult sd;
    if (p < 1.0f) {
      const SearchResult sp =
          RadixSearch(row, slice, rp, true, set, Target::kTopP, 0, p, 0, 0, sm);
      const unsigned long long mass =
          sp.above + sp.j * sample_rule::Weight(sample_rule::KeyToFloat(sp.key), rp);
      set = {true, sp.key, sp.j};
      sd = RadixSearch(row, slice, rp, true, set, Target::kFixed,
                       sample_rule::DrawTarget(mass, seed[r], index[r]), 1.0f, 0, 0, sm);
    } else {
      sd = RadixSearch(row, slice, rp, true, set, Target::kDraw, 0, 1.0f, seed[r], index[r], sm);
    }
    if (sd.j == 1 && !(set.has_min && sd.key == set.k_min)) {
      token = static_cast<int32_t>(sd.min_id);
    } else {
      token = NthTie(row, slice, sd.key, sd.j, sm);
    }
  }
  if (rank == 0 && threadIdx.x == 0) {
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
  // No CTA may exit while a peer can still read its shared memory: the last cluster-wide access
  // (the partials above or a search) is followed by a ClusterSync in every path.
}

}  // namespace glm::kernels::detail
