// Routed experts of one MoE layer (Backend::MoeExperts, backend.h), fp32, entirely on the device:
//   out[t] += sum_j w[t, j] * down[e](silu(gate[e] x[t]) * up[e] x[t]),  e = ids[t, j].
//
// Kernels, all on `stream`, no host loop over experts and no host synchronization:
// 1. MoeRouteKernel (one CTA): tokens per expert (shared-memory counts), exclusive scans into
//    row offsets and kBM-row tile offsets per expert, then each (token, slot) pair gets a row in
//    expert order (row_pair / pair_row). The order of rows inside an expert depends on atomics,
//    but no result does: every row is computed independently and the combine reads by pair.
// 2. MoeGemmKernel<fused = true>: act[row] = silu(x[token(row)] . gate[e]^T) * (x . up[e]^T).
// 3. MoeGemmKernel<fused = false>: y[row] = act[row] . down[e]^T.
//    Grouped GEMM: grid.x covers the worst-case tile count (ceil(pairs / kBM) + min(experts,
//    pairs)), each CTA finds its expert by binary search over the device tile offsets and exits
//    when past the last tile; experts without tokens have no tiles. Tile kBM x kBN x kBK =
//    64 x 128 x 32, 256 threads, 4-stage cp.async ring (2 stages where shared memory is
//    short), 16-byte copies with zero-fill at the
//    edges). Warp w computes rows 8w..8w+7 (only the rows its expert has: a decode tile with one
//    row costs one warp-row of FMAs), lane l columns l, l+32, l+64, l+96; shared rows are padded
//    to kBK + 4 floats so the float4 reads of 8 lanes hit 32 distinct banks.
// Decode (pairs <= kGemvMaxPairs = 64 and 16-byte weight rows; fp32 / fp8 experts, bf16 ones
//    take the listed token-group kernels below, measured faster at these sizes), the default:
//    no 1., no integer scratch: MoeDecodeKernel<fused> then MoeDecodeKernel<down> (each warp
//    derives the routing from ids itself; persistent grid sized from the SM count; act / y by
//    pair) and MoeCombineByPairKernel: three launches (see the kernels' comment). Chosen on the
//    host from pairs and the weight dtype only (no sync, graph-capture safe). Through
//    MoeRouteExperts at one token
//    (MoeRouteFuseMaxTokens) the gate|up kernel also routes from the router logits itself
//    (DecodeRouteIn: the kernels::MoeRoute launch before it is dropped; same ids and weights).
//    The two decode kernels stream their weight chunks through a per-warp cp.async ring in
//    shared memory, at 3 CTAs per SM, and fp8 steps run each warp's tasks back to back
//    (DecodeStream; cuda_ops_moe.h SetMoeDecodeAsyncCopies: the register double buffer before).
//    The three kernels also exist as one launch (MoeDecodeOneKernel, 2''+3''+4. below: dataflow
//    counters between the phases, the same bits), off by default (measured slower; cuda_ops_moe.h
//    SetMoeOneLaunchMaxTokens).
//    cuda_ops_moe.h can force the previous decode
//    path, 2'./3'. below (1. + MoeGemvKernel in place of 2. and 3. + 4.), or the tiled one.
// Listed decode (64 < pairs <= kMoeListedMaxPairs = 4096, i.e. decode batches 9..512 with
//    top-8, 16-byte weight rows), also the default: MoeListRouteKernel (deterministic
//    per-expert token lists on the device, split into token groups of up to 4 rows) then
//    MoeGroupKernel<fused> /
//    <down> (each task streams a few weight rows of one expert once, through a per-warp
//    cp.async ring, and applies every chunk to all rows of its token group) and
//    MoeCombineByPairKernel. The per-row listed kernels before them (MoeDecodeListKernel: a
//    pass over the weights per token row) stay reachable (cuda_ops_moe.h kListed). Past 4096
//    pairs (longer prefill chunks) the tiled GEMM below.
// 2'./3'. MoeGemvKernel: same outputs as 2./3. (act, y by row): each warp streams 4 weight rows
//    with 16-byte loads against the expert's rows staged in shared memory.
// 4. MoeCombineKernel: out[t] += sum_j w[t, j] * y[pair_row[t, j]], j in fixed order (no float
//    atomics: deterministic).
// The per-expert weight pointers are uploaded once per ExpertWeights array (keyed by device and
// the gate array's address, re-uploaded only when the views change) and cached for the process.
// Expert weights may be fp32, bf16 or fp8 e4m3 with 128x128 block scales (backend.h WeightDType,
// one dtype per layer): fp32 tiles come in by cp.async; bf16 / fp8 tiles are loaded 4 elements
// at a time (8 / 4 bytes), widened to fp32 (fp8: times the block's scale, the same product as
// the CPU's dequantization) and stored into the same fp32 shared-memory stage, so the FMA loop,
// the deterministic combine and every limit are unchanged. bf16 / fp8 rows need ld % 4 == 0 and
// 8 / 4-byte aligned data.
// Limits: hidden and moe_inter multiples of 4, x / out / weights 16-byte aligned with row strides
// multiple of 4; num_experts <= 1024 (one-CTA scan); pairs (tokens * top_k) < 2^31. ids outside
// [0, num_experts) contribute nothing. The first call for a given ExpertWeights allocates and
// uploads its table, so it must not be the one inside a CUDA-graph capture.
// NOTE: a stage of the fused kernel is (64 + 2 * 128) x 36 floats = 46 KiB: 4 stages (184 KiB)
// fit an H200's 227 KiB opt-in shared memory, GB10's 99 KiB takes 2 (read from the device).
// cuda_ops.h uses absl::StatusOr without including its header.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_util.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_ops_moe.h"
#include "engine/backend/cuda/cuda_ops_util.h"
#include "kernels/load_util.cuh"
#include "kernels/moe_route.cuh"
#include "kernels/moe_route.h"

namespace glm::engine::cuda {
namespace {

using kernels::detail::AsyncCommit;
using kernels::detail::AsyncCopy16;
using kernels::detail::AsyncWait;
using kernels::detail::LoadStreaming16;

constexpr const char* kOp = "MoeExperts";
constexpr int kMaxExperts = 1024;
constexpr int kRouteThreads = 1024;
constexpr int kThreads = 256;
constexpr int kBM = 64, kBN = 128, kBK = 32, kPad = 4, kRowF = kBK + kPad;
constexpr int kRowsPerWarp = 8;
constexpr int kCombineThreads = 256;

// Weight element types of the GEMM kernel (template argument): WeightDType as an int.
constexpr int kWF32 = 0, kWBF16 = 1, kWFP8 = 2;
constexpr int ElemBytes(int wt) { return wt == kWF32 ? 4 : wt == kWBF16 ? 2 : 1; }

// The one weight-type dispatch of the launchers: f(std::integral_constant<int, kWT>{}) for the
// layer's weight type (a generic lambda reads the type as decltype(tag)::value).
template <typename F>
absl::Status DispatchWT(int wt, F&& f) {
  if (wt == kWBF16) return f(std::integral_constant<int, kWBF16>{});
  if (wt == kWFP8) return f(std::integral_constant<int, kWFP8>{});
  return f(std::integral_constant<int, kWF32>{});
}

struct ExpertPtr {
  const void* gate;
  const void* up;
  const void* down;
  int64_t gate_ld, up_ld, down_ld;
  const float* gate_s;  // fp8 block scales (null otherwise)
  const float* up_s;
  const float* down_s;
  int64_t gate_sld, up_sld, down_sld;
};

// ---- 1. routing ------------------------------------------------------------------------------

__device__ __forceinline__ int BlockExclusiveScan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x / 32;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int ws = lane < nw ? warp_sums[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int n = __shfl_up_sync(0xffffffffu, ws, o);
      if (lane >= o) ws += n;
    }
    if (lane < nw) warp_sums[lane] = ws;
  }
  __syncthreads();
  const int base = warp > 0 ? warp_sums[warp - 1] : 0;
  *total = warp_sums[nw - 1];
  __syncthreads();
  return base + incl - v;
}

// grid 1, block kRouteThreads. expert_off/tile_off: [E + 1]; row_pair/pair_row: [pairs].
__global__ void __launch_bounds__(kRouteThreads)
    MoeRouteKernel(const int32_t* ids, int pairs, int num_experts, int32_t* expert_off,
                   int32_t* tile_off, int32_t* row_pair, int32_t* pair_row) {
  PdlEnter();
  __shared__ int cnt[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  for (int e = tid; e < num_experts; e += kRouteThreads) cnt[e] = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = ids[i];
    if (e >= 0 && e < num_experts) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  const int c = tid < num_experts ? cnt[tid] : 0;
  int total_rows, total_tiles;
  const int row0 = BlockExclusiveScan(c, warp_sums, &total_rows);
  const int tile0 = BlockExclusiveScan((c + kBM - 1) / kBM, warp_sums, &total_tiles);
  if (tid < num_experts) {
    expert_off[tid] = row0;
    tile_off[tid] = tile0;
    cursor[tid] = row0;
  }
  if (tid == 0) {
    expert_off[num_experts] = total_rows;
    tile_off[num_experts] = total_tiles;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = ids[i];
    int row = -1;
    if (e >= 0 && e < num_experts) {
      row = atomicAdd(&cursor[e], 1);
      row_pair[row] = i;
    }
    pair_row[i] = row;
  }
}

// ---- 2./3. grouped GEMM ----------------------------------------------------------------------

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_size));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float Dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Weight elements k..k+3 of one row at byte address p, widened to fp32; fp8 times the row's
// block scale srow[k / 128] (k % 4 == 0, so the 4 share a block).
template <int kWT>
__device__ __forceinline__ float4 LoadW4(const char* p, const float* srow, int k) {
  if constexpr (kWT == kWBF16) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    __nv_bfloat162 lo, hi;
    memcpy(&lo, &v.x, 4);
    memcpy(&hi, &v.y, 4);
    const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
    return make_float4(a.x, a.y, b.x, b.y);
  } else {
    __nv_fp8x4_e4m3 q;
    q.__x = *reinterpret_cast<const __nv_fp8x4_storage_t*>(p);
    const float4 f = static_cast<float4>(q);
    const float sc = srow[k >> 7];
    return make_float4(f.x * sc, f.y * sc, f.z * sc, f.w * sc);
  }
}

struct GemmParams {
  const float* a;  // fused: x [tokens, K] (rows gathered by token); else act [pairs, K]
  int64_t a_ld;
  int top_k;       // fused: token = row_pair[row] / top_k
  const ExpertPtr* experts;
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

// grid (max tiles, ceil(n / kBN)); block kThreads; dynamic smem GemmSmemFloats<...>() * 4.
// kStages-deep cp.async ring: kStages - 1 k-tiles in flight while one is computed.
template <bool kFused, int kStages, int kWT>
__global__ void __launch_bounds__(kThreads) MoeGemmKernel(GemmParams p) {
  PdlEnter();
  extern __shared__ __align__(16) float smem[];
  const int m_tile = blockIdx.x;
  if (m_tile >= p.tile_off[p.num_experts]) return;
  int lo = 0, hi = p.num_experts - 1;  // last e with tile_off[e] <= m_tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.tile_off[mid] <= m_tile) lo = mid; else hi = mid - 1;
  }
  const int e = lo;
  const int row0 = p.expert_off[e] + (m_tile - p.tile_off[e]) * kBM;
  const int rows = min(kBM, p.expert_off[e + 1] - row0);
  const int n0 = blockIdx.y * kBN;
  const ExpertPtr ex = p.experts[e];
  constexpr int kEB = ElemBytes(kWT);
  const char* b0 = static_cast<const char*>(kFused ? ex.gate : ex.down);
  const int64_t b0_ld = kFused ? ex.gate_ld : ex.down_ld;
  const float* b0_s = kFused ? ex.gate_s : ex.down_s;
  const int64_t b0_sld = kFused ? ex.gate_sld : ex.down_sld;

  constexpr int kStageFloats = (kBM + (kFused ? 2 : 1) * kBN) * kRowF;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // This thread's copy sources: 2 A chunks, 4 B chunks (per B matrix), fixed rows over k.
  constexpr int kChunksPerRow = kBK / 4;
  const float* a_src[2];
  bool a_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = (tid + i * kThreads) / kChunksPerRow;
    a_ok[i] = r < rows;
    const int row = row0 + (a_ok[i] ? r : 0);
    const int64_t a_row = kFused ? p.row_pair[row] / p.top_k : row;
    a_src[i] = p.a + a_row * p.a_ld;
  }
  const char* b_src[4];
  const char* u_src[4];
  const float* b_srow[4];  // fp8: this row's block scales
  const float* u_srow[4];
  bool b_ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = (tid + i * kThreads) / kChunksPerRow;
    b_ok[i] = n0 + r < p.n;
    const int64_t n = b_ok[i] ? n0 + r : 0;
    b_src[i] = b0 + n * b0_ld * kEB;
    u_src[i] = kFused ? static_cast<const char*>(ex.up) + n * ex.up_ld * kEB : nullptr;
    b_srow[i] = kWT == kWFP8 ? b0_s + (n >> 7) * b0_sld : nullptr;
    u_srow[i] = kWT == kWFP8 && kFused ? ex.up_s + (n >> 7) * ex.up_sld : nullptr;
  }
  const int kc = (tid % kChunksPerRow) * 4;

  auto load_stage = [&](int stage, int k0) {
    float* s = smem + stage * kStageFloats;
    const int k = k0 + kc;
    const bool k_ok = k < p.k;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = (tid + i * kThreads) / kChunksPerRow;
      const bool ok = a_ok[i] && k_ok;
      CpAsync16(s + r * kRowF + kc, ok ? a_src[i] + k : p.a, ok);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (tid + i * kThreads) / kChunksPerRow;
      const bool ok = b_ok[i] && k_ok;
      if constexpr (kWT == kWF32) {
        CpAsync16(s + (kBM + r) * kRowF + kc, ok ? b_src[i] + k * kEB : b0, ok);
        if constexpr (kFused) {
          CpAsync16(s + (kBM + kBN + r) * kRowF + kc, ok ? u_src[i] + k * kEB : ex.up, ok);
        }
      } else {  // widen in registers; the stage's slot is free (see the loop's __syncthreads)
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(s + (kBM + r) * kRowF + kc) =
            ok ? LoadW4<kWT>(b_src[i] + k * kEB, b_srow[i], k) : zero;
        if constexpr (kFused) {
          *reinterpret_cast<float4*>(s + (kBM + kBN + r) * kRowF + kc) =
              ok ? LoadW4<kWT>(u_src[i] + k * kEB, u_srow[i], k) : zero;
        }
      }
    }
  };

  const int my_rows = max(0, min(kRowsPerWarp, rows - warp * kRowsPerWarp));  // warp-uniform
  float acc[kRowsPerWarp][4];
  float acc_u[kRowsPerWarp][4];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[r][i] = acc_u[r][i] = 0.f;

  const int num_k_tiles = (p.k + kBK - 1) / kBK;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_k_tiles) load_stage(st, st * kBK);
    CpAsyncCommit();  // empty groups keep the group count uniform
  }
  for (int kt = 0; kt < num_k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();  // k-tile kt has landed (this thread's copies)
    __syncthreads();             // ... everyone's; and slot (kt - 1) % kStages is free
    const int next = kt + kStages - 1;
    if (next < num_k_tiles) load_stage(next % kStages, next * kBK);
    CpAsyncCommit();
    if (my_rows > 0) {
      const float* s = smem + (kt % kStages) * kStageFloats;
      const float* a_s = s + warp * kRowsPerWarp * kRowF;
      const float* b_s = s + (kBM + lane) * kRowF;
      const float* u_s = s + (kBM + kBN + lane) * kRowF;
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 4) {
        float4 b[4], u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          b[i] = *reinterpret_cast<const float4*>(b_s + i * 32 * kRowF + kk);
          if constexpr (kFused) u[i] = *reinterpret_cast<const float4*>(u_s + i * 32 * kRowF + kk);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          if (r < my_rows) {
            const float4 a = *reinterpret_cast<const float4*>(a_s + r * kRowF + kk);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc[r][i] += Dot4(a, b[i]);
              if constexpr (kFused) acc_u[r][i] += Dot4(a, u[i]);
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (r >= my_rows) break;
    const int64_t row = row0 + warp * kRowsPerWarp + r;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n0 + lane + 32 * i;
      if (n < p.n) {
        float v = acc[r][i];
        if constexpr (kFused) v = v / (1.0f + expf(-v)) * acc_u[r][i];
        p.c[row * p.n + n] = v;
      }
    }
  }
}

