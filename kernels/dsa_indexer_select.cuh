// DSA indexer top-k select (dsa_indexer.h has the contract): exact radix select on the
// order-preserving uint32 image of the scores (OrderedKey), 8 bits per pass, then an ordered
// output of every position above the k-th largest value T plus the lowest-position ties, in
// ascending position order: exactly the CPU backend's output. Three paths, one per shape range
// (the launcher chooses; all give the same output bit for bit):
//
// Short rows (IndexerSelectShortKernel; a row of at most 16K keys that fits shared memory): one
//   1024-thread CTA per row loads the row once into shared memory as OrderedKey words (building
//   the pass-0 histogram itself: the score kernel keeps none, no memset), runs every radix pass
//   there (thread j owns a contiguous segment; two barriers per pass, warp 0 picks the digit)
//   and writes the output after one block scan. Its passes cost ~1 us per key a thread owns, so
//   longer rows take the paths below.
// Few long rows (rows < SMs, > 16K keys): IndexerHistKernel builds the histograms of passes 1..3
//   (one launch each) over chunks of the row spread on the whole GPU (each CTA re-derives the
//   earlier passes' prefix from their complete histograms; integer atomics: deterministic), then
//   IndexerOutputKernel writes the output over the whole GPU (chunks of 1024 positions, a
//   decoupled look-back for the counts of the chunks before).
// Otherwise (IndexerSelectKernel): one 1024-thread CTA per row; pass 0 from the score kernel's
//   histogram, up to 3 more passes over the row from global memory (16 scores per thread per step,
//   float4 loads; warps with no key matching the prefix skip the histogram update; stops once the
//   chosen bin is taken whole), then the ordered output with a block scan per tile.
// Rows with num_keys <= top_k get 0..num_keys-1 then -1. -0.0 ranks equal to +0.0; NaN ranks below
// -inf. num_keys up to 2^31 - 1 (short rows: < 2^16, 16-bit counts in its output scan).
#pragma once

#include <cstdint>

#include "kernels/dsa_indexer_common.cuh"
#include "kernels/launch.cuh"

namespace glm::kernels::dsa_indexer {

inline constexpr int kSelectThreads = 1024;
inline constexpr int kItems = 16;  // scores per thread per step of the select kernel
inline constexpr int kHistThreads = 256;
inline constexpr int kHistPasses = 4;  // radix passes (8 bits each) with a histogram in scratch
inline constexpr int kHistChunkAlign = 512;  // keys per IndexerHistKernel CTA: a multiple of this
inline constexpr int kOutThreads = 256;  // IndexerOutputKernel: the multi-CTA ordered output
inline constexpr int kOutItems = 4;      // consecutive positions per thread (a multiple of 4)
inline constexpr int kOutChunk = kOutThreads * kOutItems;  // positions per output CTA

// Exclusive scan of `v` over the block; *total gets the block sum. `warp_sums` holds 32 values.
__device__ __forceinline__ uint32_t BlockExclusiveScan(uint32_t v, uint32_t* warp_sums,
                                                       uint32_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t incl = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x / 32;
    uint32_t ws = lane < nw ? warp_sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const uint32_t n = __shfl_up_sync(0xffffffffu, ws, o);
      if (lane >= o) ws += n;
    }
    if (lane < nw) warp_sums[lane] = ws;  // inclusive warp prefix
  }
  __syncthreads();
  const uint32_t warp_base = warp > 0 ? warp_sums[warp - 1] : 0u;
  *total = warp_sums[blockDim.x / 32 - 1];
  __syncthreads();  // warp_sums reusable
  return warp_base + incl - v;
}

// Loads the 16 scores [i0, i0 + 16) of a row of length n (i0 a multiple of 4, row 16-byte
// aligned); positions past n read as NaN (key 0, never counted: callers check i < n).
__device__ __forceinline__ void Load16(const float* s, int i0, int n, float (&v)[kItems]) {
#pragma unroll
  for (int j4 = 0; j4 < kItems / 4; ++j4) {
    const int i = i0 + 4 * j4;
    if (i + 3 < n) {
      const float4 x = *reinterpret_cast<const float4*>(s + i);
      v[4 * j4] = x.x, v[4 * j4 + 1] = x.y, v[4 * j4 + 2] = x.z, v[4 * j4 + 3] = x.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[4 * j4 + j] = i + j < n ? s[i + j] : __int_as_float(0x7fffffff);
    }
  }
}

