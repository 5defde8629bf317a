// fp8 block-scaled Linear GEMM (DeepSeek-V3 / GLM-5 FP8 checkpoints):
//   y[M,N] (+)= xq[M,K] · (w ⊙ s_w)[N,K]^T
// w: e4m3 [N, K] (weight [out, in]) with fp32 block scales s_w [ceil(N/128), ceil(K/128)]
// (`weight_scale_inv`, a multiplier: W ≈ w[i,j] · s_w[i/128, j/128]). x: bf16 [M, K], quantized
// on the fly per token per 128-column group to e4m3 with an fp32 scale (quant_fp8_group.h).
// Per 128-wide K block b the product of the two fp8 tiles is accumulated in fp32 and added with
// the two scales applied: y[m,n] = Σ_b s_x[m,b] · s_w[n/128,b] · Σ_{k in b} q[m,k] · w[n,k].
// Output bf16 or fp32, optionally accumulated into y.
//
// Two implementations behind one plan:
// - kCublasLt: cuBLASLt with A = w (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) and B = xq
//   (VEC128_32F), "TN" layout. cuBLAS 12.9+/13.x documents these modes for compute capability 9.0
//   only, with M and N multiples of 4, 16-byte aligned rows (K % 16 == 0) and the weight scales
//   K-major with a row stride of ceil(K/128) rounded up to 4.
// - kOwnKernel (gemm_fp8_block.cuh): ours, every arch from sm_89 (compiled for 90a, 100, 121),
//   any M and N, K % 16 == 0, any weight-scale row stride >= ceil(K/128).
// kAuto picks cuBLASLt where it applies and its heuristic finds an algorithm, else ours.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cublaslt_util.h"
#include "kernels/cuda_util.h"
#include "kernels/device_limits.h"
#include "kernels/kernel_policy.h"

namespace glm::kernels {

enum class GemmFp8Path { kAuto, kCublasLt, kOwnKernel };
const char* GemmFp8PathName(GemmFp8Path path);

struct GemmFp8BlockShape {
  int64_t m = 0;             // num_tokens (0 allowed: Run is a no-op)
  int64_t n = 0;             // out_features
  int64_t k = 0;             // in_features; multiple of 16; w rows are contiguous (ld = k)
  int64_t ldx = 0;           // row stride of x (bf16 elements, multiple of 4, >= k); 0 = k
  int64_t ldy = 0;           // row stride of y (elements, >= n); 0 = n
  int64_t w_scale_ld = 0;    // row stride of s_w (floats, >= ceil(k/128)); 0 = ceil(k/128)
  DType out = DType::kBF16;

  std::string DebugString() const;
};

class GemmFp8BlockPlan {
 public:
  // Plans for the current device. InvalidArgument for a bad shape; FailedPrecondition when
  // `path` is kCublasLt and the device or shape does not allow it (the message says which rule).
  // `handle` must outlive the plan. policy.smem_cap_bytes / max_sms cap the device limits our
  // kernel's plan is made for (QueryDeviceLimits).
  static absl::StatusOr<std::unique_ptr<GemmFp8BlockPlan>> Create(
      const BlasLtHandle& handle, const GemmFp8BlockShape& shape,
      GemmFp8Path path = GemmFp8Path::kAuto, size_t max_cublas_workspace_bytes = size_t{32} << 20,
      const KernelPolicy& policy = {});

  // x: bf16 [m, k] (ldx); w: e4m3 [n, k]; w_scale: fp32 [ceil(n/128), w_scale_ld]; y: [m, n]
  // (ldy) of shape.out. Device pointers, 16-byte aligned (x: 8-byte). accumulate: y += result.
  // workspace: >= workspace_bytes() of device memory, 256-byte aligned; holds the quantized x,
  // its scales, split-K partials and cuBLASLt's workspace. Enqueues 1-3 kernels on `stream`;
  // allocates nothing. Not thread-safe per plan (the cuBLASLt path sets scale pointers on the
  // plan's descriptor).
  absl::Status Run(const void* x, const void* w, const float* w_scale, void* y, bool accumulate,
                   void* workspace, size_t workspace_bytes, cudaStream_t stream) const;

  GemmFp8Path path() const { return path_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  const GemmFp8BlockShape& shape() const { return shape_; }
  // Own kernel only: how it is tiled (for benches and logs).
  std::string DebugString() const;

 private:
  GemmFp8BlockPlan() = default;
  // Builds the cuBLASLt descriptors and asks the heuristic (variant: see Create).
  absl::Status SetUpCublasLt(int variant, size_t max_workspace_bytes);

  GemmFp8BlockShape shape_;
  GemmFp8Path path_ = GemmFp8Path::kOwnKernel;
  // Workspace carve-up (byte offsets, each 256-aligned).
  size_t xq_offset_ = 0, xs_offset_ = 0, partial_offset_ = 0, lt_offset_ = 0;
  int64_t xs_ld_ = 0;  // scale stride of the quantized x (M rounded up to 4)
  size_t lt_workspace_bytes_ = 0;
  size_t workspace_bytes_ = 0;
  // Own kernel launch geometry.
  int m_tiles_per_warp_ = 1;
  int splits_ = 1;
  int kblocks_per_split_ = 0;
  int own_blocks_per_sm_ = 0;  // resident CTAs per SM of the launched instantiation
  // cuBLASLt state.
  cublasLtHandle_t handle_ = nullptr;
  LtMatmulDesc desc_;
  LtLayout a_, b_, c_;
  cublasLtMatmulAlgo_t algo_{};
  int lt_variant_ = -1;
};

// Own-kernel launch planning, pure function of the shape and the device (tested without a GPU):
// m_tiles_per_warp: 16-row MMA tiles each warp covers (1 for small M, 2 for large);
// splits: K split across CTAs so that the grid fills one wave of resident CTAs at decode sizes
// (limits.max_blocks_per_sm_cap = the kernel's occupancy; 4 when 0).
struct GemmFp8OwnTiling {
  int m_tiles_per_warp = 1;
  int splits = 1;
  int kblocks_per_split = 0;
};
GemmFp8OwnTiling PlanGemmFp8Own(int64_t m, int64_t n, int64_t k, const DeviceLimits& limits);

}  // namespace glm::kernels