// ---- 2'./3'. small-M path: grouped GEMV -----------------------------------------------------
//
// MoeGemvKernel<kFused, kWT>: the decode shape (pairs <= kGemvMaxPairs, so every expert has at
// most kBM rows and exactly one tile in tile_off: tile_off[e] is the expert's index among the
// experts with tokens). grid (min(num_experts, pairs), ceil(n / (kGemvWarps * kNR))), block
// kGemvWarps * 32. CTA (slot, ny) finds its expert like MoeGemmKernel (exits past the last);
// warp w owns output columns n = (ny * kGemvWarps + w) * kNR + q, q < kNR, and streams those
// weight rows (fused: gate and up rows, kNR = 2; else down rows, kNR = 4: four weight rows per
// warp either way) with 16-byte loads: lane l takes 16-byte chunk l + 32 i of the row (fp8: 16
// values, bf16: 8, fp32: 4), so a warp load covers 512 contiguous bytes. The expert's rows of the
// A operand (fused: x gathered by token; else act) are staged per kGemvChunks * 32 chunks of k
// into fp32 shared memory, at most kGemvRows rows at a time (more rows loop over the weights
// again: only repeated experts get there), float4 units rotated inside each chunk so the 8 lanes
// of a float4 phase read 8 distinct bank groups. fp8: the partial dot of 16 values is multiplied
// by the row's 128x128 block scale (16 | 128, so one scale per chunk). The epilogue (SiLU * up)
// and the output layout ([pairs, n] by row) are those of MoeGemmKernel, so the combine is shared.
// Limits (checked on the host, else the tiled path runs): k % (16 / element bytes) == 0, weight
// data 16-byte aligned with 16-byte row strides.
// NOTE: weights are read once (no reuse in L2 across a layer of ~0.3 GB), so loads are
// streaming (__ldcs); HBM bandwidth, not FMAs, bounds this kernel at <= kGemvRows rows.
constexpr int kGemvMaxPairs = 64;
constexpr int kGemvWarps = 8;
constexpr int kGemvRows = 4;
constexpr int kGemvChunks = 4;  // 16-byte chunks per lane per staged k slice
static_assert(kGemvMaxPairs <= kBM, "an expert of the GEMV path must have exactly one tile");
static_assert(kGemvMaxPairs == kMoeDecodeMaxPairs, "cuda_ops_moe.h's decode limit");

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

template <bool kFused, int kWT>
__global__ void __launch_bounds__(kGemvWarps * 32) MoeGemvKernel(GemmParams p) {
  PdlEnter();
  constexpr int kEB = ElemBytes(kWT);
  constexpr int kV = 16 / kEB;                      // values per 16-byte chunk
  constexpr int kU = kV / 4;                        // float4 units per chunk
  constexpr int kSlice = kGemvChunks * 32 * kV;     // k values staged at a time
  constexpr int kNR = kFused ? 2 : 4;               // output columns per warp
  __shared__ __align__(16) float xs[kGemvRows * kSlice];
  const int slot = blockIdx.x;
  if (slot >= p.tile_off[p.num_experts]) return;
  int lo = 0, hi = p.num_experts - 1;  // last e with tile_off[e] <= slot
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.tile_off[mid] <= slot) lo = mid; else hi = mid - 1;
  }
  const int e = lo;
  const int row0 = p.expert_off[e];
  const int rows = p.expert_off[e + 1] - row0;
  const ExpertPtr ex = p.experts[e];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_base = (blockIdx.y * kGemvWarps + warp) * kNR;

  // The warp's 4 weight rows: fused m = 2 q + {0: gate, 1: up}; else m = q (down).
  const char* wrow[4];
  const float* srow[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int q = kFused ? m / 2 : m;
    const bool up = kFused && (m & 1);
    const int n_raw = n_base + q;
    const int64_t n = n_raw < p.n ? n_raw : 0;
    const char* base = static_cast<const char*>(kFused ? (up ? ex.up : ex.gate) : ex.down);
    const int64_t ld = kFused ? (up ? ex.up_ld : ex.gate_ld) : ex.down_ld;
    wrow[m] = base + n * ld * kEB;
    if constexpr (kWT == kWFP8) {
      const float* s = kFused ? (up ? ex.up_s : ex.gate_s) : ex.down_s;
      const int64_t sld = kFused ? (up ? ex.up_sld : ex.gate_sld) : ex.down_sld;
      srow[m] = s + (n >> 7) * sld;
    } else {
      srow[m] = nullptr;
    }
  }

  for (int g0 = 0; g0 < rows; g0 += kGemvRows) {
    const int ng = min(kGemvRows, rows - g0);  // CTA-uniform
    float acc[kGemvRows][4];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
      for (int m = 0; m < 4; ++m) acc[r][m] = 0.f;

    for (int k0 = 0; k0 < p.k; k0 += kSlice) {
      // This slice's weights, in flight while the A rows are staged.
      uint4 w[kGemvChunks][4];
      float sc[kGemvChunks][4];
#pragma unroll
      for (int i = 0; i < kGemvChunks; ++i) {
        const int k = k0 + (lane + 32 * i) * kV;
        const bool ok = k < p.k;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          w[i][m] = ok ? __ldcs(reinterpret_cast<const uint4*>(wrow[m] + int64_t{k} * kEB))
                       : make_uint4(0u, 0u, 0u, 0u);
          if constexpr (kWT == kWFP8) sc[i][m] = ok ? __ldg(srow[m] + (k >> 7)) : 0.f;
        }
      }
      __syncthreads();  // the previous slice's readers are done with xs
      for (int idx = tid; idx < ng * (kSlice / 4); idx += kGemvWarps * 32) {
        const int r = idx / (kSlice / 4), unit = idx % (kSlice / 4);
        const int c = unit / kU, j = unit % kU;
        const int k = k0 + unit * 4;
        const int64_t a_row = kFused ? p.row_pair[row0 + g0 + r] / p.top_k : row0 + g0 + r;
        const float4 v = k < p.k ? *reinterpret_cast<const float4*>(p.a + a_row * p.a_ld + k)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
        const int rot = (c / (8 / kU)) % kU;
        *reinterpret_cast<float4*>(xs + r * kSlice + (c * kU + (j + rot) % kU) * 4) = v;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kGemvChunks; ++i) {
        const int c = lane + 32 * i;
        const int rot = (c / (8 / kU)) % kU;
        float wf[4][kV];
#pragma unroll
        for (int m = 0; m < 4; ++m) WidenChunk<kWT>(w[i][m], wf[m]);
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) {
          if (r < ng) {
            float xv[kV];
#pragma unroll
            for (int j = 0; j < kU; ++j) {
              const float4 v = *reinterpret_cast<const float4*>(
                  xs + r * kSlice + (c * kU + (j + rot) % kU) * 4);
              xv[4 * j] = v.x, xv[4 * j + 1] = v.y, xv[4 * j + 2] = v.z, xv[4 * j + 3] = v.w;
            }
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              float s = 0.f;
#pragma unroll
              for (int v = 0; v < kV; ++v) s += xv[v] * wf[m][v];
              if constexpr (kWT == kWFP8) acc[r][m] += s * sc[i][m];
              else acc[r][m] += s;
            }
          }
        }
      }
    }

#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      if (r >= ng) break;
#pragma unroll
      for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
      }
      const int64_t row = row0 + g0 + r;
      if (lane < kNR && n_base + lane < p.n) {
        float v;
        if constexpr (kFused) {
          const float gt = lane == 0 ? acc[r][0] : acc[r][2];
          const float u = lane == 0 ? acc[r][1] : acc[r][3];
          v = gt / (1.0f + expf(-gt)) * u;
        } else {
          v = lane == 0 ? acc[r][0] : lane == 1 ? acc[r][1] : lane == 2 ? acc[r][2] : acc[r][3];
        }
        p.c[row * p.n + n_base + lane] = v;
      }
    }
  }
}

template <bool kFused>
absl::Status LaunchGemvFor(int wt, const GemmParams& p, int64_t slots, cudaStream_t stream) {
  const int per_cta = kGemvWarps * (kFused ? 2 : 4);
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(detail::CeilDiv(p.n, per_cta)));
  return DispatchWT(wt, [&](auto tag) {
    LaunchKernel(MoeGemvKernel<kFused, decltype(tag)::value>, grid, kGemvWarps * 32, 0, stream, p);
    return detail::CudaCheck(cudaGetLastError(), kOp, "MoeGemvKernel launch");
  });
}

// ---- 2''./3''. decode path: weight-streaming warps over the distinct experts -----------------
//
// MoeDecodeKernel<kFused, kWT> (pairs <= kGemvMaxPairs, 16-byte weight rows; the default decode
// path, replacing MoeRouteKernel + MoeGemvKernel). No routing kernel and no integer scratch:
// every warp derives the routing from ids itself (64 ids in two registers per lane): pair i is
// the leader of its expert when no pair j < i has the same valid id (__match_any_sync within
// each 32-pair half, shuffles across the halves); slot s is the s-th leader in pair order, and
// the expert's rows are its pairs in ascending order (ballots). So the routing is identical in
// every warp and every kernel, and act / y are indexed by pair: act[i] = silu(x[i / top_k] .
// gate^T) * (x[i / top_k] . up^T), y[i] = act[i] . down^T.
// Work: tasks (slot, column group) in slot-major order over n_active * ceil(n / kCols) (kCols =
// 2 output columns fused: 2 gate + 2 up rows; 4 down rows otherwise: kDecWRows = 4 weight rows
// per task; 8 spill at 128 registers);
// a persistent grid of min(tasks, SMs x resident CTAs) CTAs of kDecWarps warps, global warp w
// takes tasks w, w + W, ... (concurrent warps stream neighbouring rows). A task streams its 4
// rows with 16-byte loads that skip L1 (lane l: chunk l + 32 i of each row, a warp load covers
// 512 contiguous bytes), the next chunk's 4 loads issued before the current one is consumed;
// x / act come through L1 (__ldg; shared by all warps of a token). fp8: the partial dot of a
// 16-value chunk is multiplied by the row block's scale (all rows of a task lie in one
// 128-row block since kCols | 128). Token rows: up to DecRows() per pass over the weights (a
// second pass only for an expert with more rows: rare at decode, and then mostly an L2 hit).
// The epilogue reduces each (row, weight row) sum over the warp (fixed butterfly: deterministic)
// and lane q writes column q. fp32 accumulation throughout, no atomics.
// Limits (host-checked, else the tiled path): those of MoeGemvKernel (k % (16 / element
// bytes) == 0, weights 16-byte aligned with 16-byte row strides), pairs <= 64.
constexpr int kDecWarps = 8;
constexpr int kDecWRows = 4;  // weight rows per task
// Token rows per pass over a task's weights: 2 (1 for fp8, whose 16-value chunks would need
// more than 128 registers for two rows; a second row re-reads the task's rows, mostly from L2).
template <int kWT>
constexpr int DecRows() { return kWT == kWFP8 ? 1 : 2; }

// The gate|up decode kernel's own routing (MoeRouteExperts at few tokens): every warp routes
// the step's tokens from the router's logits with kernels::detail::RouteRowWarp (MoeRoute's
// arithmetic: the same ids and weights) into its shared memory, and CTA 0's warp 0 writes them
// to ids / weights for the down and combine kernels. logits == nullptr: route from ids.
struct DecodeRouteIn {
  const float* logits;  // [tokens, routed] fp32, row stride ld
  int64_t ld;
  const float* bias;  // [routed] or null
  int routed, routed_top_k, tokens, appended;
  int renormalize;
  float scale;
  int32_t* ids;    // [pairs] out
  float* weights;  // [pairs] out
};

struct DecodeParams {
  const int32_t* ids;  // [pairs]
  int pairs, top_k, num_experts;
  const ExpertPtr* experts;
  const float* a;  // fused: x [tokens, k] (row = pair / top_k); else act [pairs, k]
  int64_t a_ld;
  int n, k;
  float* c;  // [pairs, n]
  DecodeRouteIn route;
};

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

// The end of a task pass: each (token row, weight row) sum reduced over the warp (fixed
// butterfly: deterministic), lane q writes output column n0 + q of rows < ng (fused: silu(gate
// q) * up q; down: row q).
template <bool kFused, int kNG>
__device__ __forceinline__ void DecodeEpilogue(const DecodeParams& p, float (&acc)[kNG][kDecWRows],
                                               const int* pair_of, int ng, int n0, int lane) {
  constexpr int kHalf = kDecWRows / 2;
#pragma unroll
  for (int r = 0; r < kNG; ++r) {
    if (r < ng) {  // warp-uniform
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
      }
      float* crow = p.c + int64_t{pair_of[r]} * p.n + n0;
      if constexpr (kFused) {
        // lane q < kHalf: column n0 + q = silu(gate q) * up q.
        float g = acc[r][0], u = acc[r][kHalf];
#pragma unroll
        for (int q = 1; q < kHalf; ++q) {
          if (lane == q) g = acc[r][q], u = acc[r][kHalf + q];
        }
        if (lane < kHalf && n0 + lane < p.n) crow[lane] = g / (1.0f + expf(-g)) * u;
      } else {
        float v = acc[r][0];
#pragma unroll
        for (int q = 1; q < kDecWRows; ++q) {
          if (lane == q) v = acc[r][q];
        }
        if (lane < kDecWRows && n0 + lane < p.n) crow[lane] = v;
      }
    }
  }
}

// The task's kDecWRows weight rows from its two halves' first rows (see DecodePass); rows past
// n read row n0 (valid) and are dropped.
template <bool kFused>
__device__ __forceinline__ void TaskRows(int n, const char* w0, int64_t ld0, const char* w1,
                                         int64_t ld1, int n0, const char* (&wr)[kDecWRows]) {
  constexpr int kHalf = kDecWRows / 2;
#pragma unroll
  for (int m = 0; m < kHalf; ++m) {
    const int q0 = m, q1 = kFused ? m : m + kHalf;
    wr[m] = w0 + (n0 + q0 < n ? q0 : 0) * ld0;
    wr[kHalf + m] = w1 + (n0 + q1 < n ? q1 : 0) * ld1;
  }
}

