#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/cuda_util.h"
#include "kernels/per_head_gemv.cuh"
#include "kernels/per_head_gemv.h"
#include "kernels/rmsnorm.h"

namespace glm::kernels {
namespace {

using detail::PerHeadGemvArgs;
using KernelFn = void (*)(PerHeadGemvArgs);

template <int kVec>
KernelFn PickKernel(int rows) {
  if (rows <= 1) return detail::PerHeadGemvKernel<kVec, 1>;
  if (rows <= 2) return detail::PerHeadGemvKernel<kVec, 2>;
  if (rows <= 4) return detail::PerHeadGemvKernel<kVec, 4>;
  if (rows <= 8) return detail::PerHeadGemvKernel<kVec, 8>;
  return detail::PerHeadGemvKernel<kVec, 16>;
}

int MaxMFor(int rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : rows <= 8 ? 8 : 16; }

// Resident CTAs of `fn` with `smem` dynamic bytes on the current device (SM count x occupancy),
// cached per (device, kernel, smem).
absl::StatusOr<int> ResidentCtas(KernelFn fn, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, KernelFn, size_t>, int>* cache =
      new std::map<std::tuple<int, KernelFn, size_t>, int>();
  int device = 0;
  GLM_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "PerHeadGemv: cudaGetDevice"));
  const auto key = std::make_tuple(device, fn, smem);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  int sms = 0, per_sm = 0;
  GLM_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "PerHeadGemv: SMs"));
  GLM_RETURN_IF_ERROR(CudaStatus(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, detail::kPhgThreads, smem),
      "PerHeadGemv: occupancy"));
  const int ctas = std::max(1, sms * std::max(1, per_sm));
  std::lock_guard<std::mutex> lock(mu);
  (*cache)[key] = ctas;
  return ctas;
}

// Dynamic shared memory of a call: the staged x, the K-slice partials and (fused norm) the
// norm's [rows][32] warp sums.
size_t SmemBytes(int64_t rows, int64_t in_dim, bool norm) {
  return static_cast<size_t>(rows * in_dim * 4) +
         size_t{detail::kPhgWarps} * MaxMFor(static_cast<int>(rows)) * detail::kPhgRowsPerWarp * 4 +
         (norm ? static_cast<size_t>(rows) * 32 * 4 : 0);
}

}  // namespace

bool PerHeadGemvNormFusible(const float* x, int64_t x_row_stride, int64_t rows, int64_t in_dim,
                            const PerHeadGemvNorm& norm) {
  if (norm.w == nullptr || norm.out == nullptr || x == nullptr || rows < 1 ||
      rows > kPerHeadGemvMaxRows || in_dim < 1) {
    return false;
  }
  if (RmsNormF32VecThreads(in_dim, x, x_row_stride, norm.w, norm.out, norm.out_ld) == 0) {
    return false;
  }
  if (SmemBytes(rows, in_dim, true) > static_cast<size_t>(kPerHeadGemvMaxSmemBytes)) return false;
  const size_t out_bytes = static_cast<size_t>((rows - 1) * norm.out_ld + in_dim) * 4;
  return !BytesOverlap(norm.out, out_bytes, x,
                       static_cast<size_t>((rows - 1) * x_row_stride + in_dim) * 4) &&
         !BytesOverlap(norm.out, out_bytes, norm.w, static_cast<size_t>(in_dim) * 4);
}

bool PerHeadGemvSupported(int64_t rows, int64_t in_dim) {
  if (rows < 1 || rows > kPerHeadGemvMaxRows || in_dim < 0) return false;
  return SmemBytes(rows, in_dim, false) <= static_cast<size_t>(kPerHeadGemvMaxSmemBytes);
}

