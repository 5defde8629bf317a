// Scratch for the CUDA op benches (cuda_ops_bench, cuda_kv_bench): one cudaMalloc'd buffer per
// slot, grown on demand, freed on destruction.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_ops.h"

namespace glm::engine::cuda {

class BenchScratch final : public Scratch {
 public:
  ~BenchScratch() override {
    for (void* p : ptr_) cudaFree(p);
  }
  absl::StatusOr<void*> Get(int slot, size_t bytes) override {
    if (bytes > size_[slot]) {
      cudaFree(ptr_[slot]);
      if (cudaMalloc(&ptr_[slot], bytes) != cudaSuccess) {
        return absl::ResourceExhaustedError("bench scratch: cudaMalloc failed");
      }
      size_[slot] = bytes;
    }
    return ptr_[slot];
  }

 private:
  void* ptr_[kScratchSlots] = {};
  size_t size_[kScratchSlots] = {};
};

}  // namespace glm::engine::cuda