// Given the histogram of the current digit (hist[d], d < 256, of the keys matching the prefix),
// picks the digit holding the `remaining`-th largest: *digit, the new remaining, and whether that
// bin holds exactly `remaining` keys (then the selection is complete). All threads call.
__device__ __forceinline__ void PickDigit(const uint32_t* hist, uint32_t remaining,
                                          uint32_t* warp_sums, uint32_t* sel) {
  const int tid = threadIdx.x;
  const uint32_t c = tid < 256 ? hist[255 - tid] : 0u;
  uint32_t total;
  const uint32_t before = BlockExclusiveScan(c, warp_sums, &total);
  if (tid < 256 && before < remaining && remaining <= before + c) {
    sel[0] = 255u - tid;
    sel[1] = remaining - before;
    sel[2] = c == remaining - before ? 1u : 0u;
  }
  __syncthreads();
}

// grid: rows; block kSelectThreads. row_hist: [rows, 256]: the histogram of the top radix byte
// (the score kernel's, or IndexerHistKernel's pass 0). Rows with num_keys <= top_k get
// 0..num_keys-1 then -1 (scores and row_hist are not read: null when no row has more).
__global__ void __launch_bounds__(kSelectThreads)
    IndexerSelectKernel(const float* scores, int64_t ld, const uint32_t* row_hist,
                        const int32_t* row_num_keys, int top_k, int32_t* out) {
  PdlEnter();
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];  // digit, remaining, bin complete
  const int64_t t = blockIdx.x;
  const int n = row_num_keys[t];
  const int tid = threadIdx.x, lane = tid & 31;
  int32_t* o = out + t * top_k;
  if (n <= top_k) {
    for (int i = tid; i < top_k; i += kSelectThreads) o[i] = i < n ? i : -1;
    return;
  }
  const float* s = scores + t * ld;

  // Radix select: pass 0 from the score kernel's histogram, then passes over the row that
  // count only keys matching the prefix (warps with no match skip the histogram update).
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(top_k);
  for (int shift = 24, pass = 0; shift >= 0; shift -= 8, ++pass) {
    if (pass == 0) {
      if (tid < 256) hist[tid] = row_hist[t * 256 + tid];
    } else {
      if (tid < 256) hist[tid] = 0;
      __syncthreads();
      for (int base = 0; base < n; base += kSelectThreads * kItems) {
        float v[kItems];
        const int i0 = base + tid * kItems;
        Load16(s, i0, n, v);
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          const uint32_t u = OrderedKey(v[j]);
          const uint32_t digit =
              i0 + j < n && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
          if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, hist);
        }
      }
    }
    __syncthreads();
    PickDigit(hist, remaining, warp_sums, sel);
    prefix |= sel[0] << shift;
    mask |= 255u << shift;
    remaining = sel[1];
    const bool complete = sel[2] != 0;
    __syncthreads();  // sel and hist read by all before they are rewritten
    if (complete) break;  // every key of the chosen bin is taken: no need to refine it
  }

  // Every key whose masked value is above the prefix, plus the first `remaining` equal to it,
  // in ascending position order (block scan over tiles of kSelectThreads * kItems positions).
  const uint32_t need = remaining;
  const uint32_t num_gt = static_cast<uint32_t>(top_k) - need;
  uint32_t base_gt = 0, base_eq = 0;
  for (int base = 0; base < n; base += kSelectThreads * kItems) {
    float v[kItems];
    const int i0 = base + tid * kItems;
    Load16(s, i0, n, v);
    uint32_t gt_flags = 0, eq_flags = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const uint32_t u = OrderedKey(v[j]) & mask;
      if (i0 + j < n) {
        gt_flags |= (u > prefix ? 1u : 0u) << j;
        eq_flags |= (u == prefix ? 1u : 0u) << j;
      }
    }
    const uint32_t packed = (static_cast<uint32_t>(__popc(gt_flags)) << 16) | __popc(eq_flags);
    uint32_t total;
    const uint32_t excl = BlockExclusiveScan(packed, warp_sums, &total);
    uint32_t gt_before = base_gt + (excl >> 16), eq_before = base_eq + (excl & 0xffffu);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if ((gt_flags >> j) & 1u) {
        o[gt_before + min(eq_before, need)] = i0 + j;
        ++gt_before;
      } else if ((eq_flags >> j) & 1u) {
        if (eq_before < need) o[gt_before + eq_before] = i0 + j;
        ++eq_before;
      }
    }
    base_gt += total >> 16;
    base_eq += total & 0xffffu;
    if (base_gt == num_gt && base_eq >= need) break;  // uniform: block totals
  }
}

