// Backend::WriteLatentFp8 / WriteIndexKeysFp8 / GatherLatentFp8 on the CUDA backend: the
// backend's views as kernels/kv_fp8.h's plain arguments (bytes bit-identical to the CPU
// backend's, cpu_kv_fp8.cc).
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "kernels/kv_fp8.h"

namespace glm::engine::cuda {
namespace {

kernels::LatentFp8Cache Latent(const Fp8LatentCache& c) {
  return {c.data, c.num_slots, c.kv_lora_rank, c.rope_dim};
}

}  // namespace

absl::Status WriteLatentFp8(const MatView& src, const int32_t* slots, const Fp8LatentCache& dst,
                            cudaStream_t stream) {
  return kernels::WriteLatentFp8(src.data, src.ld, src.rows, src.cols, slots, Latent(dst), stream);
}

absl::Status WriteIndexKeysFp8(const MatView& src, const int32_t* slots, const Fp8IndexCache& dst,
                               cudaStream_t stream) {
  return kernels::WriteIndexKeysFp8(src.data, src.ld, src.rows, src.cols, slots,
                                    {dst.data, dst.num_slots, dst.dim, dst.block_size}, stream);
}

absl::Status GatherLatentFp8(const Fp8LatentCache& src, const int32_t* slots, const MatView& out,
                             cudaStream_t stream) {
  return kernels::GatherLatentFp8(Latent(src), slots, out.data, out.ld, out.rows, out.cols,
                                  stream);
}

}  // namespace glm::engine::cuda
