#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/argmax.cuh"
#include "kernels/argmax.h"
#include "kernels/launch.cuh"

namespace glm::kernels {

absl::Status ArgmaxRows(DType dtype, const void* logits, int64_t ld, int64_t rows, int64_t vocab,
                        int32_t* out_ids, cudaStream_t stream) {
  constexpr std::string_view kOp = "ArgmaxRows";
  if (rows < 0 || rows > 0x7fffffff || vocab <= 0 || vocab > 0x7ffffffe || ld < vocab) {
    return absl::InvalidArgumentError(absl::StrCat("ArgmaxRows: bad shape rows=", rows,
                                                   " vocab=", vocab, " ld=", ld,
                                                   " (need 0 <= rows < 2^31, 0 < vocab < 2^31, "
                                                   "ld >= vocab)"));
  }
  if (rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(logits, kOp, "logits"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(out_ids, kOp, "out_ids"));
  const dim3 grid(static_cast<unsigned>(rows));
  if (dtype == DType::kF32) {
    LaunchKernel(detail::ArgmaxRowsKernel<float>, grid, detail::kArgmaxThreads, 0, stream,
                 static_cast<const float*>(logits), ld, static_cast<int32_t>(vocab), out_ids);
  } else {
    LaunchKernel(detail::ArgmaxRowsKernel<__nv_bfloat16>, grid, detail::kArgmaxThreads, 0, stream,
                 static_cast<const __nv_bfloat16*>(logits), ld, static_cast<int32_t>(vocab),
                 out_ids);
  }
  return CudaStatus(cudaGetLastError(), "ArgmaxRows launch");
}

}  // namespace glm::kernels