// ---- Short-row select: the whole row in shared memory ----------------------------------------

// Shared-memory word of row position i: one pad word after every 32, so that the per-thread
// segments below (thread j reads positions j * seg ...) hit distinct banks for power-of-2 seg.
__device__ __forceinline__ int PadIdx(int i) { return i + (i >> 5); }

// Warp 0 only: picks from hist[256] the digit holding the `remaining`-th largest key (lane l
// sums bins 255 - 8l .. 248 - 8l, one warp scan, then the lane that holds it walks its 8 bins).
// Writes sel = {digit, new remaining, bin taken whole}. No block barrier.
__device__ __forceinline__ void PickDigitWarp(const uint32_t* hist, uint32_t remaining,
                                              uint32_t* sel) {
  const int lane = threadIdx.x & 31;
  uint32_t c[8], sum = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    c[k] = hist[255 - 8 * lane - k];
    sum += c[k];
  }
  uint32_t incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  uint32_t before = incl - sum;
  if (before < remaining && remaining <= incl) {  // exactly one lane: the total is >= remaining
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (before < remaining && remaining <= before + c[k]) {
        sel[0] = 255u - 8u * lane - k;
        sel[1] = remaining - before;
        sel[2] = c[k] == remaining - before ? 1u : 0u;
      }
      before += c[k];
    }
  }
}

// grid: rows; block kSelectThreads (the code takes any multiple of 32 in [256, 1024]); dynamic smem
// ShortSmemBytes(max num_keys), num_keys < 2^16. Loads the row once (float4, coalesced) as
// OrderedKey words into shared memory, building the pass-0 histogram on the way (no histogram
// from the score kernel, no memset). Then every radix pass and the ordered output read shared
// memory only: thread j owns positions [j * seg, (j + 1) * seg); per pass one barrier after the
// counting (warp-aggregated shared atomics into one of two alternating histograms) and one after
// warp 0 picks the digit (the other warps clear the next histogram meanwhile); stops when the
// chosen bin is taken whole. The output is one block scan of packed (greater, equal) counts per
// thread. Same output as IndexerSelectKernel, bit for bit.
__global__ void __launch_bounds__(1024)
    IndexerSelectShortKernel(const float* scores, int64_t ld, const int32_t* row_num_keys,
                             int top_k, int32_t* out) {
  PdlEnter();
  extern __shared__ uint32_t row_s[];  // [PadIdx(n)]
  __shared__ uint32_t hist[2][256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];  // digit, remaining, bin complete
  const int64_t t = blockIdx.x;
  const int n = row_num_keys[t];
  const int nt = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int32_t* o = out + t * top_k;
  if (n <= top_k) {
    for (int i = tid; i < top_k; i += nt) o[i] = i < n ? i : -1;
    return;
  }
  const float* s = scores + t * ld;
  for (int i = tid; i < 256; i += nt) hist[0][i] = 0;
  __syncthreads();
  // i0 < n <= ld and ld, i0 multiples of 4: the float4 stays inside the row's scratch.
  for (int base = 0; base < n; base += 4 * nt) {  // uniform trip count: full-warp shuffles
    const int i0 = base + 4 * tid;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i0 < n) x = *reinterpret_cast<const float4*>(s + i0);
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = i0 + j < n;
      const uint32_t u = OrderedKey(v[j]);
      if (ok) row_s[PadIdx(i0 + j)] = u;
      const uint32_t digit = ok ? u >> 24 : 256u;
      if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, hist[0]);
    }
  }
  __syncthreads();

  const int seg = (n + nt - 1) / nt;
  const int lo = tid * seg;  // may be >= n: then the thread owns nothing
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(top_k);
  for (int pass = 0, shift = 24;; ++pass, shift -= 8) {
    uint32_t* h = hist[pass & 1];
    if (pass > 0) {
      for (int j = 0; j < seg; ++j) {  // uniform trip count
        const int i = lo + j;
        const uint32_t u = i < n ? row_s[PadIdx(i)] : 0u;
        const uint32_t digit = i < n && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
        if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, h);
      }
      __syncthreads();
    }
    // hist[(pass + 1) & 1] was last read by the pick of pass - 1, before the last barrier.
    if (warp == 0) {
      PickDigitWarp(h, remaining, sel);
    } else {
      for (int i = tid - 32; i < 256; i += nt - 32) hist[(pass + 1) & 1][i] = 0;
    }
    __syncthreads();
    prefix |= sel[0] << shift;
    mask |= 255u << shift;
    remaining = sel[1];
    // sel is rewritten only after the next pass's counting barrier: every thread has read it.
    if (sel[2] != 0 || shift == 0) break;  // uniform
  }

  // Every key whose masked value is above the prefix, plus the first `need` equal to it, in
  // ascending position order: one block scan of (greater, equal) counts (n < 2^16: 16 bits each).
  const uint32_t need = remaining;
  uint32_t gt = 0, eq = 0;
  for (int j = 0; j < seg; ++j) {
    const int i = lo + j;
    if (i < n) {
      const uint32_t u = row_s[PadIdx(i)] & mask;
      gt += u > prefix ? 1u : 0u;
      eq += u == prefix ? 1u : 0u;
    }
  }
  uint32_t total;
  const uint32_t excl = BlockExclusiveScan((gt << 16) | eq, warp_sums, &total);
  uint32_t gt_before = excl >> 16, eq_before = excl & 0xffffu;
  if (gt == 0 && (eq == 0 || eq_before >= need)) return;
  for (int j = 0; j < seg; ++j) {
    const int i = lo + j;
    if (i >= n) break;
    const uint32_t u = row_s[PadIdx(i)] & mask;
    if (u > prefix) {
      o[gt_before + min(eq_before, need)] = i;
      ++gt_before;
    } else if (u == prefix) {
      if (eq_before < need) o[gt_before + eq_before] = i;
      ++eq_before;
    }
  }
}

