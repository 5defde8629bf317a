// Test helpers for the GPU kernel tests: skip without a GPU, device buffers with guard bytes,
// bf16 <-> fp32 on the host.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_util.h"

namespace glm::kernels::testing {

// In a fixture's SetUp (or a test body): skips, printing why, when no CUDA device is usable.
#define GLM_SKIP_WITHOUT_GPU()                                                         \
  do {                                                                                 \
    int glm_n_ = 0;                                                                    \
    const cudaError_t glm_e_ = cudaGetDeviceCount(&glm_n_);                            \
    if (glm_e_ != cudaSuccess || glm_n_ == 0) {                                        \
      (void)cudaGetLastError();                                                        \
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount returned "                   \
                   << cudaGetErrorName(glm_e_) << " with " << glm_n_ << " devices";   \
    }                                                                                  \
  } while (0)

#define GLM_CUDA_ASSERT(expr)                                                          \
  do {                                                                                 \
    const cudaError_t glm_e_ = (expr);                                                 \
    ASSERT_EQ(glm_e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(glm_e_);     \
  } while (0)

inline constexpr size_t kGuardBytes = 256;
inline constexpr unsigned char kGuardByte = 0xA5;

// Device memory of `bytes` with kGuardBytes of a known pattern on each side; GuardsIntact()
// says whether a kernel wrote outside [data(), data() + bytes).
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&base_, bytes + 2 * kGuardBytes) != cudaSuccess) {
      base_ = nullptr;
      return;
    }
    cudaMemset(base_, kGuardByte, bytes + 2 * kGuardBytes);
  }
  ~GuardedBuffer() {
    if (base_ != nullptr) cudaFree(base_);
  }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  bool ok() const { return base_ != nullptr; }
  void* data() const { return static_cast<unsigned char*>(base_) + kGuardBytes; }
  template <typename T>
  T* as() const { return static_cast<T*>(data()); }
  size_t bytes() const { return bytes_; }

  cudaError_t Upload(const void* host, size_t n) {
    return cudaMemcpy(data(), host, n, cudaMemcpyHostToDevice);
  }
  cudaError_t Download(void* host, size_t n) const {
    return cudaMemcpy(host, data(), n, cudaMemcpyDeviceToHost);
  }
  // Fills the payload with `byte` (poison: unwritten outputs show up).
  cudaError_t Poison(unsigned char byte) { return cudaMemset(data(), byte, bytes_); }

  bool GuardsIntact() const {
    std::vector<unsigned char> g(kGuardBytes);
    for (size_t off : {size_t{0}, kGuardBytes + bytes_}) {
      if (cudaMemcpy(g.data(), static_cast<unsigned char*>(base_) + off, kGuardBytes,
                     cudaMemcpyDeviceToHost) != cudaSuccess) {
        return false;
      }
      for (unsigned char c : g) {
        if (c != kGuardByte) return false;
      }
    }
    return true;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// Parameter names for tests parameterized over DType.
inline std::string DTypeName(const ::testing::TestParamInfo<DType>& info) {
  return info.param == DType::kF32 ? "f32" : "bf16";
}

inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Cheap deterministic bulk random numbers (xorshift64; test weights reach 160 MB).
struct XorShiftRng {
  uint64_t s;
  explicit XorShiftRng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<uint32_t>(s >> 16);
  }
  float Uniform() { return (Next() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }  // [-1, 1)
};

}  // namespace glm::kernels::testing
