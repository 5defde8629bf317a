// Decode kernels of the routed experts (kernels/moe_decode.h): tokens * top_k <= 64 pairs with
// 16-byte weight rows; MoeDecodeKernel<gate|up> then MoeDecodeKernel<down>, then the pair-indexed
// combine (moe.cuh). The default for fp32 / fp8 experts at these sizes.
//
// No routing kernel and no integer scratch: every warp derives the routing from ids itself (64
// ids in two registers per lane): pair i is the leader of its expert when no pair j < i has the
// same valid id (__match_any_sync within each 32-pair half, shuffles across the halves); slot s is
// the s-th leader in pair order, and the expert's rows are its pairs in ascending order
// (ballots). So the routing is identical in every warp and every kernel, and act / y are indexed
// by pair: act[i] = silu(x[i / top_k] . gate^T) * (x[i / top_k] . up^T), y[i] = act[i] . down^T.
// Work: tasks (slot, column group) in slot-major order over n_active * ceil(n / kCols) (kCols =
// 2 output columns fused: 2 gate + 2 up rows; 4 down rows otherwise: kDecWRows = 4 weight rows
// per task; 8 spill at 128 registers); a persistent grid of CTAs of kDecWarps warps, global warp
// w takes tasks w, w + W, ... (concurrent warps stream neighbouring rows). A task streams its 4
// rows through the warp's cp.async ring (lane l: chunk l + 32 i of each row, a warp copy covers
// 512 contiguous bytes), the next chunk iteration in flight while the current one is consumed;
// x / act come through L1 (__ldg; shared by all warps of a token). fp8: the partial dot of a
// 16-value chunk is multiplied by the row block's scale (all rows of a task lie in one 128-row
// block since kCols | 128). Token rows: up to DecRows() per pass over the weights (a second pass
// only for an expert with more rows: rare at decode, and then mostly an L2 hit). Where every
// pass has one token row (DecodeStreamable), a warp streams all its tasks back to back
// (DecodeStream). The epilogue reduces each (row, weight row) sum over the warp (fixed
// butterfly: deterministic) and lane q writes column q. fp32 accumulation throughout, no atomics.
// Limits (host-checked): k % (16 / element bytes) == 0, weights 16-byte aligned with 16-byte row
// strides, pairs <= kMoeDecodeMaxPairs.
// At one token (kMoeRouteFuseMaxTokens) the gate|up kernel can also route from the router's
// logits itself (kRoute: kernels/moe_route.cuh RouteRowWarp, MoeRoute's arithmetic), which saves
// MoeRoute's launch on the step's critical path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/launch.cuh"
#include "kernels/load_util.cuh"
#include "kernels/moe_common.cuh"
#include "kernels/moe_route.cuh"

namespace glm::kernels::moe {

using detail::AsyncCommit;
using detail::AsyncCopy16;
using detail::AsyncWait;

// Token rows per pass over a task's weights: 2 (1 for fp8, whose 16-value chunks would need
// more than 128 registers for two rows; a second row re-reads the task's rows, mostly from L2).
template <int kWT>
constexpr int DecRows() { return kWT == kWFP8 ? 1 : 2; }

// The warp's view of the routing: ids of pairs lane and lane + 32 (-1: none or out of range)
// and the leader masks of both halves.
struct DecodeRouting {
  int id_a, id_b;
  unsigned lead_a, lead_b;
  int n_active;
};

__device__ __forceinline__ DecodeRouting DecodeRoute(const DecodeParams& p, const int32_t* ids,
                                                     int lane) {
  DecodeRouting r;
  int a = lane < p.pairs ? ids[lane] : -1;
  int b = lane + 32 < p.pairs ? ids[lane + 32] : -1;
  if (a < 0 || a >= p.num_experts) a = -1;
  if (b < 0 || b >= p.num_experts) b = -1;
  const unsigned ma = __match_any_sync(0xffffffffu, a);
  const unsigned mb = __match_any_sync(0xffffffffu, b);
  bool seen = false;  // b's expert among the first 32 pairs
#pragma unroll 8
  for (int s = 0; s < 32; ++s) seen |= __shfl_sync(0xffffffffu, a, s) == b;
  r.lead_a = __ballot_sync(0xffffffffu, a >= 0 && __ffs(ma) - 1 == lane);
  r.lead_b = __ballot_sync(0xffffffffu, b >= 0 && __ffs(mb) - 1 == lane && !seen);
  r.id_a = a, r.id_b = b;
  r.n_active = __popc(r.lead_a) + __popc(r.lead_b);
  return r;
}

// Position of the s-th (0-based) set bit of m (m has more than s bits set).
__device__ __forceinline__ int NthSetBit(unsigned m, int s) {
  for (int q = 0; q < s; ++q) m &= m - 1;
  return __ffs(m) - 1;
}

// One 16-byte weight chunk widened to fp32 (fp8: unscaled; 16 / 8 / 4 values).
template <int kWT>
__device__ __forceinline__ void WidenChunk(const uint4& q, float* f) {
  if constexpr (kWT == kWF32) {
    f[0] = __uint_as_float(q.x), f[1] = __uint_as_float(q.y);
    f[2] = __uint_as_float(q.z), f[3] = __uint_as_float(q.w);
  } else if constexpr (kWT == kWBF16) {
    const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __nv_bfloat162 h;
      memcpy(&h, &w[i], 4);
      const float2 v = __bfloat1622float2(h);
      f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
  } else {
    const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __nv_fp8x4_e4m3 h;
      h.__x = w[i];
      const float4 v = static_cast<float4>(h);
      f[4 * i] = v.x, f[4 * i + 1] = v.y, f[4 * i + 2] = v.z, f[4 * i + 3] = v.w;
    }
  }
}