// Chunk c (16 bytes of each of the task's kDecWRows weight rows, `cur`) times the kNG token
// rows' values at the same columns, added into acc (fp8: the partial dot times the row half's
// block scale). The one arithmetic of DecodePass and DecodeStream.
template <int kWT, int kNG, bool kCoherentA = false>
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
      const float4 v = kCoherentA ? *src : __ldg(src);
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
// kCoherentA: a comes from this grid (the one-launch kernel's act): plain loads (ordered by the
// wait's acquire; still cached in L1 for the other warps of the SM), not the read-only path
// (ld.global.nc, for data no kernel writes while it runs). Through L2 only (ld.global.cg) the
// one-launch kernel measured 193 us against 115 for three launches: every chunk waited for an
// L2 round trip. after_issue() runs once the pass's first weight loads are issued (the
// one-launch kernel's arrival for the warp's previous task: its fence then overlaps the loads'
// latency, which the warp waits for anyway).
// kAsync: the weight chunks go through the warp's shared-memory ring ([2][kDecWRows][32] uint4,
// `ring`) by cp.async instead of a register double buffer: the same bytes, values and order, so
// the same bits; what changes is the memory pipeline (fp8 100 MB stream at 2 CTAs per SM,
// tools/gpu/fp8_widen_bench.cu: 0.71 of the D2D rate through registers, 0.84 through the ring).
// Each lane reads back only the 16 bytes it copied itself, so no warp barrier is needed; a stage
// is refilled only after the lane's own reads of it were consumed (program order).
struct Nothing {
  __device__ void operator()() const {}
};

constexpr int kDecRingChunks = 2 * kDecWRows * 32;  // uint4 per warp of the kAsync ring

template <bool kFused, int kWT, int kNG, bool kCoherentA = false, typename AfterIssue = Nothing,
          bool kAsync = false>
__device__ __forceinline__ void DecodePass(const DecodeParams& p, const char* w0, int64_t ld0,
                                           const char* w1, int64_t ld1, const float* s0,
                                           const float* s1, const float* const* a_rows,
                                           const int* pair_of, int ng, int n0, int lane,
                                           const AfterIssue& after_issue = AfterIssue{},
                                           uint4* ring = nullptr) {
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

  // Registers (or, kAsync, the ring's two stages) hold chunk iterations i and i + 1.
  uint4 cur[kDecWRows];
  const unsigned ring_s = kAsync ? static_cast<unsigned>(__cvta_generic_to_shared(ring)) : 0u;
  // Chunk c of every row into stage st (lane's slots).
  auto issue = [&](int c, int st) {
#pragma unroll
    for (int m = 0; m < kDecWRows; ++m) {
      AsyncCopy16(ring_s + ((st * kDecWRows + m) * 32 + lane) * 16, wr[m] + int64_t{c} * 16);
    }
  };
  if (lane < nchunks) {
    if constexpr (kAsync) {
      issue(lane, 0);
    } else {
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) cur[m] = LoadStreaming16(wr[m] + int64_t{lane} * 16);
    }
  }
  if constexpr (kAsync) AsyncCommit();
  after_issue();
  for (int c = lane, st = 0; c < nchunks; c += 32, st ^= 1) {
    uint4 nxt[kDecWRows];
    const int cn = c + 32;
    if constexpr (kAsync) {
      if (cn < nchunks) issue(cn, st ^ 1);
      AsyncCommit();
      AsyncWait<1>();  // chunk c (stage st) has landed
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) cur[m] = ring[(st * kDecWRows + m) * 32 + lane];
    } else if (cn < nchunks) {
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) nxt[m] = LoadStreaming16(wr[m] + int64_t{cn} * 16);
    }
    DecodeChunk<kWT, kNG, kCoherentA>(cur, a_rows, s0, s1, c, acc);
    if constexpr (!kAsync) {
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) cur[m] = nxt[m];
    }
  }
  if constexpr (kAsync) AsyncWait<0>();  // nothing of this pass left in flight into the ring

  DecodeEpilogue<kFused, kNG>(p, acc, pair_of, ng, n0, lane);
}

// First weight rows of a task's two row halves (see DecodePass) for output columns n0..:
// fused gate / up rows n0.., down rows n0.. (both halves; DecodePass adds the second's offset).
template <bool kFused, int kWT>
__device__ __forceinline__ void TaskWeights(const ExpertPtr& ex, int n0, const char*& w0,
                                            int64_t& ld0, const char*& w1, int64_t& ld1,
                                            const float*& s0, const float*& s1) {
  constexpr int kEB = ElemBytes(kWT);
  if constexpr (kFused) {
    w0 = static_cast<const char*>(ex.gate) + int64_t{n0} * ex.gate_ld * kEB;
    w1 = static_cast<const char*>(ex.up) + int64_t{n0} * ex.up_ld * kEB;
    ld0 = ex.gate_ld * kEB, ld1 = ex.up_ld * kEB;
    if constexpr (kWT == kWFP8) {
      s0 = ex.gate_s + (n0 >> 7) * ex.gate_sld;
      s1 = ex.up_s + (n0 >> 7) * ex.up_sld;
    }
  } else {
    ld0 = ld1 = ex.down_ld * kEB;
    w0 = static_cast<const char*>(ex.down) + int64_t{n0} * ld0;
    w1 = w0;  // rows n0 + kDecWRows / 2.. (DecodePass adds the half's offset)
    if constexpr (kWT == kWFP8) s0 = s1 = ex.down_s + (n0 >> 7) * ex.down_sld;
  }
}

// The expert of routing slot `slot` (the slot-th leader in pair order).
__device__ __forceinline__ int SlotExpert(const DecodeRouting& rt, int slot) {
  const int na = __popc(rt.lead_a);
  return slot < na ? __shfl_sync(0xffffffffu, rt.id_a, NthSetBit(rt.lead_a, slot))
                   : __shfl_sync(0xffffffffu, rt.id_b, NthSetBit(rt.lead_b, slot - na));
}

// One task of the decode kernels: output columns n0.. of routing slot `slot` for every pair of
// the slot's expert (a pass over the task's weight rows per DecRows() token rows). after_issue:
// see DecodePass (the first pass only). kAsync / ring: see DecodePass.
template <bool kFused, int kWT, bool kCoherentA = false, typename AfterIssue = Nothing,
          bool kAsync = false>
__device__ __forceinline__ void DecodeTask(const DecodeParams& p, const DecodeRouting& rt, int slot,
                                           int n0, int lane,
                                           const AfterIssue& after_issue = AfterIssue{},
                                           uint4* ring = nullptr) {
  const int e = SlotExpert(rt, slot);
  unsigned long long rows =
      (static_cast<unsigned long long>(__ballot_sync(0xffffffffu, rt.id_b == e)) << 32) |
      __ballot_sync(0xffffffffu, rt.id_a == e);
  const char *w0, *w1;
  int64_t ld0, ld1;
  const float *s0 = nullptr, *s1 = nullptr;
  TaskWeights<kFused, kWT>(p.experts[e], n0, w0, ld0, w1, ld1, s0, s1);
  constexpr int kDecRows = DecRows<kWT>();
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
        DecodePass<kFused, kWT, 1, kCoherentA, AfterIssue, kAsync>(
            p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane, after_issue, ring);
      } else {
        DecodePass<kFused, kWT, 1, kCoherentA, Nothing, kAsync>(
            p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane, Nothing{}, ring);
      }
    } else if (first) {
      DecodePass<kFused, kWT, kDecRows, kCoherentA, AfterIssue, kAsync>(
          p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane, after_issue, ring);
    } else {
      DecodePass<kFused, kWT, kDecRows, kCoherentA, Nothing, kAsync>(
          p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane, Nothing{}, ring);
    }
    first = false;
  }
}

// Set by every MoeDecodeKernel launch (its first warp): 1 when it ran DecodeStream. Read by
// MoeDecodeStreamedOnDevice (tests).
__device__ int g_dev_decode_streamed = 0;

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
// through its ring (the kAsync layout of DecodePass): the copies run one chunk iteration ahead
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

// The first bytes of a task's weight rows into L2 (lane l: 128-byte line l % 8 of row l / 8;
// rows past n as TaskRows): started before the one-launch kernel's arrivals and waits, so HBM
// keeps streaming while the warp fences or waits. Prefetches change no value.
template <bool kFused, int kWT>
__device__ __forceinline__ void PrefetchTaskL2(const DecodeParams& p, const DecodeRouting& rt,
                                               int slot, int n0, int lane) {
  static_assert(kDecWRows == 4, "lane -> (row, line) below");
  const char *w0, *w1;
  int64_t ld0, ld1;
  const float *s0 = nullptr, *s1 = nullptr;
  TaskWeights<kFused, kWT>(p.experts[SlotExpert(rt, slot)], n0, w0, ld0, w1, ld1, s0, s1);
  const char* wr[kDecWRows];
  TaskRows<kFused>(p.n, w0, ld0, w1, ld1, n0, wr);
  const int64_t line = int64_t{lane % 8} * 128;
  if (line < int64_t{p.k} * ElemBytes(kWT)) {
    const int r = lane / 8;  // selects, not an indexed local array (which would live in memory)
    const char* row = r == 0 ? wr[0] : r == 1 ? wr[1] : r == 2 ? wr[2] : wr[3];
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + line));
  }
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
    glm::kernels::detail::RouteRowWarp<8, true, false>(r.logits + t * r.ld, r.bias, r.routed, 1, 1,
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

// kRoute (gate|up only): the routing from p.route.logits first (DecodeRouteIn). kAsync: the
// weight chunks through a shared-memory ring per warp (DecodePass, DecodeStream; 32 KiB per CTA)
// and 3 CTAs per SM (<= 80 registers: the chunks in flight hold none; 24 warps per SM keep more
// bytes in flight than 16: H200, cuda_ops_bench fp8 batch 1 87.1 us at 3 CTAs per SM vs 88.4 at 2,
// 64 pairs 591 vs 614-636; decode step batch 1 0.227 vs 0.230-0.241 ms/layer).
template <bool kFused, int kWT, bool kRoute = false, bool kAsync = false>
__global__ void __launch_bounds__(kDecWarps * 32, kAsync ? 3 : 2) MoeDecodeKernel(DecodeParams p) {
  PdlEnter();
  __shared__ __align__(16) uint4 s_ring[kAsync ? kDecWarps : 1][kAsync ? kDecRingChunks : 1];
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * kDecWarps + warp;
  const int num_warps = gridDim.x * kDecWarps;
  const int32_t* ids = p.ids;
  if constexpr (kRoute) {
    static_assert(kFused, "the gate|up kernel routes; down reads the ids it wrote");
    __shared__ int32_t s_ids[kDecWarps][kGemvMaxPairs];
    __shared__ float s_w[kDecWarps][kGemvMaxPairs];
    DecodeRouteWarp(p.route, p.pairs, p.top_k, warp, lane, s_ids[warp], s_w[warp]);
    ids = s_ids[warp];
  }
  const DecodeRouting rt = DecodeRoute(p, ids, lane);
  const int groups = (p.n + kCols - 1) / kCols;
  const int tasks = rt.n_active * groups;
  if constexpr (kAsync) {
    const bool stream = DecodeStreamable<kWT>(p, rt);
    if (gw == 0 && lane == 0) g_dev_decode_streamed = stream ? 1 : 0;
    if (stream) {
      DecodeStream<kFused, kWT>(p, rt, groups, tasks, gw, num_warps, lane, s_ring[warp]);
      return;
    }
  } else if (gw == 0 && lane == 0) {
    g_dev_decode_streamed = 0;
  }
  for (int t = gw; t < tasks; t += num_warps) {
    const int slot = t / groups, n0 = (t - slot * groups) * kCols;
    DecodeTask<kFused, kWT, false, Nothing, kAsync>(p, rt, slot, n0, lane, Nothing{},
                                                    kAsync ? s_ring[warp] : nullptr);
  }
}

std::atomic<bool> g_decode_balanced{true};
std::atomic<bool> g_decode_async{true};
std::atomic<bool> g_last_decode_async{false};  // the last decode-kernel launch used the ring
std::atomic<int64_t> g_settings_generation{0};

// The decode kernels' grid: at most every resident CTA. Balanced (the default): as few warps as
// still take the tasks in the same number of rounds (ceil(tasks / resident warps)), so that every
// warp runs that many tasks and none of the last round's HBM stream is left to a fraction of the
// warps (at batch 1 with the shared expert folded, 9216 gate|up tasks over 2112 resident warps
// would leave 36 % of the warps a fifth task; balanced: 231 CTAs, 5 tasks each).
int64_t DecodeBlocks(int64_t tasks, int64_t resident_ctas) {
  const int64_t warps = std::max<int64_t>(1, resident_ctas * kDecWarps);
  int64_t want = tasks;
  if (g_decode_balanced.load(std::memory_order_relaxed)) {
    want = detail::CeilDiv(tasks, detail::CeilDiv(tasks, warps));
  }
  return std::max<int64_t>(1, std::min(detail::CeilDiv(want, kDecWarps), resident_ctas));
}

template <bool kFused, int kWT, bool kRoute, bool kAsync>
absl::Status LaunchDecodeKernel(const DecodeParams& p, int64_t max_slots,
                                const detail::DeviceInfo& info, cudaStream_t stream) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int64_t tasks = max_slots * detail::CeilDiv(p.n, kCols);
  const int per_sm =
      detail::CachedCtasPerSm(MoeDecodeKernel<kFused, kWT, kRoute, kAsync>, kDecWarps * 32, 0);
  const int64_t resident = int64_t{info.num_sms} * per_sm;
  const int64_t blocks = DecodeBlocks(tasks, resident);
  LaunchKernel(MoeDecodeKernel<kFused, kWT, kRoute, kAsync>, static_cast<unsigned>(blocks),
               kDecWarps * 32, 0, stream, p);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeDecodeKernel launch");
}

// The ring's kernel (3 CTAs per SM on an H200) wherever the device keeps at least as many of its
// CTAs resident per SM as of the register kernel's (2): its 32 KiB of shared memory per CTA must
// not cost occupancy; a device with too little shared memory per SM for that keeps the register
// kernel (both from cudaOccupancyMaxActiveBlocksPerMultiprocessor, cached per kernel).
template <bool kFused, int kWT, bool kRoute>
absl::Status LaunchDecode(const DecodeParams& p, int64_t max_slots, const detail::DeviceInfo& info,
                          cudaStream_t stream) {
  if (g_decode_async.load(std::memory_order_relaxed) &&
      detail::CachedCtasPerSm(MoeDecodeKernel<kFused, kWT, kRoute, true>, kDecWarps * 32, 0) >=
          detail::CachedCtasPerSm(MoeDecodeKernel<kFused, kWT, kRoute, false>, kDecWarps * 32, 0)) {
    g_last_decode_async.store(true);
    return LaunchDecodeKernel<kFused, kWT, kRoute, true>(p, max_slots, info, stream);
  }
  g_last_decode_async.store(false);
  return LaunchDecodeKernel<kFused, kWT, kRoute, false>(p, max_slots, info, stream);
}

// p.route.logits != nullptr (gate|up only): the kernel that routes for itself.
template <bool kFused>
absl::Status LaunchDecodeFor(int wt, const DecodeParams& p, int64_t max_slots,
                             const detail::DeviceInfo& info, cudaStream_t stream) {
  return DispatchWT(wt, [&](auto tag) {
    if constexpr (kFused) {
      if (p.route.logits != nullptr) {
        return LaunchDecode<true, decltype(tag)::value, true>(p, max_slots, info, stream);
      }
    }
    return LaunchDecode<kFused, decltype(tag)::value, false>(p, max_slots, info, stream);
  });
}

