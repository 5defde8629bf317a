#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/launch.cuh"
#include "kernels/sample.cuh"
#include "kernels/sample.h"
#include "kernels/sample_rule.h"

namespace glm::kernels {
namespace {

constexpr int64_t kMinIdsPerCta = 8192;

// Per device: the largest cluster of SampleRowsKernel CTAs that can be resident (0 = not yet
// asked; 1 = no clusters) and the SM count. Written once per device, read without a lock.
constexpr int kMaxDevices = 64;
std::atomic<int> g_max_cluster[kMaxDevices];
std::atomic<int> g_num_sms[kMaxDevices];

struct ClusterLimits {
  int max_cluster = 1;
  int num_sms = 1;
};

absl::StatusOr<ClusterLimits> DeviceClusterLimits() {
  int dev = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kMaxDevices) {
    const int known = g_max_cluster[dev].load(std::memory_order_relaxed);
    const int sms = g_num_sms[dev].load(std::memory_order_relaxed);
    if (known > 0 && sms > 0) return ClusterLimits{known, sms};
  }
  int major = 0, num_sms = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  // Clusters need the kernel's sm_90+ code (ClusterSize() is 1 in code compiled for an older
  // virtual architecture, which would then index rows by blockIdx / 1 out of bounds).
  cudaFuncAttributes fa{};
  GLM_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&fa, detail::SampleRowsKernel));
  int best = 1;
  if (major >= 9 && fa.ptxVersion >= 90) {
    // Non-portable sizes (16 on H100/H200) when the device allows them; else the portable 8.
    const cudaError_t np = cudaFuncSetAttribute(
        detail::SampleRowsKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (np != cudaSuccess) (void)cudaGetLastError();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(16, 1, 1);
    cfg.blockDim = dim3(detail::kSampleThreads, 1, 1);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxPotentialClusterSize(&n, detail::SampleRowsKernel, &cfg) == cudaSuccess &&
        n > 1) {
      best = n;
    } else {
      (void)cudaGetLastError();
    }
  }
  num_sms = std::max(num_sms, 1);
  if (dev >= 0 && dev < kMaxDevices) {
    g_max_cluster[dev].store(best, std::memory_order_relaxed);
    g_num_sms[dev].store(num_sms, std::memory_order_relaxed);
  }
  return ClusterLimits{best, num_sms};
}

}  // namespace

absl::StatusOr<int> SampleClusterSize(int64_t vocab, int64_t rows, int32_t max_cluster) {
  GLM_ASSIGN_OR_RETURN(const ClusterLimits lim, DeviceClusterLimits());
  int64_t c = max_cluster;
  if (max_cluster <= 0) {
    // Enough ids per CTA to pay for the cluster's synchronisation, and no more CTAs than the
    // SMs can hold at once: with many rows, one CTA per row already fills the GPU.
    c = std::min<int64_t>((vocab + kMinIdsPerCta - 1) / kMinIdsPerCta,
                          lim.num_sms / std::max<int64_t>(rows, 1));
  }
  c = std::min<int64_t>(c, lim.max_cluster);
  return static_cast<int>(std::max<int64_t>(c, 1));
}

absl::Status SampleRows(const SampleRowsArgs& a, cudaStream_t stream) {
  constexpr std::string_view kOp = "SampleRows";
  if (a.rows < 0 || a.rows > 0x7fffffff || a.vocab <= 0 || a.vocab >= sample_rule::kMaxVocab ||
      a.ld < a.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SampleRows: bad shape rows=", a.rows, " vocab=", a.vocab, " ld=", a.ld,
        " (need 0 <= rows < 2^31, 0 < vocab < 2^22, ld >= vocab)"));
  }
  if (a.rows == 0) return absl::OkStatus();
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.logits, kOp, "logits"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.temperature, kOp, "temperature"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.top_k, kOp, "top_k"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.top_p, kOp, "top_p"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.seed, kOp, "seed"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.index, kOp, "index"));
  GLM_RETURN_IF_ERROR(CheckDevicePointer(a.out_ids, kOp, "out_ids"));
  if (a.out_logprobs != nullptr) {
    GLM_RETURN_IF_ERROR(CheckDevicePointer(a.out_logprobs, kOp, "out_logprobs"));
  }
  if (a.max_cluster < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleRows: max_cluster ", a.max_cluster, " (need 0 = auto, or >= 1)"));
  }
  GLM_ASSIGN_OR_RETURN(const int cluster, SampleClusterSize(a.vocab, a.rows, a.max_cluster));
  if (a.rows * cluster > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("SampleRows: rows=", a.rows, " x ", cluster,
                                                   " CTAs per row exceeds the grid limit"));
  }
  const int32_t vocab = static_cast<int32_t>(a.vocab);
  if (cluster == 1) {
    LaunchKernel(detail::SampleRowsKernel, static_cast<unsigned>(a.rows), detail::kSampleThreads, 0,
                 stream, a.logits, a.ld, vocab, a.temperature, a.top_k, a.top_p, a.seed, a.index,
                 a.out_ids, a.out_logprobs);
    return CudaStatus(cudaGetLastError(), "SampleRows launch");
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.rows * cluster), 1, 1);
  cfg.blockDim = dim3(detail::kSampleThreads, 1, 1);
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return CudaStatus(cudaLaunchKernelEx(&cfg, detail::SampleRowsKernel, a.logits, a.ld, vocab,
                                       a.temperature, a.top_k, a.top_p, a.seed, a.index,
                                       a.out_ids, a.out_logprobs),
                    absl::StrCat("SampleRows cluster launch (", cluster, " CTAs per row)"));
}

}  // namespace glm::kernels
