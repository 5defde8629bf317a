// cuda_ops.h uses absl::StatusOr without including its header.
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

namespace glm::engine::cuda {

absl::Status Attention(const AttentionArgs&, Scratch&, cudaStream_t) {
  return absl::UnimplementedError("cuda Attention: kernel not written yet");
}

}  // namespace glm::engine::cuda
