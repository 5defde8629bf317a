// Shared by the CUDA op tests (cuda_ops_test, cuda_indexer_test): a cudaMalloc-backed scratch
// whose new memory is poisoned so a kernel reading scratch it never wrote shows up.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

namespace glm::engine::cuda {

// Grow-only scratch, one buffer per slot; new memory is poisoned with 0xFF bytes (NaN floats,
// -1 ints).
class TestScratch final : public Scratch {
 public:
  ~TestScratch() override {
    for (void* p : ptr_) cudaFree(p);
  }
  // The last buffer of `slot` (e.g. the indexer's score kernel writes its scores [rows, ld] into
  // slot 0).
  void* Peek(int slot) const { return ptr_[slot]; }
  absl::StatusOr<void*> Get(int slot, size_t bytes) override {
    if (slot < 0 || slot >= kScratchSlots) return absl::InvalidArgumentError("bad scratch slot");
    if (bytes > size_[slot]) {
      cudaFree(ptr_[slot]);
      ptr_[slot] = nullptr;
      if (cudaMalloc(&ptr_[slot], bytes) != cudaSuccess) {
        return absl::ResourceExhaustedError("test scratch: cudaMalloc failed");
      }
      cudaMemset(ptr_[slot], 0xFF, bytes);
      size_[slot] = bytes;
    }
    return ptr_[slot];
  }

 private:
  void* ptr_[kScratchSlots] = {};
  size_t size_[kScratchSlots] = {};
};

}  // namespace glm::engine::cuda
