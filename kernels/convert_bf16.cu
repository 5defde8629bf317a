// convert_bf16 launcher (convert_bf16.h). Device code in convert_bf16.cuh.
#include "kernels/convert_bf16.h"

#include <algorithm>

#include "kernels/convert_bf16.cuh"
#include "kernels/launch.cuh"
#include "kernels/op_util.h"

namespace glm::kernels {

absl::Status ConvertRowsToBf16(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                               void* dst, int64_t dst_ld, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (src_ld < cols || dst_ld < cols) {
    return absl::InvalidArgumentError(absl::StrCat("cuda ConvertRowsToBf16: row strides ", src_ld,
                                                   " / ", dst_ld, " below cols ", cols));
  }
  const int64_t total = rows * cols;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 4096));
  LaunchKernel(detail::ConvertRowsToBf16Kernel, blocks, threads, 0, stream, src, src_ld, rows,
               cols, static_cast<__nv_bfloat16*>(dst), dst_ld);
  return detail::CudaCheck(cudaGetLastError(), "Linear", "ConvertRowsToBf16Kernel launch");
}

}  // namespace glm::kernels
