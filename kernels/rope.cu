#include "kernels/rope.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/rope.cuh"

namespace glm::kernels {

absl::Status RopeInterleaved(DType dtype, void* x, int64_t rows, int64_t heads,
                             int64_t row_stride, int64_t head_stride, const int32_t* positions,
                             const float* inv_freq, int num_freqs, cudaStream_t stream) {
  constexpr std::string_view kOp = "RopeInterleaved";
  if (rows < 0 || rows > 0x7fffffff || heads <= 0 || num_freqs <= 0 ||
      num_freqs > kRopeMaxFreqs || (heads > 1 && head_stride < 2 * num_freqs) ||
      row_stride < (heads - 1) * head_stride + 2 * num_freqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RopeInterleaved: bad shape rows=", rows, " heads=", heads, " num_freqs=", num_freqs,
        " row_stride=", row_stride, " head_stride=", head_stride,
        " (need 1 <= num_freqs <= ", kRopeMaxFreqs,
        ", non-overlapping heads: head_stride >= 2*num_freqs, row_stride >= last head's end)"));
  }
  if (rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(x, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(positions, kOp, "positions"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(inv_freq, kOp, "inv_freq"));
  const dim3 grid(static_cast<unsigned>(rows));
  if (dtype == DType::kF32) {
    detail::RopeInterleavedKernel<float><<<grid, detail::kRopeThreads, 0, stream>>>(
        static_cast<float*>(x), heads, row_stride, head_stride, positions, inv_freq, num_freqs);
  } else {
    detail::RopeInterleavedKernel<__nv_bfloat16><<<grid, detail::kRopeThreads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(x), heads, row_stride, head_stride, positions, inv_freq,
        num_freqs);
  }
  return CudaStatus(cudaGetLastError(), "RopeInterleaved launch");
}

}  // namespace glm::kernels
