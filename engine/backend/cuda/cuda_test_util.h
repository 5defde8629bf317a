// Shared by the CUDA op tests (cuda_ops_test, cuda_indexer_test): a cudaMalloc-backed scratch
// whose new memory is poisoned so a kernel reading scratch it never wrote shows up.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

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

// Host paged key tables (KeyTable::slots / row_offset) of rows with `nkeys[t]` keys each: row t
// takes the first nkeys[t] of its own std::shuffle of `all_slots` (one shuffle per row, in row
// order, drawing from `rng`).
template <typename Rng>
void ShuffledKeyTable(const std::vector<int32_t>& all_slots, const std::vector<int32_t>& nkeys,
                      Rng& rng, std::vector<int32_t>* table, std::vector<int32_t>* offset) {
  table->clear();
  offset->assign(nkeys.size(), 0);
  for (size_t t = 0; t < nkeys.size(); ++t) {
    (*offset)[t] = static_cast<int32_t>(table->size());
    std::vector<int32_t> perm(all_slots);
    std::shuffle(perm.begin(), perm.end(), rng);
    table->insert(table->end(), perm.begin(), perm.begin() + nkeys[t]);
  }
}

}  // namespace glm::engine::cuda