absl::Status PerHeadGemv(const float* x, int64_t x_row_stride, int64_t x_head_stride,
                         const float* w, int64_t w_head_stride, int64_t w_ld, float* y,
                         int64_t y_row_stride, int64_t y_head_stride, int64_t rows, int64_t heads,
                         int64_t in_dim, int64_t out_dim, bool accumulate, cudaStream_t stream,
                         const PerHeadGemvNorm* norm) {
  constexpr std::string_view kOp = "PerHeadGemv";
  if (rows < 0 || heads < 0 || heads > 65535 || in_dim < 0 || out_dim < 0 ||
      (rows > 0 && heads > 0 && out_dim > 0 && !PerHeadGemvSupported(rows, in_dim)) ||
      w_ld < in_dim || x_row_stride < 0 || x_head_stride < 0 || y_row_stride < 0 ||
      y_head_stride < 0 || w_head_stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PerHeadGemv: bad shape rows=", rows, " heads=", heads, " in_dim=", in_dim,
        " out_dim=", out_dim, " w_ld=", w_ld, " (need 1 <= rows <= ", kPerHeadGemvMaxRows,
        ", rows * in_dim * 4 + partials <= ", kPerHeadGemvMaxSmemBytes,
        " bytes, heads <= 65535, w_ld >= in_dim, non-negative strides; larger shapes go to a "
        "GEMM)"));
  }
  const bool fused = norm != nullptr && norm->w != nullptr;
  if (fused &&
      (heads != 1 || !PerHeadGemvNormFusible(x, x_row_stride, rows, in_dim, *norm) ||
       (out_dim > 0 &&
        BytesOverlap(norm->out, static_cast<size_t>((rows - 1) * norm->out_ld + in_dim) * 4, y,
                     static_cast<size_t>((rows - 1) * y_row_stride + out_dim) * 4)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PerHeadGemv: a fused RmsNorm needs one head, rows RmsNorm's vector kernel takes (x, w "
        "and out 16-byte aligned, strides and in_dim multiples of 4, in_dim <= 8192), out apart "
        "from x, w and y, and the stage within ",
        kPerHeadGemvMaxSmemBytes,
        " bytes "
        "(PerHeadGemvNormFusible); got rows=",
        rows, " heads=", heads, " in_dim=", in_dim, "; else run RmsNorm, then PerHeadGemv"));
  }
  if (rows == 0 || heads == 0 || out_dim == 0) return absl::OkStatus();
  // Outputs must not overlap (each is written by one thread; overlap would race).
  if ((heads > 1 && y_head_stride < out_dim) ||
      (rows > 1 && y_row_stride < (heads - 1) * y_head_stride + out_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PerHeadGemv: overlapping outputs: y_row_stride=", y_row_stride,
        " y_head_stride=", y_head_stride, " out_dim=", out_dim, " heads=", heads,
        " (need y_head_stride >= out_dim when heads > 1, y_row_stride >= the last head's end)"));
  }
  GLM_RETURN_IF_ERROR(CheckDevicePointer(y, kOp, "y"));
  if (in_dim > 0) {
    GLM_RETURN_IF_ERROR(CheckDevicePointer(x, kOp, "x"));
    GLM_RETURN_IF_ERROR(CheckDevicePointer(w, kOp, "w"));
  }
  const bool vec4 = reinterpret_cast<uintptr_t>(w) % 16 == 0 && w_ld % 4 == 0 &&
                    w_head_stride % 4 == 0 && in_dim % 4 == 0;
  const int m = static_cast<int>(rows);
  const KernelFn fn = vec4 ? PickKernel<4>(m) : PickKernel<1>(m);
  const int vec = vec4 ? 4 : 1;
  const size_t smem = SmemBytes(rows, in_dim, fused);
  GLM_ASSIGN_OR_RETURN(const int resident, ResidentCtas(fn, smem));

  // K slices: as few as keep every resident CTA slot busy (each slice at least one block of
  // kPhgUnroll chunks), since every slice beyond one adds a shared-memory reduction.
  const int64_t block_cols = int64_t{32} * vec * detail::kPhgUnroll;
  const int64_t k_blocks = std::max<int64_t>(1, (in_dim + block_cols - 1) / block_cols);
  int ksplit = 1;
  auto groups_for = [&](int ks) {
    const int64_t rows_per_cta = int64_t{detail::kPhgWarps / ks} * detail::kPhgRowsPerWarp;
    return (out_dim + rows_per_cta - 1) / rows_per_cta;
  };
  while (ksplit < detail::kPhgWarps && heads * groups_for(ksplit) < 2 * int64_t{resident} &&
         k_blocks >= 2 * ksplit) {
    ksplit *= 2;
  }
  PerHeadGemvArgs a;
  a.x = x;
  a.x_row_stride = x_row_stride;
  a.x_head_stride = x_head_stride;
  a.w = w;
  a.w_head_stride = w_head_stride;
  a.w_ld = w_ld;
  a.y = y;
  a.y_row_stride = y_row_stride;
  a.y_head_stride = y_head_stride;
  a.rows = m;
  a.in_dim = in_dim;
  a.out_dim = out_dim;
  a.ksplit = ksplit;
  a.groups = groups_for(ksplit);
  a.accumulate = accumulate;
  a.x_vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && x_row_stride % 4 == 0 &&
            x_head_stride % 4 == 0 && in_dim % 4 == 0;
  a.norm_w = nullptr;
  if (fused) {
    a.norm_w = norm->w;
    a.norm_eps = norm->eps;
    a.norm_threads =
        RmsNormF32VecThreads(in_dim, x, x_row_stride, norm->w, norm->out, norm->out_ld);
    a.norm_out = norm->out;
    a.norm_out_ld = norm->out_ld;
  }
  // One CTA per group: a CTA that loops over groups serializes one memory round trip per group
  // (the first measured version sized the grid to the resident slots: 3 CTAs per SM resident,
  // 5 groups each, 15.5 us at M = 1 under ncu); separate CTAs let the scheduler start the next
  // as one drains. The kernel still loops when groups exceed grid.x's limit.
  const int64_t per_head = std::min<int64_t>(a.groups, 0x7fffffff);
  const dim3 grid(static_cast<unsigned>(per_head), static_cast<unsigned>(heads));
  return CudaStatus(LaunchKernel(fn, grid, dim3(detail::kPhgThreads), smem, stream, a),
                    "PerHeadGemv launch");
}

}  // namespace glm::kernels
