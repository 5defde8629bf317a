#include "kernels/sample.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/sample.cuh"
#include "kernels/sample_rule.h"

namespace glm::kernels {

absl::Status SampleRows(const SampleRowsArgs& a, cudaStream_t stream) {
  constexpr std::string_view kOp = "SampleRows";
  if (a.rows < 0 || a.rows > 0x7fffffff || a.vocab <= 0 || a.vocab >= sample_rule::kMaxVocab ||
      a.ld < a.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleRows: bad shape rows=", a.rows, " vocab=", a.vocab, " ld=", a.ld,
        " (need 0 <= rows < 2^31, 0 < vocab < 2^22, ld >= vocab)"));
  }
  if (a.rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.logits, kOp, "logits"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.temperature, kOp, "temperature"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.top_k, kOp, "top_k"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.top_p, kOp, "top_p"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.seed, kOp, "seed"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.index, kOp, "index"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.out_ids, kOp, "out_ids"));
  if (a.out_logprobs != nullptr) {
    GLM_RETURN_IF_ERROR(CheckDevicePointer(a.out_logprobs, kOp, "out_logprobs"));
  }
  detail::SampleRowsKernel<<<static_cast<unsigned>(a.rows), detail::kSampleThreads, 0, stream>>>(
      a.logits, a.ld, static_cast<int32_t>(a.vocab), a.temperature, a.top_k, a.top_p, a.seed,
      a.index, a.out_ids, a.out_logprobs);
  return CudaStatus(cudaGetLastError(), "SampleRows launch");
}

}  // namespace glm::kernels
