#include "engine/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/backend/cuda/cublaslt_matmul.h"
#include "engine/backend/cuda/cuda_device_stream.h"
#include "engine/backend/cuda/cuda_indexer.h"
#include "engine/backend/cuda/cuda_linear.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_quant_linear.h"
#include "kernels/cuda_util.h"
#include "kernels/layernorm.h"
#include "kernels/moe_route.h"
#include "kernels/per_head_gemv.h"
#include "kernels/per_head_narrow.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/rows.h"
#include "kernels/sample.h"
#include "kernels/silu_mul.h"

namespace glm::engine {
namespace {

using kernels::CudaStatus;

// AbsorbPerHead: token counts up to this run kernels/per_head_narrow (weights streamed as
// stored); more widen the weight blocks to fp32 once and run the fp32 per-head GEMM.
// per_head_narrow_bench (H200, GLM-5 widths, µs, new kernel bf16 / fp8 vs the fp32 cuBLASLt
// GEMM alone): W_UK 5.9 / 5.4 vs 9.8 at 1 token, 18.6 / 14.9 vs 18.9 at 8, 125 / 102 vs 23.5
// at 64; W_UV 9.2 / 9.5 vs 11.0 at 1, 32.7 / 48.0 vs 26.3 at 8, 223 / 356 vs 34.4 at 64. So the
// kernel up to 8 tokens (decode batches), the widened GEMM beyond (its speed is the fp32 GEMM's
// plus the widening). W_UV at 2..8 tokens measured both ways in the decode step (fp8, 4K, graphs
// on, ms/layer): batch 2 / 4 / 8 0.366 / 0.501 / 0.788 with the kernel vs 0.493 / 0.719 / 1.084
// widening, so both products take the kernel up to 8.
constexpr int64_t kAbsorbKernelMaxTokens = 8;

// cuBLASLt workspace: enough for split-K on every shape the model issues.
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

class DeviceBuffer : public Buffer {
 public:
  DeviceBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~DeviceBuffer() override {
    if (data_ != nullptr) cudaFree(data_);
  }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

// Grow-only device scratch (cuda_ops.h). Growing waits for the stream (the old block may still
// be read by enqueued work) and is refused while the stream is being captured.
class DeviceScratch : public cuda::Scratch {
 public:
  explicit DeviceScratch(cudaStream_t stream) : stream_(stream) {}
  ~DeviceScratch() override {
    for (Slot& s : slots_) {
      if (s.data != nullptr) cudaFree(s.data);
    }
  }
  absl::StatusOr<void*> Get(int slot, size_t bytes) override {
    if (slot < 0 || slot >= cuda::kScratchSlots) {
      return absl::InvalidArgumentError(absl::StrCat("Scratch::Get: slot ", slot,
                                                     " outside [0, ", cuda::kScratchSlots, ")"));
    }
    Slot& s = slots_[slot];
    if (bytes <= s.bytes && s.data != nullptr) return s.data;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    GLM_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Scratch::Get: slot ", slot, " must grow from ", s.bytes, " to ", bytes,
          " bytes during CUDA graph capture; run the step once eagerly before capturing"));
    }
    GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    if (s.data != nullptr) GLM_CUDA_RETURN_IF_ERROR(cudaFree(s.data));
    s.data = nullptr;
    s.bytes = 0;
    // 1.5x headroom, 2 MiB granularity: a few growth steps cover a warming workload.
    const size_t want = std::max(bytes + bytes / 2, size_t{1} << 21);
    const size_t rounded = (want + (size_t{1} << 21) - 1) & ~((size_t{1} << 21) - 1);
    if (const cudaError_t err = cudaMalloc(&s.data, rounded); err != cudaSuccess) {
      (void)cudaGetLastError();
      s.data = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat(
          "CUDA scratch slot ", slot, ": cudaMalloc(", rounded, ") failed: ",
          cudaGetErrorString(err), "; lower max_num_batched_tokens or the KV cache budget"));
    }
    s.bytes = rounded;
    ++epoch_;  // graphs captured before this point hold the freed block
    return s.data;
  }
  int64_t epoch() const { return epoch_; }

 private:
  struct Slot {
    void* data = nullptr;
    size_t bytes = 0;
  };
  cudaStream_t stream_;
  std::array<Slot, cuda::kScratchSlots> slots_{};
  int64_t epoch_ = 0;
};

// An instantiated CUDA graph (Backend::EndCapture).
class CudaGraph : public BackendGraph {
 public:
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraphExec_t exec_;
};

// fp32 Linears of one row whose weight is at most this large run kernels::PerHeadGemv (one
// head) instead of cuBLASLt: the MoE router (256 x 6144, 6.3 MB). Larger weights stay on
// cuBLASLt, which streams them at up to 3.9 TB/s (benchmarks.md).
constexpr size_t kSmallF32GemvMaxWeightBytes = size_t{16} << 20;

