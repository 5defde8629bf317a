#include "engine/backend/cpu/cpu_narrow.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/weights/float_codec.h"

// The 8-wide vector helpers are inlined into the target_clones kernels; their ABI never crosses
// a call boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace glm::engine::cpu {
namespace {

constexpr int64_t kGroup = 128;    // activation quantization group == weight block (columns)
constexpr float kE4m3Max = 448.0f;
constexpr int64_t kTileN = 32;     // weight rows widened at a time (the fp32 kernel's tile)
constexpr int64_t kChunkM = 64;    // x rows per task
constexpr int64_t kMaxFusedM = 4;  // up to this many x rows: the fused decode kernel

// e4m3 code -> fp32 for the hot loops: float_codec's exact decoder, tabulated once.
const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = Fp8E4M3ToFloat(static_cast<uint8_t>(v));
    return t;
  }();
  return table;
}

// Items per ParallelFor chunk so a chunk carries >= ~64K multiply-adds (as the fp32 ops do).
int64_t MinChunk(int64_t work_per_item) {
  constexpr int64_t kMinWorkPerChunk = 1 << 16;
  return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, work_per_item));
}

// One row of EffectiveLinearX.
void EffectiveRow(WeightDType dtype, const float* x, int64_t k, float* out) {
  if (dtype == WeightDType::kF32) {
    std::memcpy(out, x, k * sizeof(float));
    return;
  }
  for (int64_t c = 0; c < k; ++c) out[c] = RoundToBf16(x[c]);
  if (dtype == WeightDType::kBF16) return;
  // kernels::QuantizeFp8GroupHost on the bf16 values, then e4m3(q) * scale.
  for (int64_t c0 = 0; c0 < k; c0 += kGroup) {
    const int64_t c1 = std::min(k, c0 + kGroup);
    float amax = 0.0f;
    for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(out[c]));
    const float scale = amax / kE4m3Max;
    for (int64_t c = c0; c < c1; ++c) {
      out[c] = scale > 0.0f ? E4m3ToFloat(FloatToE4m3Sat(out[c] / scale)) * scale : 0.0f;
    }
  }
}

__attribute__((target_clones("arch=haswell", "default")))
void WidenBf16Row(const uint16_t* src, int64_t n, float* dst) {
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t c = 0; c < n; ++c) d[c] = static_cast<uint32_t>(src[c]) << 16;
}