// The radix select's prefix after the first `passes` 8-bit passes, from their complete
// histograms rh[pass][256] (the select kernel's derivation, PickDigit pass by pass): *prefix,
// *mask (the resolved bits) and *remaining (how many keys equal to the prefix are taken; in:
// top_k). Returns whether a pass took its bin whole (the selection is complete: it stops there).
// Every thread of a 256-thread CTA calls; h_s [256], warp_sums [32] and sel [3] are its scratch.
__device__ __forceinline__ bool PrefixFromHistograms(const uint32_t* rh, int passes, uint32_t* h_s,
                                                     uint32_t* warp_sums, uint32_t* sel,
                                                     uint32_t* prefix, uint32_t* mask,
                                                     uint32_t* remaining) {
  const int tid = threadIdx.x;
  uint32_t bins[kHistPasses];  // bin tid of every pass, loaded together (one L2 round trip)
#pragma unroll
  for (int q = 0; q < kHistPasses; ++q) bins[q] = q < passes ? rh[q * 256 + tid] : 0u;
#pragma unroll
  for (int q = 0; q < kHistPasses; ++q) {
    if (q >= passes) break;  // uniform
    const int sh = 24 - 8 * q;
    h_s[tid] = bins[q];
    __syncthreads();
    PickDigit(h_s, *remaining, warp_sums, sel);
    *prefix |= sel[0] << sh;
    *mask |= 255u << sh;
    *remaining = sel[1];
    const bool complete = sel[2] != 0;
    __syncthreads();            // sel and h_s read by all before they are rewritten
    if (complete) return true;  // uniform
  }
  return false;
}

