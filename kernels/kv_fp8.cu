// fp8 KV cache launchers (kv_fp8.h): shape checks naming the rule, one launch each. Device code
// in kv_fp8.cuh.
#include "kernels/kv_fp8.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/kv_fp8.cuh"
#include "kernels/kv_fp8_layout.h"
#include "kernels/launch.cuh"
#include "kernels/op_util.h"

namespace glm::kernels {
namespace {

using kv_fp8::kKvFp8Threads;

absl::Status CheckLatent(const LatentFp8Cache& c, const char* op) {
  if (!kv_fp8::LatentShapeOk(c.kv_lora_rank, c.rope_dim) || !detail::Aligned16(c.data)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", op, ": fp8 latent cache needs kv_lora_rank % 4 == 0 (", c.kv_lora_rank,
        "), an even rope dim (", c.rope_dim, ") and 16-byte aligned data"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteLatentFp8(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                            const int32_t* slots, const LatentFp8Cache& dst, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckLatent(dst, "WriteLatentFp8"));
  if (cols != dst.kv_lora_rank + dst.rope_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda WriteLatentFp8: src has ", cols, " columns, the cache rows ",
        dst.kv_lora_rank + dst.rope_dim, " (kv_lora_rank + rope)"));
  }
  LaunchKernel(kv_fp8::WriteLatentKernel, static_cast<unsigned>(rows), kKvFp8Threads, 0, stream,
               src, src_ld, slots, dst.data, dst.kv_lora_rank, dst.rope_dim);
  return detail::CudaCheck(cudaGetLastError(), "WriteLatentFp8", "launch");
}

absl::Status WriteIndexKeysFp8(const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                               const int32_t* slots, const IndexFp8Cache& dst,
                               cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (!kv_fp8::IndexShapeOk(dst.dim) || cols != dst.dim || dst.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda WriteIndexKeysFp8: key dim ", dst.dim, " (src cols ", cols,
        ") must match and be a multiple of 4, block_size ", dst.block_size, " > 0"));
  }
  const int64_t ctas = detail::CeilDiv(rows, kKvFp8Threads / 32);
  LaunchKernel(kv_fp8::WriteIndexKernel, static_cast<unsigned>(ctas), kKvFp8Threads, 0, stream,
               src, src_ld, rows, slots, dst.data, dst.dim, dst.block_size);
  return detail::CudaCheck(cudaGetLastError(), "WriteIndexKeysFp8", "launch");
}

absl::Status GatherLatentFp8(const LatentFp8Cache& src, const int32_t* slots, float* out,
                             int64_t out_ld, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckLatent(src, "GatherLatentFp8"));
  if (cols != src.kv_lora_rank + src.rope_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda GatherLatentFp8: out has ", cols, " columns, the cache rows ",
        src.kv_lora_rank + src.rope_dim));
  }
  LaunchKernel(kv_fp8::GatherLatentKernel, static_cast<unsigned>(rows), kKvFp8Threads, 0, stream,
               src.data, slots, src.kv_lora_rank, src.rope_dim, out, out_ld);
  return detail::CudaCheck(cudaGetLastError(), "GatherLatentFp8", "launch");
}

}  // namespace glm::kernels