// Chunk c (16 bytes of each of the task's kDecWRows weight rows, `cur`) times the kNG token
// rows' values at the same columns, added into acc (fp8: the partial dot times the row half's
// block scale). The one arithmetic of DecodePass and DecodeStream.
template <int kWT, int kNG>
__device__ __forceinline__ void DecodeChunk(const uint4 (&cur)[kDecWRows],
                                            const float* const* a_rows, const float* s0,
                                            const float* s1, int c, float (&acc)[kNG][kDecWRows]) {
  constexpr int kV = 16 / ElemBytes(kWT);
  constexpr int kHalf = kDecWRows / 2;
  float sc0 = 1.f, sc1 = 1.f;
  if constexpr (kWT == kWFP8) {
    sc0 = __ldg(s0 + ((c * kV) >> 7));
    sc1 = __ldg(s1 + ((c * kV) >> 7));
  }
  float xv[kNG][kV];
#pragma unroll
  for (int r = 0; r < kNG; ++r) {
#pragma unroll
    for (int j = 0; j < kV / 4; ++j) {
      const float4* src = reinterpret_cast<const float4*>(a_rows[r] + c * kV) + j;
      const float4 v = __ldg(src);
      xv[r][4 * j] = v.x, xv[r][4 * j + 1] = v.y, xv[r][4 * j + 2] = v.z, xv[r][4 * j + 3] = v.w;
    }
  }
#pragma unroll
  for (int m = 0; m < kDecWRows; ++m) {
    float wf[kV];
    WidenChunk<kWT>(cur[m], wf);
#pragma unroll
    for (int r = 0; r < kNG; ++r) {
      float s = 0.f;
#pragma unroll
      for (int v = 0; v < kV; ++v) s += xv[r][v] * wf[v];
      if constexpr (kWT == kWFP8)
        acc[r][m] += s * (m < kHalf ? sc0 : sc1);
      else
        acc[r][m] += s;
    }
  }
}

// One pass of a task over its kDecWRows weight rows for kNG token rows (a_rows; rows >= ng are
// copies of row 0, computed and dropped). w0 / w1: first weight row of the two row halves (fused:
// gate rows n0.., up rows n0..; down: both the down row n0, the second half being rows
// n0 + kDecWRows / 2..), ld in bytes; s0 / s1: their block-scale rows (fp8).
// The weight chunks go through the warp's shared-memory ring ([2][kDecWRows][32] uint4, `ring`)
// by cp.async, two chunk iterations in flight: the chunks in flight hold no registers, so the
// kernel runs 3 CTAs per SM (an fp8 100 MB stream at 2 CTAs per SM reaches 0.84 of the D2D
// rate through the ring, 0.71 through a register double buffer).
// Each lane reads back only the 16 bytes it copied itself, so no warp barrier is needed; a stage
// is refilled only after the lane's own reads of it were consumed (program order).
constexpr int kDecRingChunks = 2 * kDecWRows * 32;  // uint4 per warp of the ring

