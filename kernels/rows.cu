#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/rows.cuh"
#include "kernels/rows.h"

namespace glm::kernels {
namespace {

absl::Status CheckShape(std::string_view op, int64_t rows, int64_t cols,
                        std::initializer_list<int64_t> lds) {
  bool ok = rows >= 0 && cols >= 0;
  for (int64_t ld : lds) ok = ok && ld >= cols;
  if (!ok) {
    std::string lds_text;
    for (int64_t ld : lds) absl::StrAppend(&lds_text, " ld=", ld);
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(op), ": bad shape rows=", rows,
                                                   " cols=", cols, lds_text,
                                                   " (need rows, cols >= 0 and ld >= cols)"));
  }
  return absl::OkStatus();
}

dim3 Grid(int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  return dim3(static_cast<unsigned>(std::min<int64_t>(
      (total + detail::kRowsThreads - 1) / detail::kRowsThreads, int64_t{1} << 20)));
}

}  // namespace

absl::Status FillRows(float* y, int64_t y_ld, int64_t rows, int64_t cols, float value,
                      cudaStream_t stream) {
  GLM_RETURN_IF_ERROR(CheckShape("FillRows", rows, cols, {y_ld}));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(y, "FillRows", "y"));
  LaunchKernel(detail::FillRowsKernel, Grid(rows, cols), detail::kRowsThreads, 0, stream, y, y_ld,
               rows, cols, value);
  return CudaStatus(cudaGetLastError(), "FillRows launch");
}

absl::Status AddRows(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t rows,
                     int64_t cols, cudaStream_t stream) {
  GLM_RETURN_IF_ERROR(CheckShape("AddRows", rows, cols, {x_ld, y_ld}));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (x == y && x_ld != y_ld) {
    return absl::InvalidArgumentError("AddRows: y aliases x with a different row stride");
  }
  GLM_RETURN_IF_ERROR(CheckDevicePointer(x, "AddRows", "x"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(y, "AddRows", "y"));
  LaunchKernel(detail::AddRowsKernel, Grid(rows, cols), detail::kRowsThreads, 0, stream, x, x_ld, y,
               y_ld, rows, cols);
  return CudaStatus(cudaGetLastError(), "AddRows launch");
}

absl::Status CopyRows(const float* src, int64_t src_ld, const int32_t* src_rows, float* dst,
                      int64_t dst_ld, const int32_t* dst_rows, int64_t rows, int64_t cols,
                      cudaStream_t stream) {
  constexpr std::string_view kOp = "CopyRows";
  GLM_RETURN_IF_ERROR(CheckShape(kOp, rows, cols, {src_ld, dst_ld}));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(src, kOp, "src"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(dst, kOp, "dst"));
  if (src_rows != nullptr) GLM_RETURN_IF_ERROR(CheckDevicePointer(src_rows, kOp, "src_rows"));
  if (dst_rows != nullptr) GLM_RETURN_IF_ERROR(CheckDevicePointer(dst_rows, kOp, "dst_rows"));
  LaunchKernel(detail::CopyRowsKernel, Grid(rows, cols), detail::kRowsThreads, 0, stream, src,
               src_ld, src_rows, dst, dst_ld, dst_rows, rows, cols);
  return CudaStatus(cudaGetLastError(), "CopyRows launch");
}

}  // namespace glm::kernels
