// The one-launch MoE decode kernel (cuda_ops_moe.cu MoeDecodeOneKernel) finishes, with the bits
// of the three-launch path, even when its grid cannot be resident all at once: a "hog" kernel
// on another stream fills all but two SMs with CTAs that take an SM's whole shared memory and
// wait for the host. The MoE grid then gets the two free SMs only; a down task waiting for
// gate|up tasks of CTAs that cannot become resident must stop waiting and compute them itself.
// The MoE call must complete while the hog still holds the SMs (the host polls its event for
// 5 s, then releases the hog either way). The three-launch path (no waits between CTAs) runs
// first under the same hog as the harness's control. Without a usable GPU the test skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_bench_scratch.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_ops_moe.h"

namespace glm::engine {
namespace {

constexpr unsigned long long kHogLimitNs = 10ull * 1000 * 1000 * 1000;

__device__ unsigned long long NowNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One CTA per SM (all of its shared memory): counts itself in *started, then waits until
// *release != 0 (both host-mapped) or kHogLimitNs have passed (then counts a timeout).
__global__ void HogKernel(unsigned int* started, const volatile int* release, int* timeouts) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) {
    smem[0] = 1;
    atomicAdd_system(started, 1u);
    const unsigned long long t0 = NowNs();
    while (*release == 0) {
      if (NowNs() - t0 > kHogLimitNs) {
        atomicAdd(timeouts, 1);
        break;
      }
      __nanosleep(10000);  // 10 us between reads of host memory
    }
  }
  __syncthreads();
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

class MoeProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    if (major < 8) GTEST_SKIP() << "compute capability " << major << ".x below 8.0";
  }
  void TearDown() override { cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeOneLaunchMaxTokens); }

  template <typename T>
  T* Upload(const std::vector<T>& v) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    allocs_.push_back(p);
    return static_cast<T*>(p);
  }
  ~MoeProgressTest() override {
    for (void* p : allocs_) cudaFree(p);
  }

  std::vector<void*> allocs_;
};