template <bool kFused, int kWT, int kNG>
__device__ __forceinline__ void DecodePass(const DecodeParams& p, const char* w0, int64_t ld0,
                                           const char* w1, int64_t ld1, const float* s0,
                                           const float* s1, const float* const* a_rows,
                                           const int* pair_of, int ng, int n0, int lane,
                                           uint4* ring) {
  constexpr int kV = 16 / ElemBytes(kWT);
  const int nchunks = p.k / kV;
  // Rows past n read row n0 (valid) and are dropped.
  const char* wr[kDecWRows];
  TaskRows<kFused>(p.n, w0, ld0, w1, ld1, n0, wr);
  float acc[kNG][kDecWRows];
#pragma unroll
  for (int r = 0; r < kNG; ++r)
#pragma unroll
    for (int m = 0; m < kDecWRows; ++m) acc[r][m] = 0.f;

  // The ring's two stages hold chunk iterations i and i + 1.
  uint4 cur[kDecWRows];
  const unsigned ring_s = static_cast<unsigned>(__cvta_generic_to_shared(ring));
  // Chunk c of every row into stage st (lane's slots).
  auto issue = [&](int c, int st) {
#pragma unroll
    for (int m = 0; m < kDecWRows; ++m) {
      AsyncCopy16(ring_s + ((st * kDecWRows + m) * 32 + lane) * 16, wr[m] + int64_t{c} * 16);
    }
  };
  if (lane < nchunks) issue(lane, 0);
  AsyncCommit();
  for (int c = lane, st = 0; c < nchunks; c += 32, st ^= 1) {
    const int cn = c + 32;
    if (cn < nchunks) issue(cn, st ^ 1);
    AsyncCommit();
    AsyncWait<1>();  // chunk c (stage st) has landed
#pragma unroll
    for (int m = 0; m < kDecWRows; ++m) cur[m] = ring[(st * kDecWRows + m) * 32 + lane];
    DecodeChunk<kWT, kNG>(cur, a_rows, s0, s1, c, acc);
  }
  AsyncWait<0>();  // nothing of this pass left in flight into the ring

  DecodeEpilogue<kFused, kNG>(p, acc, pair_of, ng, n0, lane);
}

// The expert of routing slot `slot` (the slot-th leader in pair order).
__device__ __forceinline__ int SlotExpert(const DecodeRouting& rt, int slot) {
  const int na = __popc(rt.lead_a);
  return slot < na ? __shfl_sync(0xffffffffu, rt.id_a, NthSetBit(rt.lead_a, slot))
                   : __shfl_sync(0xffffffffu, rt.id_b, NthSetBit(rt.lead_b, slot - na));
}

// One task of the decode kernels: output columns n0.. of routing slot `slot` for every pair of
// the slot's expert (a pass over the task's weight rows per DecRows() token rows; ring: see
// DecodePass).
template <bool kFused, int kWT>
__device__ __forceinline__ void DecodeTask(const DecodeParams& p, const DecodeRouting& rt, int slot,
                                           int n0, int lane, uint4* ring) {
  const int e = SlotExpert(rt, slot);
  unsigned long long rows =
      (static_cast<unsigned long long>(__ballot_sync(0xffffffffu, rt.id_b == e)) << 32) |
      __ballot_sync(0xffffffffu, rt.id_a == e);
  const char *w0, *w1;
  int64_t ld0, ld1;
  const float *s0 = nullptr, *s1 = nullptr;
  TaskWeights<kFused, kWT>(p.experts[e], n0, w0, ld0, w1, ld1, s0, s1);
  constexpr int kDecRows = DecRows<kWT>();
  // The first pass and the others are separate call sites (two inlined copies of the pass): the
  // code layout the kernel was measured with.
  bool first = true;
  while (rows != 0) {
    int pair_of[kDecRows];
    const float* a_rows[kDecRows];
    int ng = 0;
#pragma unroll
    for (int q = 0; q < kDecRows; ++q) {
      if (rows != 0) {
        pair_of[q] = __ffsll(static_cast<long long>(rows)) - 1;
        rows &= rows - 1;
        ++ng;
      } else {
        pair_of[q] = pair_of[0];
      }
      const int64_t a_row = kFused ? pair_of[q] / p.top_k : pair_of[q];
      a_rows[q] = p.a + a_row * p.a_ld;
    }
    if (kDecRows == 1 || ng == 1) {
      if (first) {
        DecodePass<kFused, kWT, 1>(p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane,
                                   ring);
      } else {
        DecodePass<kFused, kWT, 1>(p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane,
                                   ring);
      }
    } else if (first) {
      DecodePass<kFused, kWT, kDecRows>(p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane,
                                        ring);
    } else {
      DecodePass<kFused, kWT, kDecRows>(p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane,
                                        ring);
    }
    first = false;
  }
}