// ---- Fused decode kernel: the weights widened in registers, 8 at a time. Per output element
// it performs exactly the fp32 kernel's arithmetic (cpu_backend.cc DotTile1x4 / DotTile4x2:
// 8 lane accumulators with fused multiply-adds over k, the same horizontal sum, then the
// scalar tail), so its results equal the widen-then-fp32 path bit for bit.
typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f Load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline float HorizontalSum(v8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// 8 weights of one row widened to fp32, k % 8 == 0 (so one 128-column block for fp8).
__attribute__((always_inline)) inline v8f WidenBf16x8(const uint16_t* p) {
  v8u16 h;
  std::memcpy(&h, p, sizeof(h));
  const v8u32 u = __builtin_convertvector(h, v8u32) << 16;
  v8f f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
// e4m3 -> fp32 through the exact table, times the block scale (the same fp32 product as
// E4m3ToFloat(q) * scale).
__attribute__((always_inline)) inline v8f WidenFp8x8(const uint8_t* q, const float* t,
                                                     float scale) {
  const v8f f = {t[q[0]], t[q[1]], t[q[2]], t[q[3]], t[q[4]], t[q[5]], t[q[6]], t[q[7]]};
  return f * scale;
}

template <WeightDType kD>
__attribute__((always_inline)) inline v8f LoadW8(const void* row, const float* scales,
                                                 const float* table, int64_t k) {
  if constexpr (kD == WeightDType::kBF16) {
    return WidenBf16x8(static_cast<const uint16_t*>(row) + k);
  } else {
    return WidenFp8x8(static_cast<const uint8_t*>(row) + k, table, scales[k / kGroup]);
  }
}
template <WeightDType kD>
__attribute__((always_inline)) inline float AtW(const void* row, const float* scales,
                                                  const float* table, int64_t k) {
  if constexpr (kD == WeightDType::kBF16) {
    return Bf16ToFloat(static_cast<const uint16_t*>(row)[k]);
  } else {
    return table[static_cast<const uint8_t*>(row)[k]] * scales[k / kGroup];
  }
}

// out[j] = x . w_j over k < K for 4 weight rows of one dtype (row j at w_rows[j]; fp8: its block
// scales at w_scales[j]).
template <WeightDType kD>
__attribute__((always_inline)) inline void NarrowDot1x4Body(const float* x,
                                                            const void* const* w_rows,
                                                            const float* const* w_scales,
                                                            int64_t K, float* out) {
  const float* table = E4m3Table().data();
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const v8f xv = Load8(x + k);
    a0 += xv * LoadW8<kD>(w_rows[0], w_scales[0], table, k);
    a1 += xv * LoadW8<kD>(w_rows[1], w_scales[1], table, k);
    a2 += xv * LoadW8<kD>(w_rows[2], w_scales[2], table, k);
    a3 += xv * LoadW8<kD>(w_rows[3], w_scales[3], table, k);
  }
  float r[4] = {HorizontalSum(a0), HorizontalSum(a1), HorizontalSum(a2), HorizontalSum(a3)};
  for (; k < K; ++k) {
    for (int j = 0; j < 4; ++j) r[j] += x[k] * AtW<kD>(w_rows[j], w_scales[j], table, k);
  }
  std::memcpy(out, r, sizeof(r));
}

__attribute__((target_clones("arch=haswell", "default")))
void NarrowDot1x4Bf16(const float* x, const void* const* w_rows, const float* const* w_scales,
                      int64_t K, float* out) {
  NarrowDot1x4Body<WeightDType::kBF16>(x, w_rows, w_scales, K, out);
}
__attribute__((target_clones("arch=haswell", "default")))
void NarrowDot1x4Fp8(const float* x, const void* const* w_rows, const float* const* w_scales,
                     int64_t K, float* out) {
  NarrowDot1x4Body<WeightDType::kF8E4M3Block128>(x, w_rows, w_scales, K, out);
}

// y rows [0, M) x cols [n0, n1) from x' (fp32, [M, K]) and the narrow w; M <= kMaxFusedM.
void FusedBlock(const MatView& xv, const MatView& w, const MatView& y, bool accumulate,
                int64_t n0, int64_t n1) {
  const int64_t K = xv.cols;
  const bool bf16 = w.dtype == WeightDType::kBF16;
  const int64_t elem = bf16 ? 2 : 1;
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - n);
    const void* rows[4];
    const float* scales[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t r = n + std::min(j, nr - 1);
      rows[j] = reinterpret_cast<const char*>(w.data) + r * w.ld * elem;
      if (!bf16) scales[j] = w.scales + (r / kGroup) * w.scale_ld;
    }
    for (int64_t m = 0; m < xv.rows; ++m) {
      float r[4];
      if (bf16) {
        NarrowDot1x4Bf16(xv.Row(m), rows, scales, K, r);
      } else {
        NarrowDot1x4Fp8(xv.Row(m), rows, scales, K, r);
      }
      float* yr = y.Row(m) + n;
      for (int64_t j = 0; j < nr; ++j) yr[j] = accumulate ? yr[j] + r[j] : r[j];
    }
  }
}

}  // namespace

// The codecs are engine/weights/float_codec's (the checkpoint decoders); only the e4m3 NaN
// encoding differs: float_codec gives 0x7f, this keeps the sign like the CUDA host mirror
// (kernels::FloatToE4m3Sat = __nv_cvt_float_to_fp8). Either code decodes to NaN, so the
// narrow path's values do not depend on it.
float RoundToBf16(float v) { return glm::engine::Bf16ToFloat(FloatToBf16(v)); }

float Bf16ToFloat(uint16_t bits) { return glm::engine::Bf16ToFloat(bits); }

float E4m3ToFloat(uint8_t v) { return E4m3Table()[v]; }

uint8_t FloatToE4m3Sat(float v) {
  if (std::isnan(v)) return static_cast<uint8_t>((std::signbit(v) ? 0x80u : 0u) | 0x7fu);
  return FloatToFp8E4M3(v);
}

void EffectiveLinearX(WeightDType dtype, const float* x, int64_t ldx, int64_t m, int64_t k,
                      float* out) {
  for (int64_t r = 0; r < m; ++r) EffectiveRow(dtype, x + r * ldx, k, out + r * k);
}

void WidenWeightRows(const MatView& w, int64_t r0, int64_t n, float* out) {
  const int64_t cols = w.cols;
  switch (w.dtype) {
    case WeightDType::kF32:
      for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * cols, w.Row(r0 + i), cols * 4);
      break;
    case WeightDType::kBF16: {
      const uint16_t* base = reinterpret_cast<const uint16_t*>(w.data);
      for (int64_t i = 0; i < n; ++i) WidenBf16Row(base + (r0 + i) * w.ld, cols, out + i * cols);
      break;
    }
    case WeightDType::kF8E4M3Block128: {
      const uint8_t* base = reinterpret_cast<const uint8_t*>(w.data);
      const std::array<float, 256>& table = E4m3Table();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        const uint8_t* src = base + r * w.ld;
        const float* srow = w.scales + (r / kGroup) * w.scale_ld;
        float* dst = out + i * cols;
        for (int64_t c0 = 0; c0 < cols; c0 += kGroup) {
          const int64_t c1 = std::min(cols, c0 + kGroup);
          const float sc = srow[c0 / kGroup];
          for (int64_t c = c0; c < c1; ++c) dst[c] = table[src[c]] * sc;
        }
      }
      break;
    }
    case WeightDType::kInt4:
    case WeightDType::kInt8:
    case WeightDType::kNvfp4:
      break;  // never stored on this backend (SupportsWeightDType: the loader widens them)
  }
}