TEST_F(MoeProgressTest, OneLaunchFinishesWhenItsGridIsNotAllResident) {
  // 7 experts of 2 tokens x top-4 at hidden 2048 / moe_inter 1024: 7 x (512 + 512) tasks, four
  // rounds of the (full-GPU) balanced grid, so a warp's third task (the down tasks of slot 0)
  // waits for the first round's gate|up tasks of CTAs 0..63, which cannot be resident while
  // CTAs 0..3 hold the two free SMs.
  constexpr int kExperts = 8, kHidden = 2048, kInter = 1024, kTokens = 2, kTopK = 4;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
  };
  std::vector<MatView> gate, up, down;
  for (int e = 0; e < kExperts; ++e) {
    gate.push_back({Upload(random(size_t{kInter} * kHidden)), kInter, kHidden, kHidden});
    up.push_back({Upload(random(size_t{kInter} * kHidden)), kInter, kHidden, kHidden});
    down.push_back({Upload(random(size_t{kHidden} * kInter)), kHidden, kInter, kInter});
  }
  const ExpertWeights ew{gate.data(), up.data(), down.data(), kExperts};
  const std::vector<int32_t> ids = {3, 7, 1, 0, 7, 2, 5, 6};  // expert 7 in both tokens
  const std::vector<float> w = {0.4f, 0.3f, 0.2f, 0.1f, 0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<float> x = random(size_t{kTokens} * kHidden), out0 = random(x.size());
  int32_t* d_ids = Upload(ids);
  float* d_w = Upload(w);
  float* d_x = Upload(x);
  float* d_out = Upload(out0);
  const MatView xv{d_x, kTokens, kHidden, kHidden}, ov{d_out, kTokens, kHidden, kHidden};
  cuda::BenchScratch scratch;
  cudaStream_t s = nullptr, h = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking));
  auto run = [&](std::vector<float>& got) {
    EXPECT_EQ(cudaMemcpyAsync(d_out, out0.data(), out0.size() * 4, cudaMemcpyHostToDevice, s),
              cudaSuccess);
    const absl::Status st = cuda::MoeExperts(xv, d_ids, d_w, kTopK, ew, ov, scratch, s);
    EXPECT_TRUE(st.ok()) << st;
    got.resize(out0.size());
    EXPECT_EQ(cudaMemcpyAsync(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost, s),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  };
  // The reference: three launches; then the one-launch kernel with the whole GPU.
  std::vector<float> three, alone, crowded3, crowded1;
  cuda::SetMoeOneLaunchMaxTokens(0);
  run(three);
  ASSERT_FALSE(cuda::LastMoeOneLaunch());
  cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeDecodeMaxPairs);
  run(alone);
  ASSERT_TRUE(cuda::LastMoeOneLaunch());
  ASSERT_EQ(std::memcmp(alone.data(), three.data(), three.size() * 4), 0);

  // The hog: one CTA per SM on all but two SMs, each holding the SM's shared memory.
  int sms = 0, smem = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUDA_OK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  ASSERT_GT(sms, 2);
  CUDA_OK(cudaFuncSetAttribute(HogKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int* host = nullptr;  // started, release
  CUDA_OK(cudaHostAlloc(&host, 2 * sizeof(int), cudaHostAllocMapped));
  int* d_host = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(&d_host, host, 0));
  int* d_timeouts = Upload(std::vector<int>{0});
  cudaEvent_t done = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const int hogs = sms - 2;
  volatile int* vhost = host;
  // Runs the MoE call under the hog; returns the ms until it completed, or -1 if it did not
  // within 5 s (the hog is released then either way).
  auto crowded = [&](bool one_launch, std::vector<float>& got) -> double {
    vhost[0] = 0;
    vhost[1] = 0;
    HogKernel<<<hogs, 1024, smem, h>>>(reinterpret_cast<unsigned int*>(d_host), d_host + 1,
                                       d_timeouts);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    while (vhost[0] < hogs && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    EXPECT_EQ(vhost[0], hogs) << "the hog CTAs did not all start";
    cuda::SetMoeOneLaunchMaxTokens(one_launch ? cuda::kMoeDecodeMaxPairs : 0);
    EXPECT_EQ(cudaMemcpyAsync(d_out, out0.data(), out0.size() * 4, cudaMemcpyHostToDevice, s),
              cudaSuccess);
    const auto t1 = std::chrono::steady_clock::now();
    const absl::Status st = cuda::MoeExperts(xv, d_ids, d_w, kTopK, ew, ov, scratch, s);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(cuda::LastMoeOneLaunch(), one_launch);
    EXPECT_EQ(cudaEventRecord(done, s), cudaSuccess);
    double ms = -1;
    while (std::chrono::steady_clock::now() - t1 < std::chrono::seconds(5)) {
      if (cudaEventQuery(done) == cudaSuccess) {
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1)
                 .count();
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    vhost[1] = 1;  // release the hog
    got.resize(out0.size());
    EXPECT_EQ(cudaMemcpyAsync(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost, s),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(h), cudaSuccess);
    return ms;
  };
  const double ms3 = crowded(false, crowded3);
  const double ms1 = crowded(true, crowded1);
  cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeOneLaunchMaxTokens);
  std::printf(
      "under a hog on %d of %d SMs: three launches done after %.1f ms, one launch after "
      "%.1f ms (-1: not within 5 s)\n",
      hogs, sms, ms3, ms1);
  int timeouts = -1;
  CUDA_OK(cudaMemcpy(&timeouts, d_timeouts, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(timeouts, 0) << "the hog waited past its own limit";
  ASSERT_GE(ms3, 0) << "control: the three-launch MoE did not finish under the hog (harness)";
  EXPECT_GE(ms1, 0) << "the one-launch MoE did not finish while the hog held " << hogs << " of "
                    << sms << " SMs";
  EXPECT_EQ(std::memcmp(crowded3.data(), three.data(), three.size() * 4), 0);
  EXPECT_EQ(std::memcmp(crowded1.data(), three.data(), three.size() * 4), 0)
      << "the crowded one-launch result differs from three launches";
  // Counters are zero again: a further call alone still equals three launches.
  run(alone);
  EXPECT_EQ(std::memcmp(alone.data(), three.data(), three.size() * 4), 0);
  cudaEventDestroy(done);
  cudaFreeHost(host);
  cudaStreamDestroy(s);
  cudaStreamDestroy(h);
}
}  // namespace
}  // namespace glm::engine