// Radix pass `pass` (1..3, digit bits 24 - 8 pass ..) of the rows' selection, histogram built
// by many CTAs (pass 0 too, for DsaIndexerSelect on given scores). grid: rows * chunks; block
// kHistThreads.
// hist: [rows, row_passes, 256], passes before `pass` complete. Adds the counts of chunk c's
// keys (positions [c * chunk_len, ...)) that match the earlier passes' prefix into hist[t, pass];
// nothing once a pass before took its bin whole (then the select kernel stops there too).
__global__ void __launch_bounds__(kHistThreads)
    IndexerHistKernel(const float* scores, int64_t ld, uint32_t* hist,
                      const int32_t* row_num_keys, int top_k, int pass, int row_passes,
                      int chunks, int chunk_len) {
  PdlEnter();
  __shared__ uint32_t h_s[256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];
  const int64_t t = blockIdx.x / chunks;
  const int chunk = static_cast<int>(blockIdx.x % chunks);
  const int n = row_num_keys[t];
  const int64_t begin64 = int64_t{chunk} * chunk_len;
  if (n <= top_k || begin64 >= n) return;  // uniform over the CTA
  const int begin = static_cast<int>(begin64);
  const int end = static_cast<int>(min(int64_t{n}, begin64 + chunk_len));
  const int tid = threadIdx.x, lane = tid & 31;
  uint32_t* rh = hist + t * row_passes * 256;
  const float* s = scores + t * ld;
  // begin is a multiple of 4 and i0 < end <= ld (a multiple of 4): the float4 stays in the row.
  // The first step's scores are loaded before the prefix is derived (the two latencies overlap).
  float4 first = make_float4(0.f, 0.f, 0.f, 0.f);
  if (begin + 4 * tid < end) first = *reinterpret_cast<const float4*>(s + begin + 4 * tid);
  // The prefix of passes 0 .. pass - 1, as the select kernel derives it.
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(top_k);
  if (PrefixFromHistograms(rh, pass, h_s, warp_sums, sel, &prefix, &mask, &remaining)) return;
  h_s[tid] = 0;
  __syncthreads();
  const int shift = 24 - 8 * pass;
  for (int base = begin; base < end; base += 4 * kHistThreads) {
    const int i0 = base + 4 * tid;
    float4 x = first;
    if (base != begin) {
      x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i0 < end) x = *reinterpret_cast<const float4*>(s + i0);
    }
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t u = OrderedKey(v[j]);
      const uint32_t digit = i0 + j < end && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
      if (__any_sync(0xffffffffu, digit < 256)) WarpHistAdd(digit, lane, h_s);
    }
  }
  __syncthreads();
  if (h_s[tid] != 0) atomicAdd(&rh[pass * 256 + tid], h_s[tid]);
}

// ---- Parallel ordered output of the multi-CTA passes ------------------------------------------

// Look-back word of an output chunk (IndexerOutputKernel), zero before the launch: bits 63..62
// the status (0 not yet, 1 the chunk's own counts, 2 the inclusive prefix of the row's chunks up
// to it), bits 61..31 the keys above the prefix, bits 30..0 the keys equal to it.
inline constexpr uint64_t kLbOwn = uint64_t{1} << 62, kLbInclusive = uint64_t{2} << 62;

__device__ __forceinline__ uint64_t LbWord(uint64_t status, uint32_t gt, uint32_t eq) {
  return status | (uint64_t{gt} << 31) | eq;
}

// grid: rows * chunks (chunk c of row t: positions [c * kOutChunk, (c + 1) * kOutChunk)); block
// kOutThreads; lookback: [rows * chunks] zero on entry. The ordered output pass of
// IndexerSelectKernel spread over the GPU: every CTA derives the row's final prefix from the 4
// complete histograms (PrefixFromHistograms), counts its keys above and equal to it (thread j:
// kOutItems consecutive positions, one block scan), publishes the counts, learns the counts of
// the row's chunks before it by a decoupled look-back (warp 0 reads 32 predecessors at a time and
// stops at the nearest inclusive prefix; a predecessor that has not published yet has a lower
// block index, so it is already running, and nothing it waits on waits on this CTA), then writes
// its keys at the positions IndexerSelectKernel would: the same output, bit for bit.
__global__ void __launch_bounds__(kOutThreads)
    IndexerOutputKernel(const float* scores, int64_t ld, const uint32_t* row_hist,
                        const int32_t* row_num_keys, int top_k, int chunks,
                        unsigned long long* lookback, int32_t* out) {
  static_assert(kOutThreads == 256, "PrefixFromHistograms: one thread per bin");
  PdlEnter();
  __shared__ uint32_t h_s[256];
  __shared__ uint32_t warp_sums[32];
  __shared__ uint32_t sel[3];
  __shared__ uint32_t before_s[2];  // keys above / equal to the prefix in the chunks before
  const int64_t t = blockIdx.x / chunks;
  const int c = static_cast<int>(blockIdx.x % chunks);
  const int n = row_num_keys[t];
  const int tid = threadIdx.x, lane = tid & 31;
  int32_t* o = out + t * top_k;
  if (n <= top_k) {  // uniform; nothing of this row looks back
    if (c == 0) {
      for (int i = tid; i < top_k; i += kOutThreads) o[i] = i < n ? i : -1;
    }
    return;
  }
  // This thread's positions, loaded before the prefix is derived (the two latencies overlap);
  // past n: neither above nor equal. i0 and ld are multiples of 4 and i0 + 3 < n <= ld keeps the
  // float4 inside the row.
  const float* s = scores + t * ld;
  const int64_t i0 = int64_t{c} * kOutChunk + kOutItems * tid;
  float v[kOutItems];
#pragma unroll
  for (int j4 = 0; j4 < kOutItems; j4 += 4) {
    const int64_t i = i0 + j4;
    if (i + 3 < n) {
      const float4 x = *reinterpret_cast<const float4*>(s + i);
      v[j4] = x.x, v[j4 + 1] = x.y, v[j4 + 2] = x.z, v[j4 + 3] = x.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j4 + j] = i + j < n ? s[i + j] : 0.f;
    }
  }
  uint32_t prefix = 0, mask = 0, need = static_cast<uint32_t>(top_k);
  PrefixFromHistograms(row_hist + t * kHistPasses * 256, kHistPasses, h_s, warp_sums, sel, &prefix,
                       &mask, &need);
  uint32_t gt_flags = 0, eq_flags = 0;
