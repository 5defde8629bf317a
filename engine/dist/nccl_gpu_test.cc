// Real NCCL on real GPUs, called only through the FunctionTable (this binary links neither NCCL
// nor CUDA): GLM_NCCL_LIBRARY names libnccl.so.2; the CUDA runtime is dlopen'ed from
// GLM_CUDART_LIBRARY or the default search path. Skips, saying why, when either is missing or no
// GPU is visible; fails when GLM_NCCL_LIBRARY is set but does not load. tools/gpu/run_nccl_test.sh
// finds torch's bundled libraries and runs this.
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/dist/in_process_rendezvous.h"
#include "engine/dist/nccl_communicator.h"
#include "engine/dist/testdata/nccl_table_dlopen.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

// The few CUDA runtime entry points the test needs (C ABI, stable across CUDA 11-13).
struct CudaRt {
  int (*GetDeviceCount)(int*);
  int (*SetDevice)(int);
  int (*Malloc)(void**, size_t);
  int (*Free)(void*);
  int (*Memcpy)(void*, const void*, size_t, int);
  int (*StreamCreate)(void**);
  int (*StreamDestroy)(void*);
  int (*StreamQuery)(void*);
  int (*StreamSynchronize)(void*);
  const char* (*GetErrorString)(int);
};
constexpr int kHostToDevice = 1, kDeviceToHost = 2, kErrorNotReady = 600;

// nullptr with `why` set when no runtime loads.
const CudaRt* LoadCudaRt(std::string* why) {
  static CudaRt rt{};
  static std::string error;
  static bool loaded = [] {
    std::vector<std::string> names;
    if (const char* env = std::getenv("GLM_CUDART_LIBRARY")) names.push_back(env);
    names.insert(names.end(), {"libcudart.so", "libcudart.so.13", "libcudart.so.12"});
    void* h = nullptr;
    for (const std::string& n : names) {
      if ((h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (h == nullptr) {
      error = "no CUDA runtime (set GLM_CUDART_LIBRARY to libcudart.so.*)";
      return false;
    }
    bool ok = true;
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, name));
      if (f == nullptr) {
        ok = false;
        error = absl::StrCat("the CUDA runtime has no ", name);
      }
    };
    sym(rt.GetDeviceCount, "cudaGetDeviceCount");
    sym(rt.SetDevice, "cudaSetDevice");
    sym(rt.Malloc, "cudaMalloc");
    sym(rt.Free, "cudaFree");
    sym(rt.Memcpy, "cudaMemcpy");
    sym(rt.StreamCreate, "cudaStreamCreate");
    sym(rt.StreamDestroy, "cudaStreamDestroy");
    sym(rt.StreamQuery, "cudaStreamQuery");
    sym(rt.StreamSynchronize, "cudaStreamSynchronize");
    sym(rt.GetErrorString, "cudaGetErrorString");
    return ok;
  }();
  *why = error;
  return loaded ? &rt : nullptr;
}

class CudaStream : public DeviceStream {
 public:
  explicit CudaStream(const CudaRt* rt) : rt_(rt) { rt_->StreamCreate(&stream_); }
  ~CudaStream() override { rt_->StreamDestroy(stream_); }
  nccl::Stream handle() const override { return stream_; }
  absl::StatusOr<bool> Query() override {
    int r = rt_->StreamQuery(stream_);
    if (r == 0) return true;
    if (r == kErrorNotReady) return false;
    return absl::InternalError(absl::StrCat("cudaStreamQuery: ", rt_->GetErrorString(r)));
  }

