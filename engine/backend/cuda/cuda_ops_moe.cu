// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

namespace glm::engine::cuda {

absl::Status MoeExperts(const MatView&, const int32_t*, const float*, int, const ExpertWeights&,
                        const MatView&, Scratch&, cudaStream_t) {
  return absl::UnimplementedError("cuda MoeExperts: kernel not written yet");
}

}  // namespace glm::engine::cuda
