#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rmsnorm.h"

namespace glm::kernels {
namespace {

// Threads for RmsNormRegKernel<.., kVec, kItems>: enough that each holds at most kItems vectors
// of the row; 0 when the row does not fit in one CTA's registers that way.
int RegThreads(int64_t cols, int vec, int items) {
  const int64_t per_thread = int64_t{vec} * items;
  const int64_t threads = (cols + per_thread - 1) / per_thread;
  if (threads > detail::kRmsNormRegMaxThreads) return 0;
  return static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32));
}

template <typename T, int kVec>
bool LaunchReg(const T* x, int64_t x_ld, const T* w, float eps, T* y, int64_t y_ld,
               int64_t cols, dim3 grid, cudaStream_t stream) {
  if (const int t = RegThreads(cols, kVec, 2); t > 0) {
    LaunchKernel(detail::RmsNormRegKernel<T, kVec, 2>, grid, t, 0, stream, x, x_ld, w, eps, y, y_ld,
                 cols);
    return true;
  }
  // Scalar rows: up to 8 elements a thread (16-byte vectors x 4 would spill at 1024 threads).
  if constexpr (kVec == 1) {
    if (const int t = RegThreads(cols, 1, 8); t > 0) {
      LaunchKernel(detail::RmsNormRegKernel<T, 1, 8>, grid, t, 0, stream, x, x_ld, w, eps, y, y_ld,
                   cols);
      return true;
    }
  }
  return false;
}

// Whether every row start and w are 16-byte aligned and cols divides into vectors of kVec.
bool VecAligned(int64_t cols, int vec, const void* x, int64_t x_ld, const void* w, const void* y,
                int64_t y_ld) {
  return cols % vec == 0 && x_ld % vec == 0 && y_ld % vec == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

template <typename T>
void LaunchRmsNorm(const T* x, int64_t x_ld, const T* w, float eps, T* y, int64_t y_ld,
                   int64_t cols, dim3 grid, cudaStream_t stream) {
  // 16-byte vectors when every row start and w are 16-byte aligned and cols divides evenly.
  constexpr int kVec = 16 / sizeof(T);
  const bool aligned = VecAligned(cols, kVec, x, x_ld, w, y, y_ld);
  if (aligned && LaunchReg<T, kVec>(x, x_ld, w, eps, y, y_ld, cols, grid, stream)) return;
  if (LaunchReg<T, 1>(x, x_ld, w, eps, y, y_ld, cols, grid, stream)) return;
  LaunchKernel(detail::RmsNormKernel<T>, grid, detail::kRmsNormThreads, 0, stream, x, x_ld, w, eps,
               y, y_ld, cols);
}

}  // namespace

int RmsNormF32VecThreads(int64_t cols, const float* x, int64_t x_ld, const float* w, const float* y,
                         int64_t y_ld) {
  if (cols <= 0 || !VecAligned(cols, 4, x, x_ld, w, y, y_ld)) return 0;
  return RegThreads(cols, 4, 2);  // LaunchReg<float, 4>'s first choice
}

absl::Status RmsNorm(DType dtype, const void* x, int64_t x_ld, const void* w, float eps, void* y,
                     int64_t y_ld, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr std::string_view kOp = "RmsNorm";
  if (rows < 0 || rows > 0x7fffffff || cols <= 0 || x_ld < cols || y_ld < cols ||
      !(eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RmsNorm: bad shape rows=", rows, " cols=", cols, " x_ld=", x_ld, " y_ld=", y_ld,
        " eps=", eps, " (need 0 <= rows < 2^31, cols > 0, ld >= cols, eps >= 0)"));
  }
  if (rows == 0) return absl::OkStatus();
  if (x == y && x_ld != y_ld) {
    return absl::InvalidArgumentError("RmsNorm: y aliases x with a different row stride");
  }
  GLM_RETURN_IF_ERROR(CheckDevicePointer(x, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(w, kOp, "w"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(y, kOp, "y"));
  const dim3 grid(static_cast<unsigned>(rows));
  if (dtype == DType::kF32) {
    LaunchRmsNorm(static_cast<const float*>(x), x_ld, static_cast<const float*>(w), eps,
                  static_cast<float*>(y), y_ld, cols, grid, stream);
  } else {
    LaunchRmsNorm(static_cast<const __nv_bfloat16*>(x), x_ld,
                  static_cast<const __nv_bfloat16*>(w), eps, static_cast<__nv_bfloat16*>(y),
                  y_ld, cols, grid, stream);
  }
  return CudaStatus(cudaGetLastError(), "RmsNorm launch");
}

}  // namespace glm::kernels
