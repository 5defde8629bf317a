#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope.h"

namespace glm::kernels {

absl::Status RopeInterleaved(DType dtype, void* x, int64_t rows, int64_t heads, int64_t row_stride,
                             int64_t head_stride, const int32_t* positions, const float* inv_freq,
                             int num_freqs, cudaStream_t stream, const RopeHeads* second) {
  constexpr std::string_view kOp = "RopeInterleaved";
  auto bad_set = [&](int64_t h, int64_t hs) {
    return h <= 0 || (h > 1 && hs < 2 * num_freqs) || row_stride < (h - 1) * hs + 2 * num_freqs;
  };
  if (rows < 0 || rows > 0x7fffffff || num_freqs <= 0 || num_freqs > kRopeMaxFreqs ||
      bad_set(heads, head_stride) ||
      (second != nullptr &&
       (bad_set(second->heads, second->head_stride) || second->x == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RopeInterleaved: bad shape rows=", rows, " heads=", heads, " num_freqs=", num_freqs,
        " row_stride=", row_stride, " head_stride=", head_stride,
        second != nullptr
            ? absl::StrCat(" second heads=", second->heads, " head_stride=", second->head_stride)
            : std::string(),
        " (need 1 <= num_freqs <= ", kRopeMaxFreqs,
        ", non-overlapping heads: head_stride >= 2*num_freqs, row_stride >= last head's end)"));
  }
  if (rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(x, kOp, "x"));
  if (second != nullptr) GLM_RETURN_IF_ERROR(CheckDevicePointer(second->x, kOp, "second x"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(positions, kOp, "positions"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(inv_freq, kOp, "inv_freq"));
  // Rows on grid.y (at most 65535 per launch), chunks of kRopeThreads * kRopeItems pairs on
  // grid.x (CTAs loop when a row has more chunks than grid.x allows).
  const int64_t heads2 = second != nullptr ? second->heads : 0;
  const int64_t head_stride2 = second != nullptr ? second->head_stride : 0;
  const int64_t per_cta = int64_t{detail::kRopeThreads} * detail::kRopeItems;
  const int64_t chunks =
      std::min<int64_t>(((heads + heads2) * num_freqs + per_cta - 1) / per_cta, 1 << 20);
  const size_t es = dtype == DType::kF32 ? 4 : 2;
  const bool pair_vec =
      reinterpret_cast<uintptr_t>(x) % (2 * es) == 0 && row_stride % 2 == 0 &&
      head_stride % 2 == 0 &&
      (second == nullptr ||
       (reinterpret_cast<uintptr_t>(second->x) % (2 * es) == 0 && head_stride2 % 2 == 0));
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGridY) {
    const dim3 grid(static_cast<unsigned>(chunks),
                    static_cast<unsigned>(std::min(kMaxGridY, rows - r0)));
    const int32_t* pos = positions + r0;
    auto launch = [&](auto* base, auto* base2) {
      using T = std::remove_pointer_t<decltype(base)>;
      T* xr = base + r0 * row_stride;
      T* xr2 = base2 != nullptr ? base2 + r0 * row_stride : xr;
      auto kernel = pair_vec ? detail::RopeInterleavedKernel<T, true>
                             : detail::RopeInterleavedKernel<T, false>;
      LaunchKernel(kernel, grid, detail::kRopeThreads, 0, stream, xr, heads, row_stride,
                   head_stride, pos, inv_freq, num_freqs, xr2, heads2, head_stride2);
    };
    if (dtype == DType::kF32) {
      launch(static_cast<float*>(x), second != nullptr ? static_cast<float*>(second->x) : nullptr);
    } else {
      launch(static_cast<__nv_bfloat16*>(x),
             second != nullptr ? static_cast<__nv_bfloat16*>(second->x) : nullptr);
    }
  }
  return CudaStatus(cudaGetLastError(), "RopeInterleaved launch");
}

}  // namespace glm::kernels