// ---- 2''+3''+4. one-launch decode: gate|up, down and the combine in one grid ------------------
//
// MoeDecodeOneKernel<kWT, kRoute> runs MoeDecodeKernel<gate|up>'s tasks, then
// MoeDecodeKernel<down>'s, then MoeCombineByPairKernel's sums, in one persistent grid, with
// dataflow counters instead of kernel boundaries: the HBM stream does not drain between the two
// weight passes (no tail of the first, no ramp of the second), and two launches are gone.
// - Every warp takes tasks gw, gw + W, ... of one list: the gate|up tasks (slot-major, as
//   MoeDecodeKernel<gate|up>), then the down tasks (slot-major).
// - A gate|up task is followed by the warp's fence and an arrival at done[slot].
// - A down task of slot s prefetches its first weight lines, then waits (lane 0 polls) until
//   done[0..s] count all of those slots' gate|up tasks, then fences (acquire) and reads act
//   (plain loads, cached in L1). A warp fences again only for a slot past the complete ones it
//   saw at its last fence (an acquire fence empties the SM's L1; one per down task measured
//   ~12 % slower than three launches). It is followed by an arrival at col[g] (its kDecWRows
//   output columns); the slot that arrives last sums those columns into out as
//   MoeCombineByPairKernel does (pairs in order, the same expression). So the bits are those of
//   the three launches.
// - A task's arrival is made once the warp's next task has issued its first weight loads, so the
//   fence before it overlaps their latency (which the warp waits for anyway); a measured version
//   with the fence between tasks (and an L2 prefetch of the next task's first lines to cover
//   it) was ~15 % slower than three launches.
// - The last warp to leave resets done[] and the exit counter, and each column group's last
//   arrival resets col[g]: the counters are zero again for the next launch (and graph replay).
// Progress never depends on co-residency: waits only point backwards in the task list, and a
// wait that lasts kOneLaunchHelpAfterNs (a grid not all resident, e.g. another kernel holding
// SMs, or a preempted context) stops waiting: the warp computes all of slot s's gate|up tasks
// itself (OneHelpGateUp) and goes on. Those are the same values by the same code, so a late
// original write stores identical bits; only time is lost. Normal waits are a fraction of one
// task (~15 us at GLM-5 widths), far below the limit (cuda_moe_progress_test runs the kernel on
// two free SMs).
// Determinism: every value is computed by the same code in a fixed order; the counters only
// order.
constexpr int kOneMaxSlots = kGemvMaxPairs;  // done[] entries (slots <= pairs <= 64)
constexpr unsigned long long kOneLaunchHelpAfterNs = 1000 * 1000;

// The int32 counters of one launch: done[kOneMaxSlots], exited, col[ceil(hidden / kDecWRows)].
constexpr int64_t OneLaunchCounters(int64_t hidden) {
  return kOneMaxSlots + 1 + (hidden + kDecWRows - 1) / kDecWRows;
}

struct OneParams {
  DecodeParams gu;       // gate|up: a = x, n = inter, k = hidden, c = act (+ route)
  DecodeParams dn;       // down: a = act, n = hidden, k = inter, c = y
  const float* weights;  // [pairs] combine weights (unused with gu.route.logits: routed here)
  float* out;            // [tokens, hidden], row stride out_ld: out += sum_j w * y
  int64_t out_ld;
  int32_t* counters;  // OneLaunchCounters(hidden) int32, zero between launches
};

__device__ __forceinline__ int LoadRelaxedGpu(const int32_t* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// fence.acq_rel.gpu: the writers' release before their arrivals and the readers' acquire after
// polling (fence-fence synchronization through the relaxed counter operations); lighter than
// __threadfence()'s sequentially consistent fence.
__device__ __forceinline__ void FenceAcqRelGpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Whether *c >= target now (lane 0's relaxed load; warp-uniform).
__device__ __forceinline__ bool Reached(const int32_t* c, int target, int lane) {
  const int v = lane == 0 ? LoadRelaxedGpu(c) : 0;
  return __shfl_sync(0xffffffffu, v, 0) >= target;
}

// Lane 0 polls *c (relaxed) until it is >= target: true, or false once kOneLaunchHelpAfterNs
// have passed without. Warp-uniform result; orders nothing by itself (the caller fences).
__device__ __forceinline__ bool PollAtLeast(const int32_t* c, int target, int lane) {
  bool ok = true;
  if (lane == 0 && LoadRelaxedGpu(c) < target) {
    const unsigned long long t0 = GlobalTimerNs();
    unsigned ns = 32;
    while (LoadRelaxedGpu(c) < target) {
      if (GlobalTimerNs() - t0 > kOneLaunchHelpAfterNs) {
        ok = false;
        break;
      }
      __nanosleep(ns);
      ns = ns < 512 ? ns * 2 : ns;
    }
  }
  return __shfl_sync(0xffffffffu, ok, 0);
}

// A wait that timed out: all gate|up tasks of `slot`, by this warp (a cold path; inlined, since
// a call would make the kernel save its live registers to local memory around it).
template <int kWT>
__device__ __forceinline__ void OneHelpGateUp(const DecodeParams& gu, const DecodeRouting& rt,
                                              int slot, int lane) {
  constexpr int kGuCols = kDecWRows / 2;
  for (int n0 = 0; n0 < gu.n; n0 += kGuCols) DecodeTask<true, kWT>(gu, rt, slot, n0, lane);
  __syncwarp();
}

// One arrival of the warp at *c after its stores (__syncwarp, release fence, relaxed atomic);
// returns the count before (unused by gate|up arrivals: the compiler then issues a reduction
// without a round trip).
__device__ __forceinline__ int ArriveAfterStores(int32_t* c, int lane) {
  __syncwarp();
  int old = 0;
  if (lane == 0) {
    FenceAcqRelGpu();
    old = atomicAdd(c, 1);
  }
  return __shfl_sync(0xffffffffu, old, 0);
}

template <int kWT, bool kRoute>
__global__ void __launch_bounds__(kDecWarps * 32, 2) MoeDecodeOneKernel(OneParams p) {
  PdlEnter();
  constexpr int kGuCols = kDecWRows / 2, kDnCols = kDecWRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * kDecWarps + warp;
  const int num_warps = gridDim.x * kDecWarps;
  const int32_t* ids = p.gu.ids;
  const float* wts = p.weights;
  if constexpr (kRoute) {
    __shared__ int32_t s_ids[kDecWarps][kGemvMaxPairs];
    __shared__ float s_w[kDecWarps][kGemvMaxPairs];
    DecodeRouteWarp(p.gu.route, p.gu.pairs, p.gu.top_k, warp, lane, s_ids[warp], s_w[warp]);
    ids = s_ids[warp];
    wts = s_w[warp];
  }
  int32_t* done = p.counters;
  int32_t* exited = p.counters + kOneMaxSlots;
  int32_t* col = exited + 1;
  const DecodeRouting rt = DecodeRoute(p.gu, ids, lane);
  const int gu_groups = (p.gu.n + kGuCols - 1) / kGuCols;
  const int dn_groups = (p.dn.n + kDnCols - 1) / kDnCols;
  const int gu_tasks = rt.n_active * gu_groups;
  const int tasks = gu_tasks + rt.n_active * dn_groups;
  const int hidden = p.dn.n, top_k = p.gu.top_k, tokens = p.gu.pairs / top_k;
  // The last slot of column group g: out[tok, n0 + q] += sum_j w * y over the pairs in order
  // (MoeCombineByPairKernel's loop), lane l -> (tok, q) = (l / kDnCols, l % kDnCols).
  auto combine = [&](int g) {
    FenceAcqRelGpu();  // acquire: the other slots' y of group g
    const int n0 = g * kDnCols;
    for (int v = lane; v < tokens * kDnCols; v += 32) {
      const int tok = v / kDnCols, c = n0 + v % kDnCols;
      if (c >= hidden) continue;
      float* o = p.out + tok * p.out_ld + c;
      float acc = *o;
      for (int j = 0; j < top_k; ++j) {
        const int64_t i = int64_t{tok} * top_k + j;
        const int e = ids[i];
        if (e >= 0 && e < p.gu.num_experts) acc += wts[i] * __ldcg(p.dn.c + i * hidden + c);
      }
      *o = acc;
    }
    if (lane == 0) col[g] = 0;  // every slot has arrived: free for the next launch
  };
  // The arrival the warp owes for its last task (warp-uniform), made once the next task's first
  // weight loads are issued (DecodeTask's after_issue; after the loop for the last task).
  // gate|up: done[owed]; down: col[owed - kOweDown], and when this slot arrived last there,
  // that group's combine, which runs after the next task (combine_g).
  constexpr int kOweDown = 1 << 24;
  int owed = -1, combine_g = -1;
  auto pay = [&] {
    if (owed < 0) return;
    if (owed < kOweDown) {
      ArriveAfterStores(done + owed, lane);
    } else if (ArriveAfterStores(col + owed - kOweDown, lane) == rt.n_active - 1) {
      combine_g = owed - kOweDown;
    }
    owed = -1;
  };
  auto combine_owed = [&] {
    if (combine_g >= 0) combine(combine_g);
    combine_g = -1;
  };
  // Slots 0..ready-1 are complete as of this warp's last acquire fence: their act may be read.
  // Every acquire fence empties the SM's L1 (where act is cached for the SM's warps), so a warp
  // fences once per run of complete slots instead of once per down task.
  int ready = 0;
  for (int t = gw; t < tasks; t += num_warps) {
    if (t < gu_tasks) {
      const int slot = t / gu_groups, n0 = (t - slot * gu_groups) * kGuCols;
      DecodeTask<true, kWT>(p.gu, rt, slot, n0, lane, pay);
      combine_owed();
      owed = slot;
      continue;
    }
    const int u = t - gu_tasks;
    const int slot = u / dn_groups, g = u - slot * dn_groups, n0 = g * kDnCols;
    if (slot >= ready) {
      // Slots ready..slot (waiting, or computing a slot whose wait timed out), then every
      // further slot already complete, then one acquire fence for all of them. The owed arrival
      // first (a wait must not hold one back), after prefetching this task's first lines.
      PrefetchTaskL2<false, kWT>(p.dn, rt, slot, n0, lane);
      pay();
      for (; ready <= slot; ++ready) {
        if (!PollAtLeast(done + ready, gu_groups, lane)) OneHelpGateUp<kWT>(p.gu, rt, ready, lane);
      }
      while (ready < rt.n_active && Reached(done + ready, gu_groups, lane)) ++ready;
      __syncwarp();
      FenceAcqRelGpu();
    }
    DecodeTask<false, kWT, true>(p.dn, rt, slot, n0, lane, pay);
    combine_owed();
    owed = kOweDown + g;
  }
  pay();
  combine_owed();
  // The last warp out resets done[] and the exit counter (no warp reads them any more).
  if (ArriveAfterStores(exited, lane) == num_warps - 1) {
    for (int i = lane; i < kOneMaxSlots; i += 32) done[i] = 0;
    __syncwarp();
    if (lane == 0) *exited = 0;
  }
}

template <int kWT, bool kRoute>
absl::Status LaunchOne(const OneParams& p, int64_t max_slots, const detail::DeviceInfo& info,
                       cudaStream_t stream) {
  const int64_t tasks =
      max_slots * (detail::CeilDiv(p.gu.n, kDecWRows / 2) + detail::CeilDiv(p.dn.n, kDecWRows));
  const int per_sm = detail::CachedCtasPerSm(MoeDecodeOneKernel<kWT, kRoute>, kDecWarps * 32, 0);
  const int64_t resident = int64_t{info.num_sms} * per_sm;
  const int64_t blocks = DecodeBlocks(tasks, resident);
  LaunchKernel(MoeDecodeOneKernel<kWT, kRoute>, static_cast<unsigned>(blocks), kDecWarps * 32, 0,
               stream, p);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeDecodeOneKernel launch");
}

absl::Status LaunchOneFor(int wt, const OneParams& p, int64_t max_slots,
                          const detail::DeviceInfo& info, cudaStream_t stream) {
  return DispatchWT(wt, [&](auto tag) {
    if (p.gu.route.logits != nullptr) {
      return LaunchOne<decltype(tag)::value, true>(p, max_slots, info, stream);
    }
    return LaunchOne<decltype(tag)::value, false>(p, max_slots, info, stream);
  });
}

// ---- 2'''./3'''. per-row listed decode: device token lists, a weight pass per token row -------
//
// Decode batches past the 64 pairs DecodeRoute holds in two registers per lane (batch 9..64 with
// top-8) would otherwise take the tiled GEMM, whose 64-row tiles are mostly padding at ~2 rows
// per expert. Instead:
// MoeListRouteKernel (one CTA): the distinct valid experts in ascending id order (slots), each
// slot's row range, and its rows = its pairs in ascending pair order (rank of pair i = number of
// pairs j < i with the same id: no atomics in the order, so the lists are deterministic; integer
// atomics only count). MoeDecodeListKernel<kFused, kWT, kNG>: MoeDecodeKernel's tasks (slot,
// column group) in slot-major order over the device's n_active slots, each streaming its
// kDecWRows weight rows once per kNG token rows with DecodePass (identical per-row arithmetic),
// act / y by pair; then MoeCombineByPairKernel. The grid is sized for min(experts, pairs) slots;
// warps past the device's task count exit. Static task order only.
struct DecodeLists {
  const int32_t* n_active;     // [1]
  const int32_t* slot_expert;  // [slots]
  const int32_t* slot_off;     // [slots + 1]: rows of slot s are slot_off[s] .. slot_off[s + 1]
  const int32_t* row_pair;     // [pairs]: pair of each row
  // Token groups (MoeGroupKernel): each slot's rows split into ceil(rows / group_tokens) units
  // of near-equal size (sizes differ by at most one), in slot order.
  const int32_t* n_units;      // [1]
  const int32_t* unit_expert;  // [units]
  const int32_t* unit_off;     // [units + 1]: rows of unit u are unit_off[u] .. unit_off[u + 1]
};

// Units of the token-group kernel for pairs and group_tokens: at most one partial unit per
// distinct expert.
inline int64_t MaxGroupUnits(int64_t pairs, int64_t max_slots, int group_tokens) {
  return max_slots + pairs / group_tokens;
}

// grid 1, block kRouteThreads (>= num_experts: one scan element per thread); pairs <=
// kMoeListedForceMaxPairs; group_tokens >= 1.
__global__ void __launch_bounds__(kRouteThreads)
    MoeListRouteKernel(const int32_t* ids, int pairs, int num_experts, int group_tokens,
                       int32_t* n_active, int32_t* slot_expert, int32_t* slot_off,
                       int32_t* row_pair, int32_t* n_units, int32_t* unit_expert,
                       int32_t* unit_off) {
  PdlEnter();
  __shared__ int s_ids[kMoeListedForceMaxPairs];
  __shared__ int cnt[kMaxExperts];
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  for (int e = tid; e < num_experts; e += kRouteThreads) cnt[e] = 0;
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = ids[i];
    s_ids[i] = e >= 0 && e < num_experts ? e : -1;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    if (s_ids[i] >= 0) atomicAdd(&cnt[s_ids[i]], 1);
  }
  __syncthreads();
  const int c = tid < num_experts ? cnt[tid] : 0;
  int total_rows, active;
  const int row0 = BlockExclusiveScan(c, warp_sums, &total_rows);
  const int slot = BlockExclusiveScan(c > 0 ? 1 : 0, warp_sums, &active);
  const int g = (c + group_tokens - 1) / group_tokens;  // this expert's units
  int units;
  const int unit0 = BlockExclusiveScan(g, warp_sums, &units);
  if (tid < num_experts) {
    cnt[tid] = row0;  // only thread tid reads cnt[tid] above
    if (c > 0) slot_expert[slot] = tid, slot_off[slot] = row0;
    for (int j = 0; j < g; ++j) {
      unit_expert[unit0 + j] = tid;
      unit_off[unit0 + j] = row0 + j * c / g;
    }
  }
  if (tid == 0) {
    *n_active = active, slot_off[active] = total_rows;
    *n_units = units, unit_off[units] = total_rows;
  }
  __syncthreads();
  for (int i = tid; i < pairs; i += kRouteThreads) {
    const int e = s_ids[i];
    if (e < 0) continue;
    int rank = 0;
    for (int j = 0; j < i; ++j) rank += s_ids[j] == e;
    row_pair[cnt[e] + rank] = i;
  }
}

template <bool kFused, int kWT, int kNG>
__global__ void __launch_bounds__(kDecWarps * 32, 2)
    MoeDecodeListKernel(DecodeParams p, DecodeLists l) {
  PdlEnter();
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int lane = threadIdx.x & 31;
  const int gw = blockIdx.x * kDecWarps + (threadIdx.x >> 5);
  const int num_warps = gridDim.x * kDecWarps;
  const int groups = (p.n + kCols - 1) / kCols;
  const int tasks = *l.n_active * groups;
  for (int t = gw; t < tasks; t += num_warps) {
    const int slot = t / groups, n0 = (t - slot * groups) * kCols;
    const int e = l.slot_expert[slot];
    const int r0 = l.slot_off[slot], r1 = l.slot_off[slot + 1];
    const char *w0, *w1;
    int64_t ld0, ld1;
    const float *s0 = nullptr, *s1 = nullptr;
    TaskWeights<kFused, kWT>(p.experts[e], n0, w0, ld0, w1, ld1, s0, s1);
    for (int rb = r0; rb < r1; rb += kNG) {
      const int ng = min(kNG, r1 - rb);  // rows >= ng repeat row rb (computed, dropped)
      int pair_of[kNG];
      const float* a_rows[kNG];
#pragma unroll
      for (int q = 0; q < kNG; ++q) {
        pair_of[q] = l.row_pair[q < ng ? rb + q : rb];
        const int64_t a_row = kFused ? pair_of[q] / p.top_k : pair_of[q];
        a_rows[q] = p.a + a_row * p.a_ld;
      }
      if constexpr (kNG == 1) {
        DecodePass<kFused, kWT, 1>(p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane);
      } else {
        if (ng == 1) {
          DecodePass<kFused, kWT, 1>(p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane);
        } else {
          DecodePass<kFused, kWT, 2>(p, w0, ld0, w1, ld1, s0, s1, a_rows, pair_of, ng, n0, lane);
        }
      }
    }
  }
}

// Token rows per pass: fp8 1 (2 CTAs per SM, a task's weight rows re-read per token row, mostly
// from L2: see the measurements under "tried" in cuda_ops_moe.h), bf16 / fp32 2.
template <bool kFused, int kWT, int kNG>
absl::Status LaunchList(const DecodeParams& p, const DecodeLists& l, int64_t max_slots,
                        const detail::DeviceInfo& info, cudaStream_t stream) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int64_t tasks = max_slots * detail::CeilDiv(p.n, kCols);
  const int per_sm =
      detail::CachedCtasPerSm(MoeDecodeListKernel<kFused, kWT, kNG>, kDecWarps * 32, 0);
  const int64_t resident = int64_t{info.num_sms} * per_sm;
  const int64_t blocks = std::max<int64_t>(1, std::min(detail::CeilDiv(tasks, kDecWarps), resident));
  LaunchKernel(MoeDecodeListKernel<kFused, kWT, kNG>, static_cast<unsigned>(blocks), kDecWarps * 32,
               0, stream, p, l);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeDecodeListKernel launch");
}