// RmsNormLinear runs fused for calls of at most this many rows whose shape the fused kernel
// takes (the decode GEMV's limit).
constexpr int64_t kNormLinearFusionMaxRows = kernels::kGemvNarrowMaxM;
// Observers for tests: whether the last RmsNormLinear call ran as one fused launch
// (LastCudaNormLinearFused), and how many AbsorbPerHead launches ran beside the previous kernel
// (CudaAbsorbBesideLaunches), and how quantized experts ran (CudaQuantExpertCallCounts). None
// changes what runs.
std::atomic<bool> g_norm_linear_fused{false};
std::atomic<int64_t> g_absorb_beside_launches{0};
std::atomic<int64_t> g_quant_experts_narrow{0};
std::atomic<int64_t> g_quant_experts_widened{0};

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream, std::unique_ptr<cuda::LtMatmul> matmul,
              std::unique_ptr<cuda::NarrowLinear> narrow, std::unique_ptr<cuda::QuantLinear> quant,
              const kernels::KernelPolicy& policy)
      : policy_(policy),
        device_(device),
        stream_(stream),
        main_stream_(stream),
        matmul_(std::move(matmul)),
        narrow_(std::move(narrow)),
        quant_(std::move(quant)),
        scratch_(stream),
        widen_scratch_(stream) {}
  ~CudaBackend() override {
    if (Bind()) {
      JoinSide();
      cudaStreamSynchronize(stream_);
    }
    matmul_.reset();
    narrow_.reset();
    quant_.reset();
    if (side_stream_ != nullptr) cudaStreamDestroy(side_stream_);
    if (fork_event_ != nullptr) cudaEventDestroy(fork_event_);
    if (join_event_ != nullptr) cudaEventDestroy(join_event_);
    cudaStreamDestroy(stream_);
  }

  // Allocate (sticky: a failed cudaMalloc is the backend's error) or TryAllocate (not: the
  // caller handles the empty buffer). A failed memset is always recorded.
  std::unique_ptr<Buffer> AllocateOr(size_t bytes, bool sticky) {
    void* p = nullptr;
    if (!Bind()) return std::make_unique<DeviceBuffer>(nullptr, 0);
    const size_t alloc = std::max<size_t>(bytes, 1);
    if (const cudaError_t err = cudaMalloc(&p, alloc); err != cudaSuccess) {
      (void)cudaGetLastError();  // cudaMalloc's errors are not sticky for the context
      if (sticky) {
        Record(absl::ResourceExhaustedError(
            absl::StrCat("CUDA backend: cudaMalloc(", bytes, ") failed: ", cudaGetErrorString(err),
                         "; the model, KV cache and workspaces do not fit on device ", device_,
                         ": lower the KV cache budget or shard the model")));
      }
      return std::make_unique<DeviceBuffer>(nullptr, 0);
    }
    Record(CudaStatus(cudaMemsetAsync(p, 0, alloc, stream_), "Allocate: cudaMemsetAsync"));
    return std::make_unique<DeviceBuffer>(p, bytes);
  }

  std::string name() const override { return "cuda"; }
  // The main stream (a collective enqueued there follows every op, side branches once joined).
  DeviceStream* device_stream() override { return &device_stream_; }
  int num_threads() const override { return 1; }
  absl::Status status() const override { return status_; }
  // Every WeightDType; INT4 / INT8 / NVFP4 through cuda_quant_linear.h, in the shapes
  // kernels/gemv_quant.h takes.
  bool SupportsWeightDType(WeightDType) const override { return true; }
  bool SupportsQuantizedShape(WeightDType dtype, int64_t rows, int64_t cols,
                              int64_t group_size) const override {
    return !IsQuantizedWeight(dtype) ||
           cuda::QuantShapeSupported(dtype, rows, cols, group_size);
  }

  std::unique_ptr<Buffer> Allocate(size_t bytes) override { return AllocateOr(bytes, true); }
  std::unique_ptr<Buffer> TryAllocate(size_t bytes) override { return AllocateOr(bytes, false); }

  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || !Bind()) return;
    Record(CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                      "CopyToDevice: cudaMemcpyAsync"));
  }

  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || !Bind() || !MainOnly("CopyToHost")) return;
    JoinSide();
    Record(CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                      "CopyToHost: cudaMemcpyAsync"));
    Synchronize();
  }

  void Synchronize() override {
    if (!Bind() || !MainOnly("Synchronize")) return;
    JoinSide();
    Record(Annotate(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"),
                    "CUDA backend (an earlier enqueued op faulted; rerun under compute-sanitizer "
                    "or with CUDA_LAUNCH_BLOCKING=1 to find it)"));
  }

  void Linear(const MatView& x, const MatView& w, const MatView& y, bool accumulate) override {
    if (x.rows == 0 || w.rows == 0 || !Bind() || !MainOnly("Linear")) return;
    if (x.cols == 0) {
      if (!accumulate) Fill(y, 0.0f);
      return;
    }
    if (IsQuantizedWeight(w.dtype)) {  // INT4 / INT8 / NVFP4 weights: cuda_quant_linear.h
      Record(Annotate(quant_->Run(x, w, y, accumulate, policy_, scratch_, widen_scratch_,
                                  *narrow_, stream_),
                      "Linear"));
      return;
    }
    if (w.dtype != WeightDType::kF32) {  // bf16 / fp8 weights: cuda_linear.h
      Record(Annotate(narrow_->Run(x, w, y, accumulate, policy_, scratch_, stream_), "Linear"));
      return;
    }
    if (SmallF32Gemv(x, w)) {
      Record(Annotate(kernels::PerHeadGemv(x.data, x.ld, 0, w.data, 0, w.ld, y.data, y.ld, 0,
                                           x.rows, 1, x.cols, w.rows, accumulate, stream_),
                      "Linear"));
      return;
    }
    cuda::GemmShape s;
    s.m = x.rows;
    s.n = w.rows;
    s.k = x.cols;
    s.x_ld = x.ld;
    s.w_ld = w.ld;
    s.y_ld = y.ld;
    Record(Annotate(matmul_->Run(s, x.data, w.data, y.data, accumulate, stream_), "Linear"));
  }

  void LinearPerHead(const HeadsView& x, const float* weights, int64_t weight_head_stride,
                     int64_t w_ld, const HeadsView& y) override {
    if (x.rows == 0 || x.heads == 0 || y.dim == 0 || !Bind() || !MainOnly("LinearPerHead")) return;
    if (x.dim == 0) {
      for (int64_t h = 0; h < y.heads; ++h) Fill(y.Head(h), 0.0f);
      return;
    }
    PerHeadGemm(x, weights, weight_head_stride, w_ld, y, "LinearPerHead");
  }

  // y[:, h] = x[:, h] @ W_h^T per head on cuBLASLt (fp32; W_h [y.dim, x.dim] at
  // weights + h * weight_head_stride, row stride w_ld); errors recorded as `what`.
  void PerHeadGemm(const HeadsView& x, const float* weights, int64_t weight_head_stride,
                   int64_t w_ld, const HeadsView& y, const char* what) {
    cuda::GemmShape s;
    s.m = x.rows;
    s.n = y.dim;
    s.k = x.dim;
    s.x_ld = x.row_stride;
    s.w_ld = w_ld;
    s.y_ld = y.row_stride;
    s.batch = x.heads;
    s.x_batch_stride = x.head_stride;
    s.w_batch_stride = weight_head_stride;
    s.y_batch_stride = y.head_stride;
    Record(Annotate(matmul_->Run(s, x.data, weights, y.data, false, stream_), what));
  }

  // One kernels/per_head_narrow launch per product (all heads), any WeightDType.
  void AbsorbPerHead(const HeadsView& x, const MatView& w, int64_t head_rows, int64_t row_begin,
                     PerHeadContract contract, const HeadsView& y) override {
    AbsorbPerHeadOn(x, w, head_rows, row_begin, contract, y, /*beside=*/false);
  }

  // Beside the previous kernel (PerHeadNarrowArgs::beside_previous) only when the previous op on
  // this backend was IndexerTopK, whose kernels all wait for their predecessor before they let
  // dependents launch (the rule the narrow kernel's early start relies on); otherwise in order.
  void AbsorbPerHeadBesidePrevious(const HeadsView& x, const MatView& w, int64_t head_rows,
                                   int64_t row_begin, PerHeadContract contract,
                                   const HeadsView& y) override {
    const bool beside =
        kernels::PdlLaunches() && op_serial_ == indexer_serial_ && indexer_serial_ > 0;
    AbsorbPerHeadOn(x, w, head_rows, row_begin, contract, y, beside);
  }

  void AbsorbPerHeadOn(const HeadsView& x, const MatView& w, int64_t head_rows, int64_t row_begin,
                       PerHeadContract contract, const HeadsView& y, bool beside) {
    if (x.rows == 0 || x.heads == 0 || y.dim == 0 || !Bind() || !MainOnly("AbsorbPerHead")) return;
    if (x.dim == 0) {
      for (int64_t h = 0; h < y.heads; ++h) Fill(y.Head(h), 0.0f);
      return;
    }
    if (IsQuantizedWeight(w.dtype)) {
      Record(absl::InvalidArgumentError(
          "AbsorbPerHead: the weight is INT4 / INT8 / NVFP4; this op takes fp32 / bf16 / fp8 "
          "(WeightLoader widens a quantized kv_b_proj at load: LinearPart::keep_quantized)"));
      return;
    }
    kernels::PerHeadNarrowArgs a;
    a.contract = contract == PerHeadContract::kRows ? kernels::PerHeadContract::kRows
                                                    : kernels::PerHeadContract::kCols;
    a.weight = w.dtype == WeightDType::kF32    ? kernels::PerHeadWeight::kF32
               : w.dtype == WeightDType::kBF16 ? kernels::PerHeadWeight::kBF16
                                               : kernels::PerHeadWeight::kF8E4M3Block128;
    a.x = x.data;
    a.x_row_stride = x.row_stride;
    a.x_head_stride = x.head_stride;
    a.w = w.data;
    a.ldw = w.ld;
    a.w_scales = w.scales;
    a.w_scale_ld = w.scale_ld;
    a.head_rows = head_rows;
    a.row_begin = row_begin;
    a.y = y.data;
    a.y_row_stride = y.row_stride;
    a.y_head_stride = y.head_stride;
    a.num_tokens = x.rows;
    a.num_heads = x.heads;
    a.in_dim = x.dim;
    a.out_dim = y.dim;
    if (y.heads != x.heads || y.rows != x.rows) {
      Record(absl::InvalidArgumentError(
          absl::StrCat("AbsorbPerHead: y is [", y.rows, " rows, ", y.heads, " heads] but x is [",
                       x.rows, " rows, ", x.heads, " heads]; y needs x's rows and heads")));
      return;
    }
    if ((contract == PerHeadContract::kRows ? y.dim : x.dim) > w.cols ||
        (contract == PerHeadContract::kCols && x.dim != w.cols) ||
        (x.heads - 1) * head_rows + row_begin +
                (contract == PerHeadContract::kRows ? x.dim : y.dim) > w.rows) {
      Record(absl::InvalidArgumentError(absl::StrCat(
          "AbsorbPerHead: the per-head blocks fall outside the weight [", w.rows, ", ", w.cols,
          "]: ", kernels::PerHeadNarrowDebugString(a),
          " (kCols needs x.dim == w.cols; kRows y.dim <= w.cols; heads * head_rows <= w.rows)")));
      return;
    }
    if (x.rows <= kAbsorbKernelMaxTokens) {
      a.beside_previous = beside;
      if (beside) g_absorb_beside_launches.fetch_add(1, std::memory_order_relaxed);
      Record(Annotate(kernels::PerHeadNarrow(a, stream_), "AbsorbPerHead"));
      return;
    }
    // Many tokens (prefill, the expanded form, large decode batches): widen the blocks once into
    // fp32 scratch ([heads, out, in]) and run the fp32 per-head GEMM on them; still fp32 math on
    // the widened weights (the op's contract), at GEMM speed.
    const size_t bytes = static_cast<size_t>(x.heads * y.dim * x.dim) * sizeof(float);
    absl::StatusOr<void*> wide = widen_scratch_.Get(0, bytes);
    if (!wide.ok()) {
      Record(Annotate(wide.status(), "AbsorbPerHead"));
      return;
    }
    float* wf = static_cast<float*>(*wide);
    const absl::Status widened = kernels::PerHeadWidenF32(a, wf, stream_);
    if (!widened.ok()) {
      Record(Annotate(widened, "AbsorbPerHead"));
      return;
    }
    PerHeadGemm(x, wf, y.dim * x.dim, x.dim, y, "AbsorbPerHead");
  }

  void RmsNorm(const MatView& x, const float* w, float eps, const MatView& y) override {
    if (x.rows == 0 || x.cols == 0 || !Bind()) return;
    Record(kernels::RmsNorm(kernels::DType::kF32, x.data, x.ld, w, eps, y.data, y.ld, x.rows,
                            x.cols, stream_));
  }

  // The decode GEMV with the norm inside it where it takes the call (narrow weights:
  // cuda_linear.h RunNormed; fp32 weights of one row on kernels::PerHeadGemv, the MoE router:
  // PerHeadGemvNorm), else RmsNorm, then Linear. The same bits either way.
  void RmsNormLinear(const MatView& x, const float* norm_w, float eps, const MatView& normed,
                     const MatView& w, const MatView& y, bool accumulate) override {
    g_norm_linear_fused.store(false, std::memory_order_relaxed);
    const bool fuse = x.rows > 0 && x.cols > 0 && w.rows > 0 &&
                      x.rows <= kNormLinearFusionMaxRows &&
                      normed.rows == x.rows && normed.cols == x.cols;
    if (fuse && w.dtype == WeightDType::kF32 && w.cols == x.cols && y.rows == x.rows &&
        y.cols == w.rows && SmallF32Gemv(x, w)) {
      const kernels::PerHeadGemvNorm n{norm_w, eps, normed.data, normed.ld};
      if (kernels::PerHeadGemvNormFusible(x.data, x.ld, x.rows, x.cols, n)) {
        if (!Bind() || !MainOnly("RmsNormLinear")) return;
        Record(Annotate(kernels::PerHeadGemv(x.data, x.ld, 0, w.data, 0, w.ld, y.data, y.ld, 0,
                                             x.rows, 1, x.cols, w.rows, accumulate, stream_, &n),
                        "RmsNormLinear"));
        g_norm_linear_fused.store(true, std::memory_order_relaxed);
        return;
      }
    }
    if (fuse && w.dtype != WeightDType::kF32 && !IsQuantizedWeight(w.dtype)) {
      if (!Bind() || !MainOnly("RmsNormLinear")) return;
      bool taken = false;
      Record(Annotate(
          narrow_->RunNormed(x, norm_w, eps, normed, w, y, accumulate, policy_, scratch_, stream_,
                             &taken),
          "RmsNormLinear"));
      if (taken) {
        g_norm_linear_fused.store(true, std::memory_order_relaxed);
        return;
      }
    }
    RmsNorm(x, norm_w, eps, normed);
    Linear(normed, w, y, accumulate);
  }

  void LayerNorm(const MatView& x, const float* w, const float* b, float eps,
                 const MatView& y) override {
    if (x.rows == 0 || x.cols == 0 || !Bind()) return;
    Record(kernels::LayerNorm(x.data, x.ld, w, b, eps, y.data, y.ld, x.rows, x.cols, stream_));
  }

  void RopeInterleaved(const HeadsView& x, const int32_t* positions, const float* inv_freq,
                       int num_freqs) override {
    if (x.rows == 0 || x.heads == 0 || num_freqs == 0 || !Bind()) return;
    Record(kernels::RopeInterleaved(kernels::DType::kF32, x.data, x.rows, x.heads, x.row_stride,
                                    x.head_stride, positions, inv_freq, num_freqs, stream_));
  }

  void RopeInterleavedBoth(const HeadsView& a, const HeadsView& b, const int32_t* positions,
                           const float* inv_freq, int num_freqs) override {
    if (a.rows != b.rows || a.row_stride != b.row_stride || a.heads == 0 || b.heads == 0) {
      Backend::RopeInterleavedBoth(a, b, positions, inv_freq, num_freqs);
      return;
    }
    if (a.rows == 0 || num_freqs == 0 || !Bind()) return;
    const kernels::RopeHeads second{b.data, b.heads, b.head_stride};
    Record(kernels::RopeInterleaved(kernels::DType::kF32, a.data, a.rows, a.heads, a.row_stride,
                                    a.head_stride, positions, inv_freq, num_freqs, stream_,
                                    &second));
  }

  void SiluMul(const MatView& gate, const MatView& up, const MatView& out) override {
    if (gate.rows == 0 || gate.cols == 0 || !Bind()) return;
    Record(kernels::SiluMul(kernels::DType::kF32, gate.data, gate.ld, up.data, up.ld, out.data,
                            out.ld, gate.rows, gate.cols, stream_));
  }

  void Fill(const MatView& y, float value) override {
    if (!Bind()) return;
    Record(kernels::FillRows(y.data, y.ld, y.rows, y.cols, value, stream_));
  }

  void Add(const MatView& x, const MatView& y) override {
    if (!Bind()) return;
    Record(kernels::AddRows(x.data, x.ld, y.data, y.ld, x.rows, x.cols, stream_));
  }

  void Copy(const MatView& x, const MatView& y) override {
    if (!Bind()) return;
    Record(kernels::CopyRows(x.data, x.ld, nullptr, y.data, y.ld, nullptr, x.rows, x.cols,
                             stream_));
  }

  void GatherRows(const MatView& src, const int32_t* rows, const MatView& out) override {
    if (!Bind()) return;
    Record(kernels::CopyRows(src.data, src.ld, rows, out.data, out.ld, nullptr, out.rows,
                             out.cols, stream_));
  }

  void ScatterRows(const MatView& src, const int32_t* rows, const MatView& dst) override {
    if (!Bind()) return;
    Record(kernels::CopyRows(src.data, src.ld, nullptr, dst.data, dst.ld, rows, src.rows,
                             src.cols, stream_));
  }

  void IndexerTopK(const IndexerTopKArgs& args) override {
    if (args.q.rows == 0 || !Bind() || !MainOnly("IndexerTopK")) return;
    Record(Annotate(cuda::IndexerTopK(args, policy_, scratch_, stream_), "IndexerTopK"));
    // With rows and k > 0 its last launch is a select kernel whose wait comes first (PdlEnter).
    if (args.top_k > 0 && status_.ok()) indexer_serial_ = op_serial_;
  }

  void Attention(const AttentionArgs& args) override {
    if (args.q_a.rows == 0 || !Bind() || !MainOnly("Attention")) return;
    Record(Annotate(cuda::Attention(args, policy_, scratch_, stream_), "Attention"));
  }

  void WriteLatentFp8(const MatView& src, const int32_t* slots,
                      const Fp8LatentCache& dst) override {
    if (src.rows == 0 || !Bind()) return;
    Record(cuda::WriteLatentFp8(src, slots, dst, stream_));
  }

  void WriteIndexKeysFp8(const MatView& src, const int32_t* slots,
                         const Fp8IndexCache& dst) override {
    if (src.rows == 0 || !Bind()) return;
    Record(cuda::WriteIndexKeysFp8(src, slots, dst, stream_));
  }

  void GatherLatentFp8(const Fp8LatentCache& src, const int32_t* slots,
                       const MatView& out) override {
    if (out.rows == 0 || !Bind()) return;
    Record(cuda::GatherLatentFp8(src, slots, out, stream_));
  }

  void MoeRoute(const MatView& logits, const float* bias, int n_group, int topk_group, int top_k,
                bool renormalize, float scale, int appended, int32_t* ids,
                float* weights) override {
    if (logits.rows == 0 || !Bind()) return;
    Record(kernels::MoeRoute(logits.data, logits.ld, bias, logits.rows,
                             static_cast<int>(logits.cols), std::max(1, n_group), topk_group, top_k,
                             renormalize, scale, appended, ids, weights, stream_));
  }

  // INT4 / INT8 / NVFP4 experts: read narrow (cuda::MoeQuantExperts; a prefill in pieces of
  // kernels::kMoeQuantMaxPairs pairs) when every projection shares one format and group size;
  // else (layers that mix formats) widened to bf16 and run as bf16 experts.
  void MoeExperts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                  const ExpertWeights& experts, const MatView& out) override {
    if (x.rows == 0 || !Bind() || !MainOnly("MoeExperts")) return;
    if (QuantizedExperts(experts) && cuda::QuantExpertsNarrow(experts, x.rows * top_k)) {
      g_quant_experts_narrow.fetch_add(1, std::memory_order_relaxed);
      Record(Annotate(cuda::MoeQuantExperts(x, ids, weights, top_k, experts, out, scratch_,
                                            stream_, policy_),
                      "MoeExperts"));
      return;
    }
    ExpertWeights ew = experts;
    if (!WidenQuantizedExperts(experts, &ew, "MoeExperts")) return;
    Record(Annotate(cuda::MoeExperts(x, ids, weights, top_k, ew, out, scratch_, stream_,
                                     policy_),
                    "MoeExperts"));
  }

  void MoeRouteExperts(const MatView& logits, const MoeRouteArgs& r, const MatView& x,
                       const ExpertWeights& experts, const MatView& out) override {
    if (x.rows == 0 || !Bind() || !MainOnly("MoeRouteExperts")) return;
    const int64_t pairs = x.rows * (r.top_k + (r.appended >= 0 ? 1 : 0));
    if (QuantizedExperts(experts) && cuda::QuantExpertsNarrow(experts, pairs)) {
      g_quant_experts_narrow.fetch_add(1, std::memory_order_relaxed);
      Record(Annotate(cuda::MoeQuantRouteExperts(logits, r, x, experts, out, scratch_, stream_,
                                                 policy_),
                      "MoeRouteExperts"));
      return;
    }
    ExpertWeights ew = experts;
    if (!WidenQuantizedExperts(experts, &ew, "MoeRouteExperts")) return;
    Record(Annotate(cuda::MoeRouteExperts(logits, r, x, ew, out, scratch_, stream_,
                                          policy_),
                    "MoeRouteExperts"));
  }

  static bool QuantizedExperts(const ExpertWeights& experts) {
    return experts.num_experts > 0 && experts.gate != nullptr && experts.up != nullptr &&
           experts.down != nullptr &&
           (IsQuantizedWeight(experts.gate[0].dtype) || IsQuantizedWeight(experts.up[0].dtype) ||
            IsQuantizedWeight(experts.down[0].dtype));
  }

  // INT4 / INT8 / NVFP4 experts widened to bf16 views in *out (QuantLinear::WidenExperts); out
  // unchanged otherwise. False (error recorded) on failure.
  bool WidenQuantizedExperts(const ExpertWeights& experts, ExpertWeights* out, const char* op) {
    if (!QuantizedExperts(experts)) return true;
    g_quant_experts_widened.fetch_add(1, std::memory_order_relaxed);
    const absl::Status s = quant_->WidenExperts(experts, widen_scratch_, stream_, out);
    Record(Annotate(s, op));
    return s.ok();
  }

  void Sample(const SampleArgs& a) override {
    if (a.logits.rows == 0 || !Bind() || !MainOnly("Sample")) return;
    kernels::SampleRowsArgs k;
    k.logits = a.logits.data;
    k.ld = a.logits.ld;
    k.rows = a.logits.rows;
    k.vocab = a.logits.cols;
    k.temperature = a.temperature;
    k.top_k = a.top_k;
    k.top_p = a.top_p;
    k.seed = a.seed;
    k.index = a.index;
    k.out_ids = a.out_ids;
    k.out_logprobs = a.out_logprobs;
    Record(kernels::SampleRows(k, stream_));
  }

  absl::Status MemoryInfo(DeviceMemoryInfo* info) override {
    if (!Bind()) return status_;
    size_t free_bytes = 0, total_bytes = 0;
    GLM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    info->free_bytes = static_cast<int64_t>(free_bytes);
    info->total_bytes = static_cast<int64_t>(total_bytes);
    info->workspace_bytes = static_cast<int64_t>(kLtWorkspaceBytes);
    return absl::OkStatus();
  }

  void SetPointerChecks(bool on) override { pointer_checks_ = on; }

  bool SupportsGraphs() const override { return true; }

  // Thread-local capture mode: another thread's cudaMalloc (a second backend) does not
  // invalidate this capture, while an allocation on this thread inside it fails loudly.
  void BeginCapture() override {
    if (!Bind() || !MainOnly("BeginCapture")) return;
    Record(CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                      "cudaStreamBeginCapture"));
    capturing_ = status_.ok();
  }

  std::unique_ptr<BackendGraph> EndCapture() override {
    if (capturing_) {  // a capture must end with every branch joined
      EndSide();
      JoinSide();
    }
    if (!capturing_) {
      Record(absl::FailedPreconditionError("EndCapture without a successful BeginCapture"));
      return nullptr;
    }
    capturing_ = false;
    // End the capture even after a failed op, so the stream leaves capture mode.
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    Record(CudaStatus(end, "cudaStreamEndCapture"));
    cudaGraphExec_t exec = nullptr;
    if (status_.ok()) {
      Record(CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"));
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!status_.ok()) {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      (void)cudaGetLastError();
      return nullptr;
    }
    return std::make_unique<CudaGraph>(exec);
  }

  void ReplayGraph(BackendGraph& graph) override {
    if (!Bind() || !MainOnly("ReplayGraph")) return;
    Record(CudaStatus(cudaGraphLaunch(static_cast<CudaGraph&>(graph).exec(), stream_),
                      "cudaGraphLaunch"));
  }

  // Moves scratch_epoch(): decode graphs captured under the previous policy are recaptured.
  void SetKernelPolicy(const kernels::KernelPolicy& policy) override {
    policy_ = policy;
    ++policy_generation_;
  }

  int64_t scratch_epoch() const override {
    return scratch_.epoch() + widen_scratch_.epoch() + policy_generation_;
  }

  // The side branch runs on side_stream_ (created at the first BeginSide), forked from and joined
  // back into the main stream with events, which stream capture turns into graph edges.
  void BeginSide() override {
    if (!Bind() || !MainOnly("BeginSide")) return;
    if (side_stream_ == nullptr) {
      Record(CudaStatus(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking),
                        "BeginSide: cudaStreamCreateWithFlags"));
      Record(CudaStatus(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming),
                        "BeginSide: cudaEventCreateWithFlags"));
      Record(CudaStatus(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming),
                        "BeginSide: cudaEventCreateWithFlags"));
      if (!status_.ok()) return;
    }
    Record(CudaStatus(cudaEventRecord(fork_event_, main_stream_), "BeginSide: cudaEventRecord"));
    Record(CudaStatus(cudaStreamWaitEvent(side_stream_, fork_event_, 0),
                      "BeginSide: cudaStreamWaitEvent"));
    if (!status_.ok()) return;
    stream_ = side_stream_;
    in_side_ = true;
    side_pending_ = true;
  }
  void EndSide() override {
    ++op_serial_;  // the main stream again (no Bind): not right after IndexerTopK any more
    stream_ = main_stream_;
    in_side_ = false;
  }
  void JoinSide() override {
    ++op_serial_;  // an event join (no Bind): not right after IndexerTopK any more
    if (!side_pending_ || in_side_) return;
    side_pending_ = false;
    if (!status_.ok()) return;
    Record(CudaStatus(cudaEventRecord(join_event_, side_stream_), "JoinSide: cudaEventRecord"));
    Record(CudaStatus(cudaStreamWaitEvent(main_stream_, join_event_, 0),
                      "JoinSide: cudaStreamWaitEvent"));
  }

 private:
  // False once an error is recorded (the op is skipped). Makes the backend's device current on
  // the calling thread (the engine's step thread is not the one that created the backend).
  bool Bind() {
    ++op_serial_;
    if (!status_.ok()) return false;
    // Pointer checks of the kernels/ launchers follow this backend's setting on the calling
    // thread (one thread-local store, no driver call).
    kernels::SetDevicePointerChecks(pointer_checks_);
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device_) {
      Record(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    }
    return status_.ok();
  }
  void Record(const absl::Status& s) {
    if (!s.ok() && status_.ok()) status_ = s;
  }
  // False (and an error recorded) when called on a side branch: `op` uses backend scratch or
  // must see every branch (Backend::BeginSide).
  // Whether the fp32 Linear x . w^T runs on kernels::PerHeadGemv (one row, a small weight: the
  // MoE router) rather than cuBLASLt.
  static bool SmallF32Gemv(const MatView& x, const MatView& w) {
    return x.rows == 1 &&
           static_cast<size_t>(w.rows) * static_cast<size_t>(w.cols) * sizeof(float) <=
               kSmallF32GemvMaxWeightBytes &&
           kernels::PerHeadGemvSupported(x.rows, x.cols);
  }

  bool MainOnly(const char* op) {
    if (!in_side_) return true;
    Record(absl::FailedPreconditionError(
        absl::StrCat("CUDA backend: ", op,
                     " was enqueued on a side branch (between BeginSide and EndSide); "
                     "only scratch-free ops (norms, RoPE, KV writes) may run there")));
    return false;
  }

  // The kernel paths (kernels/kernel_policy.h); every op passes its section to its launcher.
  // policy_generation_ counts SetKernelPolicy calls (part of scratch_epoch()).
  kernels::KernelPolicy policy_;
  int64_t policy_generation_ = 0;
  const int device_;
  cudaStream_t stream_;  // where ops are enqueued: main_stream_, or side_stream_ on a branch
  const cudaStream_t main_stream_;
  cuda::CudaDeviceStream device_stream_{device_, main_stream_};  // device_stream()
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  bool in_side_ = false;       // between BeginSide and EndSide
  bool side_pending_ = false;  // a branch not joined yet
  std::unique_ptr<cuda::LtMatmul> matmul_;
  std::unique_ptr<cuda::NarrowLinear> narrow_;
  std::unique_ptr<cuda::QuantLinear> quant_;
  DeviceScratch scratch_;
  // Widened weights: AbsorbPerHead's for many tokens (slot 0), a quantized Linear's for many
  // tokens (slot 1), a layer's quantized experts (slot 2; cuda_quant_linear.h). Its own so that
  // no other op's slot grows to a weight's size; its growth moves scratch_epoch() too.
  DeviceScratch widen_scratch_;
  absl::Status status_;
  bool pointer_checks_ = true;
  // AbsorbPerHeadBesidePrevious: every op that can launch or copy calls Bind(), which counts it
  // in op_serial_ (EndSide / JoinSide count themselves); IndexerTopK notes its count, so "the
  // previous op was IndexerTopK" is one compare.
  int64_t op_serial_ = 0;
  int64_t indexer_serial_ = 0;

  bool capturing_ = false;
};

}  // namespace

