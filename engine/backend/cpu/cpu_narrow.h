// Narrow Linear weights (backend.h WeightDType kBF16 / kF8E4M3Block128) on the CPU backend, with
// the CUDA backend's numerics (backend.h Linear and MoeExperts), so the two backends differ only
// by the order of fp32 summation:
// - Linear, bf16 weight: x rounded to bf16 (round to nearest even, as __float2bfloat16_rn).
// - Linear, fp8 weight: x rounded to bf16, then quantized per row per 128 columns to e4m3 with
//   scale = amax / 448 (bit-identical to kernels::QuantizeFp8GroupHost and the device quantizer
//   kernels/quant_fp8_group), multiplied as e4m3(x) * scale.
// - MoeExperts: x stays fp32 (NarrowX::kF32).
// Weights are widened exactly as the CUDA kernels widen them: bf16 -> fp32 (exact), fp8 ->
// float(q) * block_scale (one fp32 multiply). The narrow bytes stay in memory. For more than 4 x
// rows NarrowLinear widens one tile of 32 weight rows at a time into per-task scratch and runs the
// backend's fp32 block kernel on it; for up to 4 rows (decode) a fused kernel widens 8 weights at a
// time in registers with the same per-element arithmetic (8 fused multiply-add lanes, the same
// horizontal sum and tail). Either way the result equals, bit for bit, the fp32 Linear on x' and
// the widened weight, whatever the thread count (cpu_narrow_test checks both).
// Speed (one thread, [1|16|128, 4096] x [4096, 4096]^T, this machine loaded by other builds):
// bf16 0.95x / 2.1x / 1.05x the fp32 Linear's time, fp8 1.9x / 1.4x / 1.1x.
// Self-contained (no CUDA headers): CI builds without CUDA run this path.
#pragma once

#include <cstdint>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/thread_pool.h"

namespace glm::engine::cpu {

// How NarrowLinear prepares x.
enum class NarrowX {
  kLikeWeight,  // Linear: bf16 (bf16 weights) or bf16 + per-128-column e4m3 (fp8 weights)
  kF32,         // MoeExperts: x as given
};

// The backend's fp32 kernel NarrowLinear runs per tile: y[m, n] (+)= x[m] . w[n] for rows
// [m0, m1) and columns [n0, n1) of y; w is an fp32 view.
using Fp32BlockFn = void (*)(const MatView& x, const MatView& w, const MatView& y,
                             bool accumulate, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

// y[M, N] (+)= x'[M, K] . W[N, K]^T with w.dtype kBF16 or kF8E4M3Block128 (kF32 also works: it is
// copied tile by tile), x' per x_mode. Threaded on `pool`; y must not alias x.
void NarrowLinear(ThreadPool& pool, const MatView& x, const MatView& w, const MatView& y,
                  bool accumulate, NarrowX x_mode, Fp32BlockFn block);

// Backend::AbsorbPerHead on the CPU (weight-only: x as given). Per head, the block's rows are
// widened with WidenWeightRows (the CUDA kernels' per-element arithmetic) into per-task scratch,
// for kRows transposed to [y.dim, x.dim], and `block` (the fp32 Linear kernel) multiplies x by it.
// So the result equals, bit for bit, the fp32 LinearPerHead on the widened weight (kCols) or on
// its per-head transpose (kRows: what an fp32 model uploads as w_uk_t), whatever the thread
// count. Threaded over heads on `pool`; one head whose block starts at row 0 (kCols: MLA's
// expanded form over all of kv_b_proj) runs NarrowLinear with NarrowX::kF32 instead (threaded over
// tiles; the same bits). y must not alias x.
void AbsorbPerHead(ThreadPool& pool, const HeadsView& x, const MatView& w, int64_t head_rows,
                   int64_t row_begin, Backend::PerHeadContract contract, const HeadsView& y,
                   Fp32BlockFn block);

// ---- The element conversions (exposed for tests).
// float -> nearest bf16 (ties to even) as fp32; NaN stays NaN.
float RoundToBf16(float v);
// bf16 bits -> fp32 (exact).
float Bf16ToFloat(uint16_t bits);
// e4m3 (OCP "fn": bias 7, no infinities, 0x7f/0xff NaN, max 448) -> fp32 (exact).
float E4m3ToFloat(uint8_t v);
// fp32 -> e4m3, round to nearest even, saturating to +-448 (inf too); NaN -> 0x7f | sign. The
// same bits as cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float_to_fp8(v, __NV_SATFINITE, E4M3)).
uint8_t FloatToE4m3Sat(float v);

// out[r * k + c] = x'[r, c] for the x' a narrow Linear with a `dtype` weight multiplies (see the
// file comment); x: [m, k] with row stride ldx. dtype kF32 copies.
void EffectiveLinearX(WeightDType dtype, const float* x, int64_t ldx, int64_t m, int64_t k,
                      float* out);
// out[i * w.cols + c] = W[r0 + i, c] widened to fp32, i < n.
void WidenWeightRows(const MatView& w, int64_t r0, int64_t n, float* out);

}  // namespace glm::engine::cpu
