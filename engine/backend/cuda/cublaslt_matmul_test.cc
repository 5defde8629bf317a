// LtMatmul's plan cache (cublaslt_matmul.h): bounded, least recently used evicted, results of an
// evicted and re-made plan unchanged, against a host fp32 GEMM. Skips (printing why) without a
// usable GPU.
#include "engine/backend/cuda/cublaslt_matmul.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/gpu_test_util.h"

namespace glm::engine::cuda {
namespace {

// y[m, n] = x[m, k] . w[n, k]^T on the GPU through `mm`, compared to the host.
void RunAndCheck(LtMatmul& mm, int64_t m, int64_t n, int64_t k) {
  std::mt19937 rng(static_cast<uint32_t>(m * 1000003 + n * 1009 + k));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(m * k), w(n * k), y(m * n, 0.0f);
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng);
  void *vx = nullptr, *vw = nullptr, *vy = nullptr;
  ASSERT_EQ(cudaMalloc(&vx, x.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&vw, w.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&vy, y.size() * 4), cudaSuccess);
  float *dx = static_cast<float*>(vx), *dw = static_cast<float*>(vw), *dy = static_cast<float*>(vy);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  GemmShape s;
  s.m = m, s.n = n, s.k = k, s.x_ld = k, s.w_ld = k, s.y_ld = n;
  ASSERT_TRUE(mm.Run(s, dx, dw, dy, /*accumulate=*/false, nullptr).ok());
  ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  double max_diff = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int64_t c = 0; c < k; ++c) ref += double{x[i * k + c]} * w[j * k + c];
      max_diff = std::max(max_diff, std::abs(ref - y[i * n + j]));
    }
  }
  EXPECT_LT(max_diff, 1e-4 * k) << m << "x" << n << "x" << k;
  cudaFree(dx), cudaFree(dw), cudaFree(dy);
}

TEST(LtMatmulPlanCache, RejectsZeroCapacity) {
  // Checked before any CUDA call: runs without a GPU too.
  const auto mm = LtMatmul::Create(1 << 20, 0);
  ASSERT_FALSE(mm.ok());
  EXPECT_NE(mm.status().message().find("max_plans"), std::string::npos) << mm.status();
}

TEST(LtMatmulPlanCache, EvictsLeastRecentlyUsedAndRemakesCorrectly) {
  GLM_SKIP_WITHOUT_GPU();
  auto mm = LtMatmul::Create(4 << 20, /*max_plans=*/2);
  ASSERT_TRUE(mm.ok()) << mm.status();
  LtMatmul& lt = **mm;
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(lt, 1, 64, 96));  // A
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(lt, 3, 64, 96));  // B
  EXPECT_EQ(lt.num_plans(), 2u);
  EXPECT_EQ(lt.plans_made(), 2u);
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(lt, 1, 64, 96));  // A: a hit, now most recent
  EXPECT_EQ(lt.plans_made(), 2u);
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(lt, 5, 48, 32));  // C evicts B (LRU), not A
  EXPECT_EQ(lt.num_plans(), 2u);
  EXPECT_EQ(lt.plans_made(), 3u);
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(lt, 1, 64, 96));  // A still cached
  EXPECT_EQ(lt.plans_made(), 3u);
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(lt, 3, 64, 96));  // B re-made (evicts C)
  EXPECT_EQ(lt.plans_made(), 4u);
  EXPECT_EQ(lt.num_plans(), 2u);
  // Many shapes (prefill chunk lengths): the cache never exceeds its bound.
  for (int64_t m = 1; m <= 24; ++m) ASSERT_NO_FATAL_FAILURE(RunAndCheck(lt, m, 32, 64));
  EXPECT_EQ(lt.num_plans(), 2u);
  EXPECT_EQ(lt.plans_made(), 28u);
}

}  // namespace
}  // namespace glm::engine::cuda