absl::Status CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device: cudaGetDeviceCount returned ", cudaGetErrorName(err), " (",
        cudaGetErrorString(err), ") with ", count,
        " devices; check the NVIDIA driver (nvidia-smi) or use the cpu backend"));
  }
  return absl::OkStatus();
}

bool LastCudaNormLinearFused() { return g_norm_linear_fused.load(); }

int64_t CudaAbsorbBesideLaunches() { return g_absorb_beside_launches.load(); }

CudaQuantExpertCalls CudaQuantExpertCallCounts() {
  return {g_quant_experts_narrow.load(), g_quant_experts_widened.load()};
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_ordinal,
                                                           const kernels::KernelPolicy& policy) {
  GLM_RETURN_IF_ERROR(CudaDeviceAvailable());
  int count = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device_ordinal < 0 || device_ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device_ordinal,
                                                   " does not exist; this machine has ", count,
                                                   " (ordinals 0..", count - 1, ")"));
  }
  GLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_ordinal));
  cudaStream_t stream = nullptr;
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto matmul = cuda::LtMatmul::Create(kLtWorkspaceBytes);
  if (!matmul.ok()) {
    cudaStreamDestroy(stream);
    return Annotate(matmul.status(), "CUDA backend: cuBLASLt setup");
  }
  auto narrow = cuda::NarrowLinear::Create();
  if (!narrow.ok()) {
    cudaStreamDestroy(stream);
    return Annotate(narrow.status(), "CUDA backend: cuBLASLt setup (bf16/fp8 Linear)");
  }
  auto quant = cuda::QuantLinear::Create();
  if (!quant.ok()) {
    cudaStreamDestroy(stream);
    return Annotate(quant.status(), "CUDA backend: INT4 / INT8 / NVFP4 Linear setup");
  }
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(
      device_ordinal, stream, std::move(*matmul), std::move(*narrow), std::move(*quant),
      policy));
}

}  // namespace glm::engine
