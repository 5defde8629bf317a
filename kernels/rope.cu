#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope.h"

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
  // Rows on grid.y (at most 65535 per launch), chunks of kRopeThreads * kRopeItems pairs on
  // grid.x (CTAs loop when a row has more chunks than grid.x allows).
  const int64_t per_cta = int64_t{detail::kRopeThreads} * detail::kRopeItems;
  const int64_t chunks = std::min<int64_t>((heads * num_freqs + per_cta - 1) / per_cta, 1 << 20);
  const size_t es = dtype == DType::kF32 ? 4 : 2;
  const bool pair_vec = reinterpret_cast<uintptr_t>(x) % (2 * es) == 0 && row_stride % 2 == 0 &&
                        head_stride % 2 == 0;
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGridY) {
    const dim3 grid(static_cast<unsigned>(chunks),
                    static_cast<unsigned>(std::min(kMaxGridY, rows - r0)));
    const int32_t* pos = positions + r0;
    if (dtype == DType::kF32) {
      float* xr = static_cast<float*>(x) + r0 * row_stride;
      if (pair_vec) {
        LaunchKernel(detail::RopeInterleavedKernel<float, true>, grid, detail::kRopeThreads, 0,
                     stream, xr, heads, row_stride, head_stride, pos, inv_freq, num_freqs);
      } else {
        LaunchKernel(detail::RopeInterleavedKernel<float, false>, grid, detail::kRopeThreads, 0,
                     stream, xr, heads, row_stride, head_stride, pos, inv_freq, num_freqs);
      }
    } else {
      __nv_bfloat16* xr = static_cast<__nv_bfloat16*>(x) + r0 * row_stride;
      if (pair_vec) {
        LaunchKernel(detail::RopeInterleavedKernel<__nv_bfloat16, true>, grid, detail::kRopeThreads,
                     0, stream, xr, heads, row_stride, head_stride, pos, inv_freq, num_freqs);
      } else {
        LaunchKernel(detail::RopeInterleavedKernel<__nv_bfloat16, false>, grid,
                     detail::kRopeThreads, 0, stream, xr, heads, row_stride, head_stride, pos,
                     inv_freq, num_freqs);
      }
    }
  }
  return CudaStatus(cudaGetLastError(), "RopeInterleaved launch");
}

}  // namespace glm::kernels