 private:
  const CudaRt* rt_;
  void* stream_ = nullptr;
};

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("GLM_NCCL_LIBRARY");
    if (path == nullptr || *path == '\0') {
      GTEST_SKIP() << "GLM_NCCL_LIBRARY is not set (tools/gpu/run_nccl_test.sh sets it)";
    }
    // The library loads and fills the table on any machine; only the collectives need a GPU.
    auto lib = testing::DlopenNccl(path);
    ASSERT_TRUE(lib.ok()) << lib.status();
    lib_ = *lib;
    int version = 0;
    ASSERT_EQ(lib_.table.GetVersion(&version), 0);
    std::printf("NCCL %d from %s: every FunctionTable symbol resolved\n", version, path);
    std::string why;
    rt_ = LoadCudaRt(&why);
    if (rt_ == nullptr) GTEST_SKIP() << why;
    int devices = 0;
    int r = rt_->GetDeviceCount(&devices);
    if (r != 0 || devices == 0) {
      GTEST_SKIP() << "no GPU visible (cudaGetDeviceCount: " << rt_->GetErrorString(r) << ", "
                   << devices << " devices)";
    }
    devices_ = devices;
    std::printf("%d GPU(s)\n", devices_);
  }

  // Runs one all-reduce over `n` GPUs (one thread and rank per device) and checks every rank.
  void AllReduceOnGpus(int n, size_t count, int bench_iters) {
    InProcessRendezvous rendezvous;
    std::string prefix = absl::StrCat("gpu-test/", n, "/", count);
    std::vector<std::string> failures(n);
    std::vector<double> seconds(n, 0.0);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank) {
      threads.emplace_back([&, rank] {
        auto fail = [&](std::string msg) { failures[rank] = std::move(msg); };
        if (rt_->SetDevice(rank) != 0) return fail("cudaSetDevice");
        CudaStream stream(rt_);
        float* device = nullptr;
        float* scratch = nullptr;
        if (rt_->Malloc(reinterpret_cast<void**>(&device), count * sizeof(float)) != 0 ||
            rt_->Malloc(reinterpret_cast<void**>(&scratch), sizeof(float)) != 0) {
          return fail("cudaMalloc");
        }
        std::vector<float> host(count);
        for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>((i % 97) + rank);
        rt_->Memcpy(device, host.data(), count * sizeof(float), kHostToDevice);
        NcclCommunicatorOptions options;
        options.rank = rank;
        options.size = n;
        options.key_prefix = prefix;
        options.op_timeout = std::chrono::seconds(60);
        options.barrier_scratch = scratch;
        auto comm = NcclCommunicator::Create(lib_.table, &stream, &rendezvous, options);
        if (!comm.ok()) return fail(std::string(comm.status().message()));
        absl::Status s = (*comm)->AllReduceSum(device, count);
        if (s.ok()) s = (*comm)->Synchronize();
        if (!s.ok()) return fail(std::string(s.message()));
        std::vector<float> back(count);
        rt_->Memcpy(back.data(), device, count * sizeof(float), kDeviceToHost);
        for (size_t i = 0; i < count; ++i) {
          // sum over ranks of (i % 97 + rank): exact in fp32 for these magnitudes.
          float want = static_cast<float>(n * (i % 97) + n * (n - 1) / 2);
          if (back[i] != want) {
            return fail(absl::StrCat("element ", i, " is ", back[i], ", expected ", want));
          }
        }
        if (bench_iters > 0) {
          s = (*comm)->Barrier();
          auto t0 = std::chrono::steady_clock::now();
          for (int it = 0; it < bench_iters && s.ok(); ++it) s = (*comm)->AllReduceSum(device, count);
          if (s.ok()) s = (*comm)->Synchronize();
          seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (!s.ok()) return fail(std::string(s.message()));
        }
        comm->reset();
        rt_->Free(device);
        rt_->Free(scratch);
      });
    }
    for (auto& t : threads) t.join();
    for (int rank = 0; rank < n; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
    if (bench_iters > 0) {
      double t = 0;
      for (double s : seconds) t = std::max(t, s);
      t /= bench_iters;
      double algbw = count * sizeof(float) / t / 1e9;
      std::printf("nccl allreduce gpus=%d bytes=%zu KiB time=%.3f ms algbw=%.1f GB/s busbw=%.1f GB/s\n",
                  n, count * sizeof(float) / 1024, t * 1e3, algbw,
                  n > 1 ? algbw * 2.0 * (n - 1) / n : algbw);
    }
  }

  const CudaRt* rt_ = nullptr;
  int devices_ = 0;
  testing::DlopenedNccl lib_;
};

TEST_F(NcclGpuTest, OneRankAllReduceOnDeviceMemoryThroughTheTable) {
  AllReduceOnGpus(1, 1 << 20, 0);
}

TEST_F(NcclGpuTest, AllReduceAcrossEveryVisibleGpu) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2+ GPUs, " << devices_ << " visible";
  AllReduceOnGpus(devices_, 1 << 20, 0);
  for (size_t count : {size_t{1} << 18, size_t{1} << 24}) AllReduceOnGpus(devices_, count, 20);
}

}  // namespace
}  // namespace glm::engine