template <bool kFused>
absl::Status LaunchListFor(int wt, const DecodeParams& p, const DecodeLists& l, int64_t max_slots,
                           const detail::DeviceInfo& info, cudaStream_t stream) {
  return DispatchWT(wt, [&](auto tag) {
    constexpr int kWT = decltype(tag)::value;
    return LaunchList<kFused, kWT, kWT == kWFP8 ? 1 : 2>(p, l, max_slots, info, stream);
  });
}

// ---- 2''''./3''''. listed decode by token groups: each weight chunk read once per unit ----
//
// MoeGroupKernel<kFused, kWT> (the default for kMoeDecodeMaxPairs < pairs <= kMoeListedMaxPairs,
// forced at any size <= kMoeListedForceMaxPairs; MoeListRouteKernel's lists). MoeDecodeListKernel
// re-streams a task's weight rows once per token row (fp8; bf16 per two), so an expert with T
// rows costs T passes over its weights (from L2 when they are still there; at batch 64 the
// warps' working set is about the L2's size) and T times the widening. Here a task is (unit,
// column group): a unit is up to group_tokens (<= kGroupMaxTokens) rows of one expert (a slot's
// rows split into near-equal units, so a hot expert's rows spread over several warps that read
// the same weight rows at about the same time: one HBM read, the rest L2 hits), and the task
// streams its kDecWRows weight rows once: each 4-value piece is widened once (fp8: times the
// row block's scale, the CPU's dequantized value) and applied to all of the unit's token rows
// (acc[token row][weight row] in registers; the unit's row count picks a 1 / 2 / 4-row
// instantiation, rows past the count skipped warp-uniformly). Weight chunks come through a
// per-warp cp.async ring in shared memory, kGrpStages deep: lane l copies chunk l + 32 i of each
// row into its own 16-byte slots and reads back only those, so the ring needs no barrier, only
// cp.async.wait_group; the ring runs across task boundaries (the next task's first chunks are
// in flight during the current task's last ones and its epilogue). x / act rows come through L1
// (__ldg; neighbouring warps usually share the unit). Epilogue: DecodeEpilogue (act / y by
// pair), then MoeCombineByPairKernel. fp32 accumulation in a fixed order, no atomics.
// Shared memory: kGrpStages x kDecWRows x 512 bytes = 8 KiB per warp; CTAs of up to kGrpWarps
// warps (fewer where the device's per-block shared memory is short), grid from the occupancy
// with that shared memory and the SM count.
constexpr int kGrpWarps = 8;
constexpr int kGrpStages = 4;
constexpr int kGroupMaxTokens = 4;
constexpr int64_t kGrpWarpSmem = int64_t{kGrpStages} * kDecWRows * 32 * 16;

// Piece j (values 4j..4j+3) of a 16-byte weight chunk, widened (fp8: unscaled).
template <int kWT>
__device__ __forceinline__ float4 WidenPiece(const uint4& q, int j) {
  if constexpr (kWT == kWF32) {
    return make_float4(__uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z),
                       __uint_as_float(q.w));
  } else if constexpr (kWT == kWBF16) {
    const unsigned lo_w = j == 0 ? q.x : q.z, hi_w = j == 0 ? q.y : q.w;
    __nv_bfloat162 lo, hi;
    memcpy(&lo, &lo_w, 4);
    memcpy(&hi, &hi_w, 4);
    const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
    return make_float4(a.x, a.y, b.x, b.y);
  } else {
    __nv_fp8x4_e4m3 h;
    h.__x = kernels::detail::Word4(q, j);
    return static_cast<float4>(h);
  }
}

// acc[r][m] += x . w[m] over one piece for the token rows r < ng (warp-uniform); fp8: the piece's
// 4-term dot times the row's block scale (sc0: rows m < kDecWRows / 2, sc1: the others), so a
// row's arithmetic is the same whatever the other rows of its unit.
template <int kWT, int kNG>
__device__ __forceinline__ void PieceFma(const float* a, const int (&a_off)[kNG], int k, int ng,
                                         const float4 (&wv)[kDecWRows], float sc0, float sc1,
                                         float (&acc)[kNG][kDecWRows]) {
#pragma unroll
  for (int r = 0; r < kNG; ++r) {
    if (r < ng) {  // warp-uniform
      const float4 xv = __ldg(reinterpret_cast<const float4*>(a + a_off[r] + k));
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) {
        if constexpr (kWT == kWFP8) {
          float d = xv.x * wv[m].x;
          d = fmaf(xv.y, wv[m].y, d);
          d = fmaf(xv.z, wv[m].z, d);
          d = fmaf(xv.w, wv[m].w, d);
          acc[r][m] = fmaf(d, m < kDecWRows / 2 ? sc0 : sc1, acc[r][m]);
        } else {
          float v = acc[r][m];
          v = fmaf(xv.x, wv[m].x, v);
          v = fmaf(xv.y, wv[m].y, v);
          v = fmaf(xv.z, wv[m].z, v);
          acc[r][m] = fmaf(xv.w, wv[m].w, v);
        }
      }
    }
  }
}

// The producer side of a warp's ring: the next item to copy (task t, chunk iteration i, ring
// slot) and task t's weight rows.
struct GroupRing {
  int t, i, slot;
  const char* wr[kDecWRows];
};

// The work of one warp: tasks gw, gw + W, ... of `tasks`; each task iters chunk iterations.
struct GroupWork {
  int tasks, groups, iters, nchunks, num_warps, lane;
  uint4* ring;  // this warp's ring, offset by lane: slot (s, m) at ring[(s * kDecWRows + m) * 32]
};

// Copies the next item's chunks (if any; an empty group otherwise, so counts stay uniform).
template <bool kFused, int kWT>
__device__ __forceinline__ void GroupIssue(const DecodeParams& p, const DecodeLists& l,
                                           const GroupWork& w, GroupRing& g) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  if (g.t < w.tasks) {
    if (g.i == 0) {
      const int u = g.t / w.groups, n0 = (g.t - u * w.groups) * kCols;
      const char *w0, *w1;
      int64_t ld0, ld1;
      const float *s0 = nullptr, *s1 = nullptr;
      TaskWeights<kFused, kWT>(p.experts[l.unit_expert[u]], n0, w0, ld0, w1, ld1, s0, s1);
      TaskRows<kFused>(p.n, w0, ld0, w1, ld1, n0, g.wr);
    }
    const int c = w.lane + 32 * g.i;
    if (c < w.nchunks) {
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) {
        AsyncCopy16(
            static_cast<unsigned>(__cvta_generic_to_shared(w.ring + (g.slot * kDecWRows + m) * 32)),
            g.wr[m] + int64_t{c} * 16);
      }
    }
    if (++g.i == w.iters) g.i = 0, g.t += w.num_warps;
  }
  AsyncCommit();
  g.slot = g.slot + 1 == kGrpStages ? 0 : g.slot + 1;
}

// Task t (unit t / groups) for up to kNG token rows: consumes its iters ring items (slot:
// the consumer's ring slot), issuing the item kGrpStages - 1 ahead before each.
template <bool kFused, int kWT, int kNG>
__device__ __forceinline__ void GroupTask(const DecodeParams& p, const DecodeLists& l,
                                          const GroupWork& w, GroupRing& g, int& slot, int t) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  constexpr int kV = 16 / ElemBytes(kWT);
  constexpr int kPieces = kV / 4;
  const int lane = w.lane;
  const int u = t / w.groups, n0 = (t - u * w.groups) * kCols;
  const int r0 = l.unit_off[u], ng = l.unit_off[u + 1] - r0;  // 1..kNG
  const float *s0 = nullptr, *s1 = nullptr;
  if constexpr (kWT == kWFP8) {
    const char *w0, *w1;
    int64_t ld0, ld1;
    TaskWeights<kFused, kWT>(p.experts[l.unit_expert[u]], n0, w0, ld0, w1, ld1, s0, s1);
  }
  const int my_pair = lane < ng ? l.row_pair[r0 + lane] : 0;
  // Element offsets of the token rows in p.a (< 2^31: host-checked).
  int a_off[kNG];
#pragma unroll
  for (int r = 0; r < kNG; ++r) {
    const int pair = __shfl_sync(0xffffffffu, my_pair, r < ng ? r : 0);
    a_off[r] = (kFused ? pair / p.top_k : pair) * static_cast<int>(p.a_ld);
  }
  float acc[kNG][kDecWRows];
#pragma unroll
  for (int r = 0; r < kNG; ++r)
#pragma unroll
    for (int m = 0; m < kDecWRows; ++m) acc[r][m] = 0.f;

  for (int i = 0; i < w.iters; ++i) {
    GroupIssue<kFused, kWT>(p, l, w, g);
    AsyncWait<kGrpStages - 1>();  // this lane's copies of item i have landed
    const int c = lane + 32 * i;
    if (c < w.nchunks) {
      uint4 raw[kDecWRows];
#pragma unroll
      for (int m = 0; m < kDecWRows; ++m) raw[m] = w.ring[(slot * kDecWRows + m) * 32];
      float sc0 = 1.f, sc1 = 1.f;
      if constexpr (kWT == kWFP8) {
        sc0 = __ldg(s0 + ((c * kV) >> 7));
        sc1 = __ldg(s1 + ((c * kV) >> 7));
      }
      // All pieces unrolled (loads in flight together; no spills at 4 token rows).
#pragma unroll
      for (int j = 0; j < kPieces; ++j) {
        float4 wv[kDecWRows];
#pragma unroll
        for (int m = 0; m < kDecWRows; ++m) wv[m] = WidenPiece<kWT>(raw[m], j);
        PieceFma<kWT, kNG>(p.a, a_off, c * kV + 4 * j, ng, wv, sc0, sc1, acc);
      }
    }
    slot = slot + 1 == kGrpStages ? 0 : slot + 1;
  }
  int pair_of[kNG];
#pragma unroll
  for (int r = 0; r < kNG; ++r) pair_of[r] = __shfl_sync(0xffffffffu, my_pair, r < ng ? r : 0);
  DecodeEpilogue<kFused, kNG>(p, acc, pair_of, ng, n0, lane);
}

// grid: persistent (see LaunchGroup); block: up to kGrpWarps warps; dynamic smem warps x
// kGrpWarpSmem.
// 2 CTAs per SM (128 registers; see "tried" in cuda_ops_moe.h for 1).
template <bool kFused, int kWT>
__global__ void __launch_bounds__(kGrpWarps * 32, 2) MoeGroupKernel(DecodeParams p, DecodeLists l) {
  PdlEnter();
  extern __shared__ __align__(16) uint4 grp_ring[];
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
  GroupWork w;
  w.lane = threadIdx.x & 31;
  w.ring = grp_ring + warp * (kGrpStages * kDecWRows * 32) + w.lane;
  w.num_warps = gridDim.x * warps;
  w.groups = (p.n + kCols - 1) / kCols;
  w.tasks = *l.n_units * w.groups;
  w.nchunks = p.k / (16 / ElemBytes(kWT));
  w.iters = (w.nchunks + 31) / 32;
  const int gw = blockIdx.x * warps + warp;
  GroupRing g;
  g.t = gw, g.i = 0, g.slot = 0;
#pragma unroll
  for (int s = 0; s < kGrpStages - 1; ++s) GroupIssue<kFused, kWT>(p, l, w, g);
  int slot = 0;
  for (int t = gw; t < w.tasks; t += w.num_warps) {
    const int u = t / w.groups;
    const int ng = l.unit_off[u + 1] - l.unit_off[u];
    static_assert(kGroupMaxTokens == 4, "the dispatch below");
    if (ng <= 1) {
      GroupTask<kFused, kWT, 1>(p, l, w, g, slot, t);
    } else if (ng == 2) {
      GroupTask<kFused, kWT, 2>(p, l, w, g, slot, t);
    } else {
      GroupTask<kFused, kWT, 4>(p, l, w, g, slot, t);
    }
  }
  AsyncWait<0>();
}