// Whether DecodeStream applies: rows of whole chunk iterations (k / (16 / element bytes) a
// multiple of 32), and one token row per pass over a task's weights: fp8 (DecRows() == 1) always;
// other types only where every routing slot holds one pair (distinct experts: every one-token
// step without the shared expert), since DecodeTask reads their weights once per two rows.
template <int kWT>
__device__ __forceinline__ bool DecodeStreamable(const DecodeParams& p, const DecodeRouting& rt) {
  if ((p.k / (16 / ElemBytes(kWT))) % 32 != 0) return false;
  if (DecRows<kWT>() == 1) return true;
  const int valid = __popc(__ballot_sync(0xffffffffu, rt.id_a >= 0)) +
                    __popc(__ballot_sync(0xffffffffu, rt.id_b >= 0));
  return rt.n_active == valid;
}

// A work item of DecodeStream: one pass of a task (its weight rows, TaskRows; block-scale rows)
// over one pair of the task's slot (pair, token row), and the slot's pair count.
struct StreamItem {
  const char* wr[kDecWRows];
  const float* s0;
  const float* s1;
  const float* a_row;
  int pair, n0, passes;
};

// Item (task t, pass q): pair = the q-th pair of the slot's expert in ascending order (DecodeTask's
// order of passes).
template <bool kFused, int kWT>
__device__ __forceinline__ void StreamItemOf(const DecodeParams& p, const DecodeRouting& rt,
                                             int groups, int t, int q, StreamItem& v) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int slot = t / groups;
  v.n0 = (t - slot * groups) * kCols;
  const int e = SlotExpert(rt, slot);
  const unsigned a = __ballot_sync(0xffffffffu, rt.id_a == e);
  const unsigned b = __ballot_sync(0xffffffffu, rt.id_b == e);
  const int na = __popc(a);
  v.passes = na + __popc(b);
  v.pair = q < na ? NthSetBit(a, q) : 32 + NthSetBit(b, q - na);
  const char *w0, *w1;
  int64_t ld0, ld1;
  v.s0 = v.s1 = nullptr;
  TaskWeights<kFused, kWT>(p.experts[e], v.n0, w0, ld0, w1, ld1, v.s0, v.s1);
  TaskRows<kFused>(p.n, w0, ld0, w1, ld1, v.n0, v.wr);
  v.a_row = p.a + int64_t{kFused ? v.pair / p.top_k : v.pair} * p.a_ld;
}

// The warp's tasks t0, t0 + stride, ... < tasks, each pass of each task (one pair), back to back
// through its ring (DecodePass's ring layout): the copies run one chunk iteration ahead
// across pass and task boundaries, so an item's first bytes are in flight while the previous
// item's last chunk is consumed (DecodePass starts every pass's stream from nothing: at batch 1
// a down task is 4 iterations). Only where DecodeStreamable. Per pass the arithmetic of
// DecodePass with one token row (DecodeChunk over the chunks in the same order, DecodeEpilogue),
// passes in DecodeTask's order: the same bits.
template <bool kFused, int kWT>
__device__ __forceinline__ void DecodeStream(const DecodeParams& p, const DecodeRouting& rt,
                                             int groups, int tasks, int t0, int stride, int lane,
                                             uint4* ring) {
  constexpr int kV = 16 / ElemBytes(kWT);
  const int iters = p.k / kV / 32;
  if (t0 >= tasks) return;
  const unsigned ring_s = static_cast<unsigned>(__cvta_generic_to_shared(ring));
  StreamItem pv;  // the producer's item (copies), then the consumer's
  StreamItem cv;
  StreamItemOf<kFused, kWT>(p, rt, groups, t0, 0, pv);
  cv = pv;
  // Position (task, pass, iteration) of the producer; the consumer's follows one iteration later.
  int tp = t0, qp = 0, ip = 0;
  auto issue = [&](int st) {
    if (tp < tasks) {
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) {
        AsyncCopy16(ring_s + ((st * kDecWRows + m) * 32 + lane) * 16,
                    pv.wr[m] + (int64_t{ip} * 32 + lane) * 16);
      }
      if (++ip == iters) {
        ip = 0;
        if (++qp == pv.passes) qp = 0, tp += stride;
        if (tp < tasks) StreamItemOf<kFused, kWT>(p, rt, groups, tp, qp, pv);
      }
    }
    AsyncCommit();
  };
  issue(0);
  float acc[1][kDecWRows];
