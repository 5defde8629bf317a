// The reference CPU backend: clear loops, fp32 accumulation, multi-threaded with a ThreadPool.
// Memory is host memory (64-byte aligned); ops run synchronously.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/thread_pool.h"

namespace glm::engine {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int num_threads);

  std::string name() const override { return "cpu"; }
  int num_threads() const override { return pool_.num_threads(); }
  absl::Status status() const override { return absl::OkStatus(); }  // ops cannot fail

  std::unique_ptr<Buffer> Allocate(size_t bytes) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void Synchronize() override {}
  bool HostMemory() const override { return true; }

  // fp32 / bf16 / fp8: narrow Linear / MoeExperts weights run with the cuda backend's numerics
  // (engine/backend/cpu/cpu_narrow.h) and stay narrow in memory. Not INT4 / INT8 / NVFP4: the
  // loader widens those checkpoint weights for this backend.
  bool SupportsWeightDType(WeightDType d) const override { return !IsQuantizedWeight(d); }
  void Linear(const MatView& x, const MatView& w, const MatView& y, bool accumulate) override;
  void LinearPerHead(const HeadsView& x, const float* weights, int64_t weight_head_stride,
                     int64_t w_ld, const HeadsView& y) override;
  // Weight-only, any WeightDType (cpu_narrow.h AbsorbPerHead).
  void AbsorbPerHead(const HeadsView& x, const MatView& w, int64_t head_rows, int64_t row_begin,
                     PerHeadContract contract, const HeadsView& y) override;
  void RmsNorm(const MatView& x, const float* w, float eps, const MatView& y) override;
  void LayerNorm(const MatView& x, const float* w, const float* b, float eps,
                 const MatView& y) override;
  void RopeInterleaved(const HeadsView& x, const int32_t* positions, const float* inv_freq,
                       int num_freqs) override;
  void SiluMul(const MatView& gate, const MatView& up, const MatView& out) override;
  void Fill(const MatView& y, float value) override;
  void Add(const MatView& x, const MatView& y) override;
  void Copy(const MatView& x, const MatView& y) override;
  void GatherRows(const MatView& src, const int32_t* rows, const MatView& out) override;
  void ScatterRows(const MatView& src, const int32_t* rows, const MatView& dst) override;
  void IndexerTopK(const IndexerTopKArgs& args) override;
  void Attention(const AttentionArgs& args) override;
  // fp8 KV cache (engine/backend/cpu/cpu_kv_fp8.h).
  void WriteLatentFp8(const MatView& src, const int32_t* slots,
                      const Fp8LatentCache& dst) override;
  void WriteIndexKeysFp8(const MatView& src, const int32_t* slots,
                         const Fp8IndexCache& dst) override;
  void GatherLatentFp8(const Fp8LatentCache& src, const int32_t* slots,
                       const MatView& out) override;
  void MoeRoute(const MatView& logits, const float* bias, int n_group, int topk_group, int top_k,
                bool renormalize, float scale, int appended, int32_t* ids, float* weights) override;
  void MoeExperts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                  const ExpertWeights& experts, const MatView& out) override;

 private:
  ThreadPool pool_;
  // MoeExperts scratch, grown on demand (host memory; the CPU path may allocate).
  std::vector<float> moe_x_, moe_gate_, moe_up_, moe_y_;
};

}  // namespace glm::engine