template <bool kFused>
absl::Status LaunchGroupFor(int wt, const DecodeParams& p, const DecodeLists& l,
                            int64_t max_units, const detail::DeviceInfo& info,
                            cudaStream_t stream) {
  constexpr int kCols = kFused ? kDecWRows / 2 : kDecWRows;
  const int warps = static_cast<int>(std::min<int64_t>(kGrpWarps, info.smem_optin / kGrpWarpSmem));
  if (warps < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda MoeExperts: the token-group kernel needs ", kGrpWarpSmem, " bytes of shared memory "
        "per block, the device allows ", info.smem_optin, " (use MoeDecodePath::kTiled)"));
  }
  const int64_t smem = warps * kGrpWarpSmem;
  return DispatchWT(wt, [&](auto tag) {
    constexpr int kWT = decltype(tag)::value;
    GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(MoeGroupKernel<kFused, kWT>, smem, info, kOp));
    const int per_sm = detail::CachedCtasPerSm(MoeGroupKernel<kFused, kWT>, warps * 32, smem);
    const int64_t tasks = max_units * detail::CeilDiv(p.n, kCols);
    const int64_t blocks = std::max<int64_t>(
        1, std::min(detail::CeilDiv(tasks, warps), int64_t{info.num_sms} * per_sm));
    LaunchKernel(MoeGroupKernel<kFused, kWT>, static_cast<unsigned>(blocks), warps * 32,
                 static_cast<size_t>(smem), stream, p, l);
    return detail::CudaCheck(cudaGetLastError(), kOp, "MoeGroupKernel launch");
  });
}

// ---- 2'''''./3'''''. fp8 experts on tensor cores: MoeMmaKernel ---------------------------------
//
// MoeGroupKernel is instruction-issue bound on fp8 (widening e4m3 to fp32 costs ~1.5
// instructions per value, plus one FMA per value per token row, activations being fp32). Here
// the products run on the tensor cores: mma.sync.m16n8k16 f16 x f16 -> fp32, weights as the A
// operand (M = 16 expert output rows per tile), token rows as N (8 per n-tile; columns past the
// slot's rows are zero and not stored), K walked in 64-wide chunks inside 128-wide K blocks (the
// fp8 scale blocks).
// - Weights: every finite e4m3 value is exact in f16 (max 448, smallest subnormal 2^-9; f16
//   reaches 65504 and 2^-24), converted by cvt.rn.f16x2.e4m3x2 (one instruction per 2 values).
// - Activations: MoeSplitKernel writes each fp32 row as three f16 terms per 128-wide K block
//   with a power-of-two scale: x * 2^s = hi + mid + lo, s chosen so the block's max |x| * 2^s
//   lies in [2^14, 2^15). hi / mid / lo carry 11 bits each, so the three add back to x * 2^s to
//   33 bits relative, with an absolute floor of 2^-25 (f16 subnormals): within 2^-39 of the
//   block's max |x| (better than the 2^-24 of fp32 itself). The products of f16 terms with
//   e4m3 values (4 + 11 bits) are exact in fp32.
// - Sums: per k16 step and tile, the three terms' mmas chain from zero (lo, mid, hi) and the
//   result is added in fp32 (round-to-nearest) into the K block's accumulator; at the end of a
//   K block the block sum times (weight block scale x 2^-s of the token's K block) is added
//   (FMA) into the running sum, as the grouped kernel scales each partial. Fixed order, no
//   atomics: deterministic, graph replay = eager. A column's result does not depend on the
//   other columns of its n-tile (the mma sums each output independently).
// - Fragments straight from global memory (as kernels/gemm_fp8_block.cuh): thread (g = lane / 4,
//   q = lane % 4) loads bytes [16q, 16q + 16) of a 64-wide chunk of weight rows g and g + 8
//   (16-byte streaming loads; a row's 4 threads read 64 contiguous bytes), and f16 values
//   [16q, 16q + 16) of each term of token column g; k16 step j uses bytes 4j..4j+3 of each
//   thread's 16 on both operands, so the mma's k order is permuted, not the sum's terms. The
//   next chunk's weight loads are issued before the current one is used.
// Task = (slot, column group): fused 16 gate + 16 up rows (16 act columns), down 32 rows (two
// m-tiles); slots from MoeListRouteKernel, a slot's rows 8 at a time (an expert with more than
// 8 rows re-reads its weights per n-tile, mostly from L2). Persistent grid sized from the SM
// count and the occupancy; no shared memory. Limits: fp8 weights with gemv_ok (k % 16 == 0,
// 16-byte aligned rows); K past k loads zeros (weights) and the split pads with zeros.
constexpr int kMmaWarps = 8;
constexpr int kMmaKB = 128;                // K block (= the fp8 scale block)
constexpr int kMmaSplitRow = 3 * kMmaKB;   // f16 values per K block of a split row
constexpr int kMmaChunk = 64;              // k per fragment load

// grid (rows, kblocks), block kMmaKB. dst [rows, kblocks, 3, kMmaKB] f16 (hi, mid, lo), inv
// [rows, kblocks] = 2^-s; values past k are zero.
__global__ void __launch_bounds__(kMmaKB)
    MoeSplitKernel(const float* src, int64_t ld, int k, int kblocks, __half* dst, float* inv) {
  PdlEnter();
  __shared__ float wmax[kMmaKB / 32];
  const int row = blockIdx.x, b = blockIdx.y, i = threadIdx.x;
  const int kk = b * kMmaKB + i;
  const float v = kk < k ? src[int64_t{row} * ld + kk] : 0.f;
  float m = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((i & 31) == 0) wmax[i >> 5] = m;
  __syncthreads();
  m = fmaxf(fmaxf(wmax[0], wmax[1]), fmaxf(wmax[2], wmax[3]));
  int shift = 0;  // NaN / inf blocks: unscaled (they stay NaN / inf)
  if (m > 0.f && m <= 3.4028235e38f) {
    int e;
    frexpf(m, &e);  // m in [2^(e-1), 2^e)
    shift = min(15 - e, 100);
  }
  const float xs = ldexpf(v, shift);
  const __half hi = __float2half_rn(xs);
  const float r1 = xs - __half2float(hi);  // exact
  const __half mid = __float2half_rn(r1);
  const __half lo = __float2half_rn(r1 - __half2float(mid));  // the difference is exact
  __half* d = dst + (int64_t{row} * kblocks + b) * kMmaSplitRow;
  d[i] = hi;
  d[kMmaKB + i] = mid;
  d[2 * kMmaKB + i] = lo;
  if (i == 0) inv[int64_t{row} * kblocks + b] = ldexpf(1.f, -shift);
}

struct MmaParams {
  const ExpertPtr* experts;
  const __half* bsplit;  // split rows: fused x [tokens, ...], down act [pairs, ...]
  const float* binv;     // [rows, kblocks]
  int kblocks, n, k, top_k;
  float* c;  // [pairs, n]
};

__device__ __forceinline__ uint32_t E4m3x2ToF16x2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment of k16 step j from the 16-byte chunks of rows g (r0) and g + 8 (r8).
__device__ __forceinline__ void MmaAFrag(const uint4& r0, const uint4& r8, int j,
                                         uint32_t (&a)[4]) {
  const uint32_t w0 = kernels::detail::Word4(r0, j), w8 = kernels::detail::Word4(r8, j);
  a[0] = E4m3x2ToF16x2(w0);
  a[1] = E4m3x2ToF16x2(w8);
  a[2] = E4m3x2ToF16x2(w0 >> 16);
  a[3] = E4m3x2ToF16x2(w8 >> 16);
}

template <bool kFused>
__global__ void __launch_bounds__(kMmaWarps * 32, 2) MoeMmaKernel(MmaParams p, DecodeLists l) {
  PdlEnter();
  constexpr int kCols = kFused ? 16 : 32;  // output columns per task
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int gw = blockIdx.x * kMmaWarps + (threadIdx.x >> 5);
  const int num_warps = gridDim.x * kMmaWarps;
  const int groups = (p.n + kCols - 1) / kCols;
  const int tasks = *l.n_active * groups;
  const int nchunks = (p.k + kMmaChunk - 1) / kMmaChunk;
  const int64_t brow_halves = int64_t{p.kblocks} * kMmaSplitRow;
  for (int t = gw; t < tasks; t += num_warps) {
    const int slot = t / groups, n0 = (t - slot * groups) * kCols;
    const ExpertPtr& ex = p.experts[l.slot_expert[slot]];
    // This thread's weight rows: tile 0 rows g, g + 8, tile 1 rows g, g + 8 (fused: gate / up
    // rows n0..; down: rows n0.. / n0 + 16..); rows past n read row n0 and are not stored.
    const char* wr[4];
    const float* srow[2];
    {
      const char* base[2];
      int64_t ld[2];
      int row0[2];
      if constexpr (kFused) {
        base[0] = static_cast<const char*>(ex.gate), ld[0] = ex.gate_ld, row0[0] = n0;
        base[1] = static_cast<const char*>(ex.up), ld[1] = ex.up_ld, row0[1] = n0;
        srow[0] = ex.gate_s + (n0 >> 7) * ex.gate_sld;
        srow[1] = ex.up_s + (n0 >> 7) * ex.up_sld;
      } else {
        base[0] = base[1] = static_cast<const char*>(ex.down);
        ld[0] = ld[1] = ex.down_ld;
        row0[0] = n0, row0[1] = n0 + 16;
        srow[0] = srow[1] = ex.down_s + (n0 >> 7) * ex.down_sld;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row0[h] + g + 8 * r;
          wr[2 * h + r] = base[h] + int64_t{row < p.n ? row : n0} * ld[h];
        }
      }
    }
    const int r0 = l.slot_off[slot], r1 = l.slot_off[slot + 1];
    for (int nb = r0; nb < r1; nb += 8) {
      const int ng = min(8, r1 - nb);
      // B: token column g; C: columns 2q, 2q + 1.
      const int pg = g < ng ? l.row_pair[nb + g] : -1;
      const uint4* bp = nullptr;
      if (pg >= 0) {
        const int64_t brow = kFused ? pg / p.top_k : pg;
        bp = reinterpret_cast<const uint4*>(p.bsplit + brow * brow_halves) + 2 * q;
      }
      int pc[2];
      const float* inv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 2 * q + h;
        pc[h] = col < ng ? l.row_pair[nb + col] : -1;
        inv[h] = pc[h] < 0 ? nullptr
                           : p.binv + int64_t{kFused ? pc[h] / p.top_k : pc[h]} * p.kblocks;
      }
      float acc[2][4], blk[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[h][i] = 0.f, blk[h][i] = 0.f;
      uint4 wc[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        wc[m] = 16 * q < p.k ? LoadStreaming16(wr[m] + 16 * q) : make_uint4(0, 0, 0, 0);
      }
      for (int c = 0; c < nchunks; ++c) {
        uint4 wn[4];
        const int kn = (c + 1) * kMmaChunk + 16 * q;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          wn[m] = kn < p.k ? LoadStreaming16(wr[m] + kn) : make_uint4(0, 0, 0, 0);
        }
        const int kb = c >> 1, half = c & 1;
        // B: 16 f16 of each term, in two halves of 8 (k16 steps 0-1, 2-3).
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          uint4 bt[3];
#pragma unroll
          for (int s = 0; s < 3; ++s) {
            bt[s] = bp != nullptr
                        ? __ldg(bp + (kb * kMmaSplitRow + s * kMmaKB + half * kMmaChunk) / 8 + jj)
                        : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int j2 = 0; j2 < 2; ++j2) {
            const int j = 2 * jj + j2;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              uint32_t a[4];
              MmaAFrag(wc[2 * h], wc[2 * h + 1], j, a);
              float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
              for (int s = 2; s >= 0; --s) {  // lo, mid, hi
                MmaF16(d, a, kernels::detail::Word4(bt[s], 2 * j2),
                       kernels::detail::Word4(bt[s], 2 * j2 + 1));
              }
#pragma unroll
              for (int i = 0; i < 4; ++i) blk[h][i] += d[i];
            }
          }
        }
        if (half == 1 || c + 1 == nchunks) {
          const float i0 = inv[0] != nullptr ? __ldg(inv[0] + kb) : 0.f;
          const float i1 = inv[1] != nullptr ? __ldg(inv[1] + kb) : 0.f;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float ws = __ldg(srow[h] + kb);
            const float s0 = ws * i0, s1 = ws * i1;
            acc[h][0] = fmaf(blk[h][0], s0, acc[h][0]);
            acc[h][1] = fmaf(blk[h][1], s1, acc[h][1]);
            acc[h][2] = fmaf(blk[h][2], s0, acc[h][2]);
            acc[h][3] = fmaf(blk[h][3], s1, acc[h][3]);
#pragma unroll
            for (int i = 0; i < 4; ++i) blk[h][i] = 0.f;
          }
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) wc[m] = wn[m];
      }
      // C element i of tile h: row g + 8 (i / 2), column 2q + i % 2.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int pair = pc[i & 1];
        if (pair < 0) continue;
        float* crow = p.c + int64_t{pair} * p.n;
        const int row = n0 + g + 8 * (i >> 1);
        if constexpr (kFused) {
          if (row < p.n) {
            const float gv = acc[0][i], uv = acc[1][i];
            crow[row] = gv / (1.0f + expf(-gv)) * uv;
          }
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (row + 16 * h < p.n) crow[row + 16 * h] = acc[h][i];
          }
        }
      }
    }
  }
}

// Splits `rows` rows of src (k wide) into dst / inv, then runs MoeMmaKernel<kFused> over the
// slots (grid from the SM count and the kernel's occupancy).
template <bool kFused>
absl::Status LaunchMma(const MmaParams& p, const float* src, int64_t src_ld, int64_t rows,
                       const DecodeLists& l, int64_t max_slots, const detail::DeviceInfo& info,
                       cudaStream_t stream) {
  LaunchKernel(MoeSplitKernel, dim3(static_cast<unsigned>(rows), static_cast<unsigned>(p.kblocks)),
               kMmaKB, 0, stream, src, src_ld, p.k, p.kblocks, const_cast<__half*>(p.bsplit),
               const_cast<float*>(p.binv));
  GLM_RETURN_IF_ERROR(detail::CudaCheck(cudaGetLastError(), kOp, "MoeSplitKernel launch"));
  constexpr int kCols = kFused ? 16 : 32;
  const int64_t tasks = max_slots * detail::CeilDiv(p.n, kCols);
  const int per_sm = detail::CachedCtasPerSm(MoeMmaKernel<kFused>, kMmaWarps * 32, 0);
  const int64_t blocks = std::max<int64_t>(
      1, std::min(detail::CeilDiv(tasks, kMmaWarps), int64_t{info.num_sms} * per_sm));
  LaunchKernel(MoeMmaKernel<kFused>, static_cast<unsigned>(blocks), kMmaWarps * 32, 0, stream, p,
               l);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeMmaKernel launch");
}

