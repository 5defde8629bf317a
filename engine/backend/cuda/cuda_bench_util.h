// Shared by the CUDA op benches (cuda_kv_bench, cuda_indexer_bench): a device buffer, its upload
// and the comma-list flag parser.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
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

// The sweep flags the benches share: --rows and --keys (comma lists), --trials and --calls (each
// at least 1).
struct SweepFlags {
  std::vector<int> rows, keys;
  int trials = 3, calls = 20;
  // Takes flag `k` with value `v`; false when `k` is not one of the above (the caller's own).
  bool Parse(const std::string& k, const std::string& v) {
    if (k == "--rows") rows = ParseInts(v);
    else if (k == "--keys") keys = ParseInts(v);
    else if (k == "--trials") trials = std::max(1, std::atoi(v.c_str()));
    else if (k == "--calls") calls = std::max(1, std::atoi(v.c_str()));
    else return false;
    return true;
  }
};

}  // namespace glm::engine::cuda