void NarrowLinear(ThreadPool& pool, const MatView& x, const MatView& w, const MatView& y,
                  bool accumulate, NarrowX x_mode, Fp32BlockFn block) {
  const int64_t M = x.rows, N = w.rows, K = x.cols;
  if (M == 0 || N == 0) return;
  // x as multiplied: [M, K] (row stride K) when it changes, else x itself.
  std::vector<float> xe;
  MatView xv = x;
  if (x_mode == NarrowX::kLikeWeight) {
    xe.resize(static_cast<size_t>(M * K));
    pool.ParallelFor(M, MinChunk(4 * K), [&](int64_t begin, int64_t end) {
      EffectiveLinearX(w.dtype, x.Row(begin), x.ld, end - begin, K, xe.data() + begin * K);
    });
    xv = MatView{xe.data(), M, K, K};
  }
  if (M <= kMaxFusedM && w.dtype != WeightDType::kF32) {  // decode: no widened copy
    const int64_t groups = (N + 3) / 4;
    pool.ParallelFor(groups, MinChunk(4 * K * M), [&](int64_t begin, int64_t end) {
      FusedBlock(xv, w, y, accumulate, begin * 4, std::min(N, end * 4));
    });
    return;
  }
  // Tasks: (weight tile tn, x chunk cm), tn-major so consecutive tasks of a chunk of work reuse
  // the widened tile.
  const int64_t tiles_n = (N + kTileN - 1) / kTileN;
  const int64_t chunks_m = (M + kChunkM - 1) / kChunkM;
  const int64_t task_work = K * std::min(M, kChunkM) * std::min(N, kTileN);
  pool.ParallelFor(tiles_n * chunks_m, MinChunk(task_work), [&](int64_t begin, int64_t end) {
    std::vector<float> tile(static_cast<size_t>(std::min(N, kTileN) * K));
    int64_t widened = -1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t tn = t / chunks_m, cm = t % chunks_m;
      const int64_t n0 = tn * kTileN, nr = std::min(kTileN, N - n0);
      if (tn != widened) {
        WidenWeightRows(w, n0, nr, tile.data());
        widened = tn;
      }
      const MatView wt{tile.data(), nr, K, K};
      block(xv, wt, y.Cols(n0, nr), accumulate, cm * kChunkM, std::min(M, (cm + 1) * kChunkM), 0,
            nr);
    }
  });
}

void AbsorbPerHead(ThreadPool& pool, const HeadsView& x, const MatView& w, int64_t head_rows,
                   int64_t row_begin, Backend::PerHeadContract contract, const HeadsView& y,
                   Fp32BlockFn block) {
  const int64_t M = x.rows, heads = x.heads;
  if (M == 0 || heads == 0 || y.dim == 0) return;
  const bool contract_rows = contract == Backend::PerHeadContract::kRows;
  if (heads == 1 && !contract_rows && row_begin == 0) {
    // One block from row 0 (MLA's expanded form: all of kv_b_proj): the narrow Linear kernel with
    // x as given, threaded over tiles; the same bits (the fp32 Linear on the widened weight).
    MatView wb = w;
    wb.rows = y.dim;
    NarrowLinear(pool, x.Head(0), wb, y.Head(0), /*accumulate=*/false, NarrowX::kF32, block);
    return;
  }
  // The block's weight rows and the fp32 [out, in] matrix the Linear kernel takes.
  const int64_t block_rows = contract_rows ? x.dim : y.dim;
  const int64_t out = y.dim, in = x.dim;
  // ~2 * M * out * in flops per head, plus widening; one head per task at GLM-5 sizes.
  const int64_t min_heads = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, M * out * in));
  pool.ParallelFor(heads, min_heads, [&](int64_t h0, int64_t h1) {
    std::vector<float> wide(block_rows * w.cols), wt;
    if (contract_rows) wt.resize(out * in);
    for (int64_t h = h0; h < h1; ++h) {
      if (in == 0) {
        for (int64_t r = 0; r < M; ++r) std::fill_n(y.At(r, h), out, 0.0f);
        continue;
      }
      WidenWeightRows(w, h * head_rows + row_begin, block_rows, wide.data());
      MatView wv;
      if (contract_rows) {  // wt[c][d] = W[base + d][c]
        for (int64_t d = 0; d < in; ++d) {
          for (int64_t c = 0; c < out; ++c) wt[c * in + d] = wide[d * w.cols + c];
        }
        wv = MatView{wt.data(), out, in, in};
      } else {
        wv = MatView{wide.data(), out, in, w.cols};
      }
      block(x.Head(h), wv, y.Head(h), /*accumulate=*/false, 0, M, 0, out);
    }
  });
}

}  // namespace glm::engine::cpu