// out[t] += sum_j w[t, j] * y[t * top_k + j] over the valid ids, j in order (deterministic).
// grid (tokens, ceil(hidden / kCombineThreads)).
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineByPairKernel(const float* y, const int32_t* ids, const float* weights, int top_k,
                           int num_experts, int hidden, float* out, int64_t out_ld) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int col = blockIdx.y * kCombineThreads + threadIdx.x;
  if (col >= hidden) return;
  float* o = out + t * out_ld + col;
  float acc = *o;
  for (int j = 0; j < top_k; ++j) {
    const int64_t i = t * top_k + j;
    const int e = ids[i];
    if (e >= 0 && e < num_experts) acc += weights[i] * y[i * hidden + col];
  }
  *o = acc;
}

// ---- 4. combine ------------------------------------------------------------------------------

// grid (tokens, ceil(hidden / kCombineThreads)).
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* y, const int32_t* pair_row, const float* weights, int top_k,
                     int hidden, float* out, int64_t out_ld) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int col = blockIdx.y * kCombineThreads + threadIdx.x;
  if (col >= hidden) return;
  float* o = out + t * out_ld + col;
  float acc = *o;
  for (int j = 0; j < top_k; ++j) {
    const int row = pair_row[t * top_k + j];
    if (row >= 0) acc += weights[t * top_k + j] * y[int64_t{row} * hidden + col];
  }
  *o = acc;
}

// ---- expert table cache ----------------------------------------------------------------------

struct TableEntry {
  std::vector<ExpertPtr> host;
  ExpertPtr* device = nullptr;
  int64_t inter = 0, hidden = 0;
  int wt = kWF32;  // weight dtype of every expert
  bool gemv_ok = false;  // MoeGemvKernel's limits hold (16-byte rows, k % values per chunk)
  // MoeDecodeOneKernel's counters for this layer (OneLaunchCounters(hidden), zeroed once; each
  // launch leaves them zero). One per layer: a layer's MoE runs on one stream at a time.
  int32_t* counters = nullptr;
  int64_t num_counters = 0;
};

absl::StatusOr<const TableEntry*> ExpertTable(const ExpertWeights& w, cudaStream_t stream) {
  static std::mutex* mu = new std::mutex;
  // Never destroyed: device memory outlives static destruction order concerns.
  static auto* cache = new std::map<std::tuple<int, const MatView*, int32_t>, TableEntry>;
  int device = 0;
  GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetDevice(&device));
  std::vector<ExpertPtr> host(w.num_experts);
  const int64_t inter = w.gate[0].rows, hidden = w.gate[0].cols;
  for (int32_t e = 0; e < w.num_experts; ++e) {
    const MatView &g = w.gate[e], &u = w.up[e], &d = w.down[e];
    host[e] = {g.data,   u.data,   d.data,   g.ld,       u.ld,       d.ld,
               g.scales, u.scales, d.scales, g.scale_ld, u.scale_ld, d.scale_ld};
  }
  const WeightDType dtype = w.gate[0].dtype;
  std::lock_guard<std::mutex> lock(*mu);
  TableEntry& entry = (*cache)[{device, w.gate, w.num_experts}];
  if (entry.device != nullptr && entry.host.size() == host.size() &&
      std::memcmp(entry.host.data(), host.data(), host.size() * sizeof(ExpertPtr)) == 0) {
    return &entry;
  }
  for (int32_t e = 0; e < w.num_experts; ++e) {
    const MatView &g = w.gate[e], &u = w.up[e], &d = w.down[e];
    if (g.rows != inter || u.rows != inter || g.cols != hidden || u.cols != hidden ||
        d.rows != hidden || d.cols != inter) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda MoeExperts: expert ", e, " has gate [", g.rows, ", ", g.cols, "], up [", u.rows,
          ", ", u.cols, "], down [", d.rows, ", ", d.cols, "]; expert 0 has moe_inter ", inter,
          " and hidden ", hidden, " (all experts must have the same shapes)"));
    }
    for (const MatView* m : {&g, &u, &d}) {
      if (m->dtype != dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cuda MoeExperts: expert ", e, " weights mix dtypes; all experts of a layer must be "
            "stored alike (fp32, bf16 or fp8)"));
      }
      const uintptr_t align = dtype == WeightDType::kF32 ? 16 : dtype == WeightDType::kBF16 ? 8 : 4;
      if ((reinterpret_cast<uintptr_t>(m->data) & (align - 1)) != 0 || m->ld % 4 != 0 ||
          (dtype == WeightDType::kF8E4M3Block128 &&
           (m->scales == nullptr || m->scale_ld < (m->cols + 127) / 128))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cuda MoeExperts: expert ", e, " weights must be ", align, "-byte aligned with row "
            "strides that are multiples of 4 elements (16/8/4-byte loads), fp8 with block scales"));
      }
    }
  }
  if (entry.device == nullptr) {
    GLM_CUDA_OPS_RETURN_IF_ERROR(
        kOp, cudaMalloc(&entry.device, host.size() * sizeof(ExpertPtr)));
  }
  if (entry.num_counters < OneLaunchCounters(hidden)) {
    if (entry.counters != nullptr) cudaFree(entry.counters);
    entry.counters = nullptr, entry.num_counters = 0;
    const int64_t n = OneLaunchCounters(hidden);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaMalloc(&entry.counters, n * sizeof(int32_t)));
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp,
                                 cudaMemsetAsync(entry.counters, 0, n * sizeof(int32_t), stream));
    entry.num_counters = n;
  }
  entry.host = std::move(host);
  entry.inter = inter, entry.hidden = hidden;
  entry.wt = dtype == WeightDType::kF32 ? kWF32 : dtype == WeightDType::kBF16 ? kWBF16 : kWFP8;
  const int64_t eb = ElemBytes(entry.wt), per_chunk = 16 / eb;
  entry.gemv_ok = hidden % per_chunk == 0 && inter % per_chunk == 0;
  for (const ExpertPtr& ep : entry.host) {
    for (const void* d : {ep.gate, ep.up, ep.down}) {
      entry.gemv_ok = entry.gemv_ok && (reinterpret_cast<uintptr_t>(d) & 15) == 0;
    }
    for (int64_t ld : {ep.gate_ld, ep.up_ld, ep.down_ld}) {
      entry.gemv_ok = entry.gemv_ok && (ld * eb) % 16 == 0;
    }
  }
  // entry.host lives on in the cache, so the async copy's source stays valid.
  GLM_CUDA_OPS_RETURN_IF_ERROR(
      kOp, cudaMemcpyAsync(entry.device, entry.host.data(), entry.host.size() * sizeof(ExpertPtr),
                           cudaMemcpyHostToDevice, stream));
  return &entry;
}

// Deepest pipeline whose shared memory the device allows: 4 stages (H200: 184 KiB fused), else 2
// (GB10's 99 KiB: 92 KiB fused).
template <bool kFused, int kWT>
absl::Status LaunchGemm(const GemmParams& p, int64_t max_tiles, const detail::DeviceInfo& info,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>(detail::CeilDiv(p.n, kBN)));
  constexpr int64_t kSmem4 = GemmSmemFloats<kFused, 4>() * 4;
  constexpr int64_t kSmem2 = GemmSmemFloats<kFused, 2>() * 4;
  if (kSmem4 <= info.smem_optin) {
    GLM_RETURN_IF_ERROR(
        detail::UseDynamicSmem(MoeGemmKernel<kFused, 4, kWT>, kSmem4, info, kOp));
    LaunchKernel(MoeGemmKernel<kFused, 4, kWT>, grid, kThreads, kSmem4, stream, p);
  } else {
    GLM_RETURN_IF_ERROR(
        detail::UseDynamicSmem(MoeGemmKernel<kFused, 2, kWT>, kSmem2, info, kOp));
    LaunchKernel(MoeGemmKernel<kFused, 2, kWT>, grid, kThreads, kSmem2, stream, p);
  }
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeGemmKernel launch");
}

template <bool kFused>
absl::Status LaunchGemmFor(int wt, const GemmParams& p, int64_t max_tiles,
                           const detail::DeviceInfo& info, cudaStream_t stream) {
  return DispatchWT(wt, [&](auto tag) {
    return LaunchGemm<kFused, decltype(tag)::value>(p, max_tiles, info, stream);
  });
}

void* Carve(void*& p, size_t bytes) {
  void* r = p;
  p = static_cast<char*>(p) + (bytes + 255) / 256 * 256;
  return r;
}

std::atomic<MoeDecodePath> g_decode_path{MoeDecodePath::kAuto};

// GLM_CUDA_MOE_MMA=0 keeps kAuto off the tensor-core kernels (A/B in the decode bench).
bool MmaAutoEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("GLM_CUDA_MOE_MMA");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}
std::atomic<MoeRanPath> g_last_path{MoeRanPath::kNone};
std::atomic<int> g_group_tokens{kGroupMaxTokens};
std::atomic<int> g_mma_max_pairs{kMoeMmaAutoMaxPairs};
std::atomic<int> g_route_fuse_max_tokens{kMoeRouteFuseMaxTokens};
std::atomic<bool> g_last_route_fused{false};
std::atomic<int> g_one_launch_max_tokens{kMoeOneLaunchMaxTokens};
std::atomic<bool> g_last_one_launch{false};

// MoeRouteExperts' routing, for Experts.
struct RouteRequest {
  const MatView* logits;
  const MoeRouteArgs* args;
};

absl::Status Experts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                     const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                     cudaStream_t stream, const RouteRequest* route);

}  // namespace

MoeRanPath LastMoeRanPath() { return g_last_path.load(); }
void SetMoeDecodePath(MoeDecodePath path) { g_decode_path.store(path); }
void SetMoeGroupTokens(int tokens) {
  g_group_tokens.store(std::clamp(tokens, 1, kGroupMaxTokens));
}
void SetMoeMmaAutoMaxPairs(int pairs) {
  const int v = std::clamp(pairs, kMoeMmaAutoMinPairs, kMoeListedForceMaxPairs);
  if (g_mma_max_pairs.exchange(v) != v) g_settings_generation.fetch_add(1);
}
void SetMoeDecodeBalancedGrid(bool balanced) {
  if (g_decode_balanced.exchange(balanced) != balanced) g_settings_generation.fetch_add(1);
}
bool MoeDecodeBalancedGrid() { return g_decode_balanced.load(); }
void SetMoeDecodeAsyncCopies(bool on) {
  if (g_decode_async.exchange(on) != on) g_settings_generation.fetch_add(1);
}
bool MoeDecodeAsyncCopies() { return g_decode_async.load(); }
bool LastMoeDecodeAsync() { return g_last_decode_async.load(); }
bool MoeDecodeStreamedOnDevice() {
  int v = 0;
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpyFromSymbol(&v, g_dev_decode_streamed, sizeof(v)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return v != 0;
}
int64_t MoeSettingsGeneration() { return g_settings_generation.load(); }
int MoeMmaAutoMaxPairs() { return g_mma_max_pairs.load(); }
void SetMoeRouteFuseMaxTokens(int tokens) {
  const int v = std::clamp(tokens, 0, kMoeRouteMaxFuseTokens);
  if (g_route_fuse_max_tokens.exchange(v) != v) g_settings_generation.fetch_add(1);
}
int MoeRouteFuseMaxTokens() { return g_route_fuse_max_tokens.load(); }
bool LastMoeRouteFused() { return g_last_route_fused.load(); }
void SetMoeOneLaunchMaxTokens(int tokens) {
  const int v = std::clamp(tokens, 0, kMoeDecodeMaxPairs);
  if (g_one_launch_max_tokens.exchange(v) != v) g_settings_generation.fetch_add(1);
}
int MoeOneLaunchMaxTokens() { return g_one_launch_max_tokens.load(); }
bool LastMoeOneLaunch() { return g_last_one_launch.load(); }

absl::Status MoeExperts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                        const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                        cudaStream_t stream) {
  return Experts(x, ids, weights, top_k, experts, out, scratch, stream, nullptr);
}

absl::Status MoeRouteExperts(const MatView& logits, const MoeRouteArgs& r, const MatView& x,
                             const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                             cudaStream_t stream) {
  if (x.rows == 0) return absl::OkStatus();
  const int k = r.top_k + (r.appended >= 0 ? 1 : 0);
  if (logits.rows != x.rows || r.top_k < 1 || r.ids == nullptr || r.weights == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda MoeRouteExperts: logits has ", logits.rows, " rows for ", x.rows,
                     " tokens, top_k ", r.top_k, ", ids ", r.ids == nullptr ? "null" : "set",
                     ", weights ", r.weights == nullptr ? "null" : "set",
                     " (need one logits row per token, top_k >= 1 and both outputs)"));
  }
  const RouteRequest route{&logits, &r};
  return Experts(x, r.ids, r.weights, k, experts, out, scratch, stream, &route);
}

