// Shared by the CUDA op benches (cuda_kv_bench, cuda_indexer_bench): a device buffer, its upload
// and the comma-list flag parser.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/bench_util.h"

namespace glm::engine::cuda {

// cudaMalloc'd device memory (at least 16 bytes), every byte set to `fill` (kDefaultFill unless
// given); the bench stops if either call fails.
template <int kDefaultFill>
struct BenchBuffer {
  void* p = nullptr;
  explicit BenchBuffer(size_t bytes, int fill = kDefaultFill) {
    BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    BENCH_CHECK(cudaMemset(p, fill, std::max<size_t>(bytes, 16)));
  }
  ~BenchBuffer() { cudaFree(p); }
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

template <int kFill, typename T>
void Upload(const BenchBuffer<kFill>& d, const std::vector<T>& v) {
  BENCH_CHECK(cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// "1,8,64" -> {1, 8, 64}; items that are not integers are skipped.
inline std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int x = 0;
    if (absl::SimpleAtoi(p, &x)) v.push_back(x);
  }
  return v;
}

}  // namespace glm::engine::cuda