#pragma unroll
  for (int m = 0; m < kDecWRows; ++m) acc[0][m] = 0.f;
  int tc = t0, qc = 0, ic = 0, st = 0;
  while (tc < tasks) {
    issue(st ^ 1);
    AsyncWait<1>();  // the consumer's chunk (stage st) has landed
    uint4 cur[kDecWRows];
#pragma unroll
    for (int m = 0; m < kDecWRows; ++m) cur[m] = ring[(st * kDecWRows + m) * 32 + lane];
    const float* a_rows[1] = {cv.a_row};
    DecodeChunk<kWT, 1>(cur, a_rows, cv.s0, cv.s1, ic * 32 + lane, acc);
    st ^= 1;
    if (++ic == iters) {
      DecodeEpilogue<kFused, 1>(p, acc, &cv.pair, 1, cv.n0, lane);
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) acc[0][m] = 0.f;
      ic = 0;
      if (++qc == cv.passes) qc = 0, tc += stride;
      if (tc < tasks) StreamItemOf<kFused, kWT>(p, rt, groups, tc, qc, cv);
    }
  }
  AsyncWait<0>();
}

// The gate|up kernel's own routing (kRoute): every warp routes the step's tokens from
// r.logits into its shared-memory rows ids / w ([tokens * top_k], RouteRowWarp: MoeRoute's
// arithmetic), and CTA 0's warp 0 writes them to r.ids / r.weights.
__device__ __forceinline__ void DecodeRouteWarp(const DecodeRouteIn& r, int pairs, int top_k,
                                                int warp, int lane, int32_t* ids, float* w) {
  for (int t = 0; t < r.tokens; ++t) {
    int32_t* id_row = ids + t * top_k;
    float* w_row = w + t * top_k;
    const glm::kernels::detail::RouteWarpScratch<8> scratch{nullptr, nullptr, nullptr, id_row,
                                                            w_row};
    glm::kernels::detail::RouteRowWarp<8, false>(r.logits + t * r.ld, r.bias, r.routed, 1, 1,
                                                 r.routed_top_k, r.renormalize != 0, r.scale,
                                                 r.appended, scratch, lane, id_row, w_row);
  }
  if (blockIdx.x == 0 && warp == 0) {
    for (int i = lane; i < pairs; i += 32) {
      r.ids[i] = ids[i];
      r.weights[i] = w[i];
    }
  }
}

// grid: persistent (LaunchDecode), block kDecWarps warps, no dynamic shared memory.
// kRoute (gate|up only): the routing from p.route.logits first (DecodeRouteIn). The weight
// chunks go through a shared-memory ring per warp (DecodePass, DecodeStream; 32 KiB per CTA) at
// 3 CTAs per SM (<= 80 registers: the chunks in flight hold none; 24 warps per SM keep more
// bytes in flight than 16: H200, cuda_ops_bench fp8 batch 1 87.1 us at 3 CTAs per SM vs 88.4 at 2).
template <bool kFused, int kWT, bool kRoute = false>
__global__ void __launch_bounds__(kDecWarps * 32, 3) MoeDecodeKernel(DecodeParams p) {
  PdlEnter();
  __shared__ __align__(16) uint4 s_ring[kDecWarps][kDecRingChunks];
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * kDecWarps + warp;
  const int num_warps = gridDim.x * kDecWarps;
  const int32_t* ids = p.ids;
  if constexpr (kRoute) {
    static_assert(kFused, "the gate|up kernel routes; down reads the ids it wrote");
    __shared__ int32_t s_ids[kDecWarps][kMoeDecodeMaxPairs];
    __shared__ float s_w[kDecWarps][kMoeDecodeMaxPairs];
    DecodeRouteWarp(p.route, p.pairs, p.top_k, warp, lane, s_ids[warp], s_w[warp]);
    ids = s_ids[warp];
  }
  const DecodeRouting rt = DecodeRoute(p, ids, lane);
  const int groups = (p.n + kCols - 1) / kCols;
  const int tasks = rt.n_active * groups;
  if (DecodeStreamable<kWT>(p, rt)) {
    DecodeStream<kFused, kWT>(p, rt, groups, tasks, gw, num_warps, lane, s_ring[warp]);
    return;
  }
  for (int t = gw; t < tasks; t += num_warps) {
    const int slot = t / groups, n0 = (t - slot * groups) * kCols;
    DecodeTask<kFused, kWT>(p, rt, slot, n0, lane, s_ring[warp]);
  }
}

}  // namespace glm::kernels::moe