#pragma unroll
  for (int j = 0; j < kOutItems; ++j) {
    if (i0 + j < n) {
      const uint32_t u = OrderedKey(v[j]) & mask;
      gt_flags |= (u > prefix ? 1u : 0u) << j;
      eq_flags |= (u == prefix ? 1u : 0u) << j;
    }
  }
  uint32_t total;
  const uint32_t excl = BlockExclusiveScan(
      (static_cast<uint32_t>(__popc(gt_flags)) << 16) | __popc(eq_flags), warp_sums, &total);
  const uint32_t own_gt = total >> 16, own_eq = total & 0xffffu;

  unsigned long long* row_lb = lookback + t * chunks;
  if (tid < 32) {
    uint32_t gt_before = 0, eq_before = 0;
    if (c == 0) {
      if (lane == 0) atomicExch(&row_lb[0], LbWord(kLbInclusive, own_gt, own_eq));
    } else {
      if (lane == 0) atomicExch(&row_lb[c], LbWord(kLbOwn, own_gt, own_eq));
      for (int top = c - 1;; top -= 32) {  // warp-uniform
        const int idx = top - lane;        // lane 0: the nearest predecessor
        uint64_t w = kLbInclusive;         // before chunk 0: an empty inclusive prefix
        if (idx >= 0) {
          const volatile unsigned long long* p = row_lb + idx;
          do {
            w = *p;
          } while ((w >> 62) == 0);
        }
        const uint32_t inclusive = __ballot_sync(0xffffffffu, (w >> 62) == 2);
        const int stop = inclusive != 0 ? __ffs(inclusive) - 1 : 31;
        uint32_t g = lane <= stop ? static_cast<uint32_t>(w >> 31) & 0x7fffffffu : 0u;
        uint32_t e = lane <= stop ? static_cast<uint32_t>(w) & 0x7fffffffu : 0u;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          g += __shfl_xor_sync(0xffffffffu, g, off);
          e += __shfl_xor_sync(0xffffffffu, e, off);
        }
        gt_before += g;
        eq_before += e;
        if (inclusive != 0) break;
      }
      if (lane == 0) {
        atomicExch(&row_lb[c], LbWord(kLbInclusive, gt_before + own_gt, eq_before + own_eq));
      }
    }
    if (lane == 0) before_s[0] = gt_before, before_s[1] = eq_before;
  }
  __syncthreads();
  uint32_t gt_before = before_s[0] + (excl >> 16), eq_before = before_s[1] + (excl & 0xffffu);
#pragma unroll
  for (int j = 0; j < kOutItems; ++j) {
    if ((gt_flags >> j) & 1u) {
      o[gt_before + min(eq_before, need)] = static_cast<int32_t>(i0 + j);
      ++gt_before;
    } else if ((eq_flags >> j) & 1u) {
      if (eq_before < need) o[gt_before + eq_before] = static_cast<int32_t>(i0 + j);
      ++eq_before;
    }
  }
}

// Short-row select sizing: dynamic shared memory for a row of n keys (PadIdx layout), its static
// shared memory, and the longest row it takes (16-bit counts in the output scan).
inline int64_t ShortSmemBytes(int64_t n) { return 4 * (n + n / 32 + 1); }
inline constexpr int64_t kShortStaticSmem = 4 * (2 * 256 + 32 + 3);
inline constexpr int64_t kShortMaxKeys = 65535;

}  // namespace glm::kernels::dsa_indexer
