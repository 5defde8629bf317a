#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/cuda_util.h"
#include "kernels/launch.cuh"
#include "kernels/quant_fp8_group.cuh"
#include "kernels/quant_fp8_group.h"

namespace glm::kernels {

absl::Status QuantizeFp8Group(const void* x, int64_t ldx, int64_t m, int64_t k, void* q,
                              int64_t ldq, float* scales, int64_t scale_ld, cudaStream_t stream) {
  constexpr std::string_view kOp = "QuantizeFp8Group";
  if (m < 0 || k <= 0 || k % 4 != 0 || ldx < k || ldx % 4 != 0 || ldq < k || ldq % 4 != 0 ||
      scale_ld < m) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeFp8Group: bad shape m=", m, " k=", k, " ldx=", ldx, " ldq=", ldq,
        " scale_ld=", scale_ld,
        " (need m >= 0, k > 0 and a multiple of 4, ldx/ldq >= k and multiples of 4, "
        "scale_ld >= m)"));
  }
  if (m == 0) return absl::OkStatus();
  if (x == nullptr || q == nullptr || scales == nullptr) {
    return absl::InvalidArgumentError("QuantizeFp8Group: x, q and scales must be non-null");
  }
  GLM_RETURN_IF_ERROR(CheckAligned(x, 8, kOp, "x"));
  GLM_RETURN_IF_ERROR(CheckAligned(q, 4, kOp, "q"));
  GLM_RETURN_IF_ERROR(CheckAligned(scales, 4, kOp, "scales"));
  const int64_t items = m * ((k + 127) / 128);
  constexpr int kWarps = detail::kQuantThreads / 32;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  if (blocks > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeFp8Group: m*k too large (m=", m,
                                                   " k=", k, ")"));
  }
  LaunchKernel(detail::QuantFp8GroupKernel, static_cast<unsigned>(blocks), detail::kQuantThreads, 0,
               stream, static_cast<const __nv_bfloat16*>(x), ldx, m, k, static_cast<uint8_t*>(q),
               ldq, scales, scale_ld);
  return CudaStatus(cudaGetLastError(), "QuantizeFp8Group launch");
}

float E4m3ToFloat(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}

uint8_t FloatToE4m3Sat(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

void QuantizeFp8GroupHost(const float* x, int64_t ldx, int64_t m, int64_t k, uint8_t* q,
                          int64_t ldq, float* scales, int64_t scale_ld) {
  const int64_t groups = (k + 127) / 128;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * 128, c1 = std::min<int64_t>(k, c0 + 128);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x[r * ldx + c]));
      const float scale = amax / 448.0f;
      scales[g * scale_ld + r] = scale;
      for (int64_t c = c0; c < c1; ++c) {
        q[r * ldq + c] = scale > 0.0f ? FloatToE4m3Sat(x[r * ldx + c] / scale) : 0;
      }
    }
  }
}

}  // namespace glm::kernels