namespace {

absl::Status Experts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                     const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                     cudaStream_t stream, const RouteRequest* route) {
  const int64_t tokens = x.rows;
  if (tokens == 0) return absl::OkStatus();
  if (top_k <= 0 || experts.num_experts <= 0 || experts.num_experts > kMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MoeExperts: top_k ", top_k, " and num_experts ", experts.num_experts,
        " must be positive, num_experts at most ", kMaxExperts, " (one-CTA routing scan)"));
  }
  const int64_t pairs = tokens * top_k;
  if (pairs >= 0x7fffffff || tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("cuda MoeExperts: ", pairs,
                                                   " (token, expert) pairs exceed 2^31 - 1"));
  }
  GLM_ASSIGN_OR_RETURN(const TableEntry* table, ExpertTable(experts, stream));
  const int64_t hidden = table->hidden, inter = table->inter;
  if (x.cols != hidden || out.cols != hidden || out.rows != tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MoeExperts: x [", x.rows, ", ", x.cols, "] and out [", out.rows, ", ", out.cols,
        "] must be [tokens, hidden ", hidden, "]"));
  }
  if (hidden % 4 != 0 || inter % 4 != 0 || x.ld % 4 != 0 || !detail::Aligned16(x.data)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MoeExperts: hidden (", hidden, "), moe_inter (", inter, ") and x's row stride (",
        x.ld, ") must be multiples of 4 with x 16-byte aligned (cp.async 16-byte copies)"));
  }
  GLM_ASSIGN_OR_RETURN(const detail::DeviceInfo info, detail::CurrentDeviceInfo(kOp));

  const int num_experts = experts.num_experts;
  const MoeDecodePath path = g_decode_path.load(std::memory_order_relaxed);
  const bool small = pairs <= kGemvMaxPairs && table->gemv_ok;
  // kAuto's decode kernels: bf16 experts take the token-group kernels at these sizes too
  // (cuda_ops_bench --only moe on an H200, GLM-5 widths, us per call, decode kernels vs token
  // groups: batch 1 169.4 vs 152.2, batch 8 1014.8 vs 991.6; fp8 is the other way round: 91.3 vs
  // 99.5 and 667 vs 626 at 64 pairs, where the shared expert pushes a batch-8 step past 64).
  const bool decode_small = small && table->wt != kWBF16;
  // Listed decode (device token lists): the token-group kernels by default past the decode
  // kernels' 64 pairs, the per-row list kernels when forced.
  // The token-group kernels address x / act rows with 32-bit element offsets.
  const bool offsets32 = tokens * x.ld + hidden < 0x7fffffff && pairs * inter + inter < 0x7fffffff;
  // fp8 on tensor cores (MoeMmaKernel): kAuto for kMoeMmaAutoMinPairs..kMoeMmaAutoMaxPairs
  // pairs, or forced.
  const bool mma =
      table->wt == kWFP8 && table->gemv_ok && offsets32 && pairs <= kMoeListedForceMaxPairs &&
      (path == MoeDecodePath::kMma ||
       (path == MoeDecodePath::kAuto && !decode_small && pairs >= kMoeMmaAutoMinPairs &&
        pairs <= g_mma_max_pairs.load(std::memory_order_relaxed) && MmaAutoEnabled()));
  // kMma forced on bf16 / fp32 weights runs the token-group kernels.
  const bool grouped =
      !mma && table->gemv_ok && offsets32 &&
      ((path == MoeDecodePath::kAuto && !decode_small && pairs <= kMoeListedMaxPairs) ||
       ((path == MoeDecodePath::kGrouped || path == MoeDecodePath::kMma) &&
        pairs <= kMoeListedForceMaxPairs));
  const bool listed =
      table->gemv_ok && path == MoeDecodePath::kListed && pairs <= kMoeListedForceMaxPairs;
  // MoeRouteExperts: the gate|up decode kernel routes for itself at few tokens (its warps each
  // route every token: worth it while that is shorter than a launch; MoeRouteFuseMaxTokens)
  // when the routing needs no group step and 256 experts at most (RouteRowWarp<8>); else
  // MoeRoute's kernel first.
  bool fuse_route = false;
  if (route != nullptr) {
    const MoeRouteArgs& r = *route->args;
    const MatView& lg = *route->logits;
    // decode_small && kAuto is exactly the decode branch below (not listed, grouped or mma).
    fuse_route = decode_small && path == MoeDecodePath::kAuto &&
                 tokens <= g_route_fuse_max_tokens.load(std::memory_order_relaxed) &&
                 lg.cols >= 1 && lg.cols <= 256 && lg.ld >= lg.cols &&
                 (r.n_group <= 1 || r.topk_group >= r.n_group) && r.top_k <= lg.cols &&
                 r.top_k <= kernels::kMoeRouteMaxTopK && r.appended >= -1;
    if (!fuse_route) {
      GLM_RETURN_IF_ERROR(kernels::MoeRoute(
          lg.data, lg.ld, r.bias, lg.rows, static_cast<int>(lg.cols), std::max(1, r.n_group),
          r.topk_group, r.top_k, r.renormalize, r.scale, r.appended, r.ids, r.weights, stream));
    } else {
      GLM_RETURN_IF_ERROR(kernels::CheckDevicePointer(lg.data, kOp, "logits"));
      GLM_RETURN_IF_ERROR(kernels::CheckDevicePointer(r.ids, kOp, "ids"));
      GLM_RETURN_IF_ERROR(kernels::CheckDevicePointer(r.weights, kOp, "weights"));
      if (r.bias != nullptr) GLM_RETURN_IF_ERROR(kernels::CheckDevicePointer(r.bias, kOp, "bias"));
    }
  }
  g_last_route_fused.store(fuse_route);
  g_last_one_launch.store(false);
  g_last_decode_async.store(false);
  if (listed || grouped || mma) {
    const int64_t max_slots = std::min<int64_t>(num_experts, pairs);
    const int group_tokens = g_group_tokens.load(std::memory_order_relaxed);
    const int64_t max_units = MaxGroupUnits(pairs, max_slots, group_tokens);
    auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    const size_t int_bytes = 2 * rounded(sizeof(int32_t)) + rounded(max_slots * sizeof(int32_t)) +
                             rounded((max_slots + 1) * sizeof(int32_t)) +
                             rounded(static_cast<size_t>(pairs) * sizeof(int32_t)) +
                             rounded(max_units * sizeof(int32_t)) +
                             rounded((max_units + 1) * sizeof(int32_t));
    GLM_ASSIGN_OR_RETURN(void* ints, scratch.Get(0, int_bytes));
    void* cur = ints;
    auto* n_active = static_cast<int32_t*>(Carve(cur, sizeof(int32_t)));
    auto* slot_expert = static_cast<int32_t*>(Carve(cur, max_slots * sizeof(int32_t)));
    auto* slot_off = static_cast<int32_t*>(Carve(cur, (max_slots + 1) * sizeof(int32_t)));
    auto* row_pair = static_cast<int32_t*>(Carve(cur, pairs * sizeof(int32_t)));
    auto* n_units = static_cast<int32_t*>(Carve(cur, sizeof(int32_t)));
    auto* unit_expert = static_cast<int32_t*>(Carve(cur, max_units * sizeof(int32_t)));
    auto* unit_off = static_cast<int32_t*>(Carve(cur, (max_units + 1) * sizeof(int32_t)));
    GLM_ASSIGN_OR_RETURN(void* act, scratch.Get(1, static_cast<size_t>(pairs * inter) * 4));
    GLM_ASSIGN_OR_RETURN(void* y, scratch.Get(2, static_cast<size_t>(pairs * hidden) * 4));
    LaunchKernel(MoeListRouteKernel, 1, kRouteThreads, 0, stream, ids, static_cast<int>(pairs),
                 num_experts, group_tokens, n_active, slot_expert, slot_off, row_pair, n_units,
                 unit_expert, unit_off);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    const DecodeLists l{n_active, slot_expert, slot_off, row_pair, n_units, unit_expert, unit_off};
    if (mma) {
      // Split rows: x (tokens, hidden) for the fused kernel, act (pairs, inter) for down.
      const int kbh = static_cast<int>(detail::CeilDiv(hidden, kMmaKB));
      const int kbi = static_cast<int>(detail::CeilDiv(inter, kMmaKB));
      auto split_bytes = [&](int64_t rows, int kb) {
        return rounded(static_cast<size_t>(rows * kb * kMmaSplitRow) * 2) +
               rounded(static_cast<size_t>(rows * kb) * 4);
      };
      GLM_ASSIGN_OR_RETURN(void* xs, scratch.Get(3, split_bytes(tokens, kbh)));
      GLM_ASSIGN_OR_RETURN(void* as, scratch.Get(4, split_bytes(pairs, kbi)));
      MmaParams mp{};
      mp.experts = table->device, mp.top_k = top_k;
      void* c3 = xs;
      mp.bsplit = static_cast<const __half*>(
          Carve(c3, static_cast<size_t>(tokens * kbh * kMmaSplitRow) * 2));
      mp.binv = static_cast<const float*>(Carve(c3, static_cast<size_t>(tokens * kbh) * 4));
      mp.kblocks = kbh, mp.n = static_cast<int>(inter), mp.k = static_cast<int>(hidden);
      mp.c = static_cast<float*>(act);
      GLM_RETURN_IF_ERROR(LaunchMma<true>(mp, x.data, x.ld, tokens, l, max_slots, info, stream));
      void* c4 = as;
      mp.bsplit = static_cast<const __half*>(
          Carve(c4, static_cast<size_t>(pairs * kbi * kMmaSplitRow) * 2));
      mp.binv = static_cast<const float*>(Carve(c4, static_cast<size_t>(pairs * kbi) * 4));
      mp.kblocks = kbi, mp.n = static_cast<int>(hidden), mp.k = static_cast<int>(inter);
      mp.c = static_cast<float*>(y);
      GLM_RETURN_IF_ERROR(LaunchMma<false>(mp, static_cast<const float*>(act), inter, pairs, l,
                                           max_slots, info, stream));
    } else {
    DecodeParams d{};
    d.ids = ids, d.pairs = static_cast<int>(pairs), d.top_k = top_k;
    d.num_experts = num_experts, d.experts = table->device;
    d.a = x.data, d.a_ld = x.ld;
    d.n = static_cast<int>(inter), d.k = static_cast<int>(hidden);
    d.c = static_cast<float*>(act);
    GLM_RETURN_IF_ERROR(grouped
                            ? LaunchGroupFor<true>(table->wt, d, l, max_units, info, stream)
                            : LaunchListFor<true>(table->wt, d, l, max_slots, info, stream));
    d.a = static_cast<const float*>(act), d.a_ld = inter;
    d.n = static_cast<int>(hidden), d.k = static_cast<int>(inter);
    d.c = static_cast<float*>(y);
    GLM_RETURN_IF_ERROR(grouped
                            ? LaunchGroupFor<false>(table->wt, d, l, max_units, info, stream)
                            : LaunchListFor<false>(table->wt, d, l, max_slots, info, stream));
    }
    LaunchKernel(MoeCombineByPairKernel,
                 dim3(static_cast<unsigned>(tokens),
                      static_cast<unsigned>(detail::CeilDiv(hidden, kCombineThreads))),
                 kCombineThreads, 0, stream, static_cast<const float*>(y), ids, weights, top_k,
                 num_experts, static_cast<int>(hidden), out.data, out.ld);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    g_last_path.store(mma       ? MoeRanPath::kMma
                      : grouped ? MoeRanPath::kGrouped
                                : MoeRanPath::kListed);
    return absl::OkStatus();
  }
  if (decode_small && path == MoeDecodePath::kAuto) {
    // Decode: two weight-streaming kernels that route from ids themselves, then the combine.
    GLM_ASSIGN_OR_RETURN(void* act, scratch.Get(1, static_cast<size_t>(pairs * inter) * 4));
    GLM_ASSIGN_OR_RETURN(void* y, scratch.Get(2, static_cast<size_t>(pairs * hidden) * 4));
    DecodeParams d{};
    d.ids = ids, d.pairs = static_cast<int>(pairs), d.top_k = top_k;
    d.num_experts = num_experts, d.experts = table->device;
    const int64_t max_slots = std::min<int64_t>(num_experts, pairs);
    d.a = x.data, d.a_ld = x.ld;
    d.n = static_cast<int>(inter), d.k = static_cast<int>(hidden);
    d.c = static_cast<float*>(act);
    if (fuse_route) {
      const MoeRouteArgs& r = *route->args;
      d.route.logits = route->logits->data, d.route.ld = route->logits->ld;
      d.route.bias = r.bias;
      d.route.routed = static_cast<int>(route->logits->cols), d.route.routed_top_k = r.top_k;
      d.route.tokens = static_cast<int>(tokens), d.route.appended = r.appended;
      d.route.renormalize = r.renormalize ? 1 : 0, d.route.scale = r.scale;
      d.route.ids = r.ids, d.route.weights = r.weights;
    }
    DecodeParams dn = d;
    dn.route = DecodeRouteIn{};
    dn.a = static_cast<const float*>(act), dn.a_ld = inter;
    dn.n = static_cast<int>(hidden), dn.k = static_cast<int>(inter);
    dn.c = static_cast<float*>(y);
    if (tokens <= g_one_launch_max_tokens.load(std::memory_order_relaxed) &&
        table->num_counters >= OneLaunchCounters(hidden)) {
      // gate|up, down and the combine in one grid (MoeDecodeOneKernel).
      const OneParams op{d, dn, weights, out.data, out.ld, table->counters};
      GLM_RETURN_IF_ERROR(LaunchOneFor(table->wt, op, max_slots, info, stream));
      g_last_one_launch.store(true);
      g_last_path.store(MoeRanPath::kDecode);
      return absl::OkStatus();
    }
    GLM_RETURN_IF_ERROR(LaunchDecodeFor<true>(table->wt, d, max_slots, info, stream));
    GLM_RETURN_IF_ERROR(LaunchDecodeFor<false>(table->wt, dn, max_slots, info, stream));
    LaunchKernel(MoeCombineByPairKernel,
                 dim3(static_cast<unsigned>(tokens),
                      static_cast<unsigned>(detail::CeilDiv(hidden, kCombineThreads))),
                 kCombineThreads, 0, stream, static_cast<const float*>(y), ids, weights, top_k,
                 num_experts, static_cast<int>(hidden), out.data, out.ld);
    GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
    g_last_path.store(MoeRanPath::kDecode);
    return absl::OkStatus();
  }
  auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t int_bytes = 2 * rounded((num_experts + 1) * sizeof(int32_t)) +
                           2 * rounded(static_cast<size_t>(pairs) * sizeof(int32_t));
  GLM_ASSIGN_OR_RETURN(void* ints, scratch.Get(0, int_bytes));
  void* cur = ints;
  auto* expert_off = static_cast<int32_t*>(Carve(cur, (num_experts + 1) * sizeof(int32_t)));
  auto* tile_off = static_cast<int32_t*>(Carve(cur, (num_experts + 1) * sizeof(int32_t)));
  auto* row_pair = static_cast<int32_t*>(Carve(cur, pairs * sizeof(int32_t)));
  auto* pair_row = static_cast<int32_t*>(Carve(cur, pairs * sizeof(int32_t)));
  GLM_ASSIGN_OR_RETURN(void* act, scratch.Get(1, static_cast<size_t>(pairs * inter) * 4));
  GLM_ASSIGN_OR_RETURN(void* y, scratch.Get(2, static_cast<size_t>(pairs * hidden) * 4));

  LaunchKernel(MoeRouteKernel, 1, kRouteThreads, 0, stream, ids, static_cast<int>(pairs),
               num_experts, expert_off, tile_off, row_pair, pair_row);
  GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());

  const int64_t max_tiles = detail::CeilDiv(pairs, kBM) + std::min<int64_t>(num_experts, pairs);
  GemmParams p{};
  p.top_k = top_k;
  p.experts = table->device;
  p.expert_off = expert_off, p.tile_off = tile_off, p.row_pair = row_pair;
  p.num_experts = num_experts;

  // Decode (few rows per expert): the weight-streaming GEMV; every expert has one tile then.
  const bool gemv = small && path == MoeDecodePath::kLegacyGemv;
  const int64_t slots = std::min<int64_t>(num_experts, pairs);
  p.a = x.data, p.a_ld = x.ld;
  p.n = static_cast<int>(inter), p.k = static_cast<int>(hidden);
  p.c = static_cast<float*>(act);
  GLM_RETURN_IF_ERROR(gemv ? LaunchGemvFor<true>(table->wt, p, slots, stream)
                           : LaunchGemmFor<true>(table->wt, p, max_tiles, info, stream));
  p.a = static_cast<const float*>(act), p.a_ld = inter;
  p.n = static_cast<int>(hidden), p.k = static_cast<int>(inter);
  p.c = static_cast<float*>(y);
  GLM_RETURN_IF_ERROR(gemv ? LaunchGemvFor<false>(table->wt, p, slots, stream)
                           : LaunchGemmFor<false>(table->wt, p, max_tiles, info, stream));

  LaunchKernel(MoeCombineKernel,
               dim3(static_cast<unsigned>(tokens),
                    static_cast<unsigned>(detail::CeilDiv(hidden, kCombineThreads))),
               kCombineThreads, 0, stream, static_cast<const float*>(y), pair_row, weights, top_k,
               static_cast<int>(hidden), out.data, out.ld);
  GLM_CUDA_OPS_RETURN_IF_ERROR(kOp, cudaGetLastError());
  g_last_path.store(gemv ? MoeRanPath::kLegacyGemv : MoeRanPath::kTiled);
  return absl::OkStatus();
}

}  // namespace

}  // namespace glm::engine::cuda
