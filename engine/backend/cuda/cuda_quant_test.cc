// INT4 / INT8 / NVFP4 weights kept as stored on the CUDA backend (cuda_quant_linear.h):
// - Linear against a double-precision reference of its documented numerics: decode sizes (GEMV:
//   bf16(x) times the exact weight) and prefill sizes (bf16(x) times the weight rounded to bf16,
//   kernels::DequantizeToBf16, then the bf16 GEMM), both summed in fp32: within 2e-5 of
//   sum |x w| per output (fp32 summation over k <= 512 terms); decode Linear calls allocate
//   nothing once warm, and replay from a CUDA graph bit for bit.
// - MoeExperts with quantized experts: at decode sizes read narrow (kernels/moe_quant.h)
//   against a host reference of its numerics (GemvQuantHost per pair, silu, combine): 1e-3 of
//   max |out| (fp32 sums, plus an act element's bf16 rounding landing on the other side of a
//   tie), also beyond kernels::kMoeQuantMaxPairs (in pieces), and with routing inside the op
//   equal to MoeRoute then MoeExperts. CudaQuantExpertCallCounts says nothing widened.
// - Which expert layers take the narrow path (runs without a GPU).
// - The loader's stored layout (checkpoint bytes, padding, TP shares) decodes through the
//   kernels' host mirror (DequantizeQuantHost) to the dequantizer's values (runs without a GPU).
// - The quantized golden fixtures tests/golden/tiny-int4mix and tiny-nvfp4 (INT4 experts / INT8
//   group and channel linears; NVFP4 experts with distinct gate / up global scales) loaded with
//   weight_dtype auto on the CUDA backend (weights narrow; decode steps as CUDA graphs) against
//   the same checkpoint on the CPU backend in fp32 (exact dequantization): prompt logits within
//   2e-2 of max |logit| (every quantized Linear rounds x to bf16, 2^-9 relative per element,
//   through 3 layers + lm_head: the same budget engine_golden_narrow_test gives bf16 weights
//   against fp32), greedy ids identical (a
//   divergence only at a near tie, cpu margin < 2e-2), the Linear weights' bytes are the
//   narrow ones, and the experts are read narrow at every step (never widened).
// The GPU tests skip (printing why) without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/scratch_dir.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_quant_linear.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/layers.h"
#include "engine/weights/safetensors.h"
#include "engine/weights/safetensors_writer.h"
#include "engine/weights/weight_store.h"
#include "kernels/gemv_quant.h"
#include "kernels/moe_quant.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

float Bf16Round(float f) {
  const uint32_t u = static_cast<uint32_t>(kernels::GemvQuantBf16Bits(f)) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// A random quantized weight [n, k] in host memory, laid out as WeightLoader stores it.
struct HostQuant {
  WeightDType dtype;
  int64_t n = 0, k = 0, group = 0, ld = 0, scale_ld = 0;
  int scale_bytes = 2;
  float global_scale = 1.0f;
  std::vector<uint8_t> data, scales;

  kernels::QuantWeightView View() const {
    kernels::QuantWeightView v;
    v.format = dtype == WeightDType::kInt4   ? kernels::QuantFormat::kInt4
               : dtype == WeightDType::kInt8 ? kernels::QuantFormat::kInt8
                                             : kernels::QuantFormat::kNvfp4;
    v.data = data.data();
    v.ld_bytes = ld;
    v.scales = scales.data();
    v.scale_ld = scale_ld;
    v.group_size = group;
    v.global_scale = global_scale;
    v.rows = n;
    v.cols = k;
    return v;
  }
  std::vector<float> Dequantized() const {
    std::vector<float> w(n * k);
    EXPECT_TRUE(kernels::DequantizeQuantHost(View(), w.data(), k).ok());
    return w;
  }
};

HostQuant MakeQuant(WeightDType dtype, int64_t n, int64_t k, int64_t group, std::mt19937& rng) {
  HostQuant q;
  q.dtype = dtype;
  q.n = n, q.k = k, q.group = group;
  q.scale_bytes = dtype == WeightDType::kNvfp4 ? 1 : 2;
  const int64_t row_bytes = dtype == WeightDType::kInt8 ? k : k / 2;
  q.ld = (row_bytes + 15) / 16 * 16;
  const int64_t scols = (k + group - 1) / group;
  q.scale_ld = (scols * q.scale_bytes + 15) / 16 * 16 / q.scale_bytes;
  q.data.resize(n * q.ld);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < row_bytes; ++b) q.data[r * q.ld + b] = static_cast<uint8_t>(rng());
  }
  q.scales.resize(n * q.scale_ld * q.scale_bytes);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < scols; ++j) {
      uint8_t* s = q.scales.data() + (r * q.scale_ld + j) * q.scale_bytes;
      if (dtype == WeightDType::kNvfp4) {
        s[0] = static_cast<uint8_t>(((4 + rng() % 7) << 3) | (rng() % 8));  // e4m3, 2^-3..2^3
      } else {
        const float f = std::uniform_real_distribution<float>(0.002f, 0.02f)(rng);
        const uint16_t b = kernels::GemvQuantBf16Bits(f);
        std::memcpy(s, &b, 2);
      }
    }
  }
  q.global_scale = dtype == WeightDType::kNvfp4 ? 0.01f : 1.0f;
  return q;
}

class CudaQuantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << avail.message();
    auto gpu = CreateCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
  }

  // The quantized weight in device memory, as a MatView.
  MatView Upload(const HostQuant& q) {
    buffers_.push_back(gpu_->Allocate(q.data.size()));
    gpu_->CopyToDevice(buffers_.back()->data(), q.data.data(), q.data.size());
    void* data = buffers_.back()->data();
    buffers_.push_back(gpu_->Allocate(q.scales.size()));
    gpu_->CopyToDevice(buffers_.back()->data(), q.scales.data(), q.scales.size());
    MatView v{static_cast<float*>(data), q.n, q.k, q.ld};
    v.dtype = q.dtype;
    v.group_scales = buffers_.back()->data();
    v.scale_ld = q.scale_ld;
    v.group_size = q.group;
    v.global_scale = q.global_scale;
    return v;
  }
  float* Floats(const std::vector<float>& v) {
    buffers_.push_back(gpu_->Allocate(v.size() * sizeof(float)));
    gpu_->CopyToDevice(buffers_.back()->data(), v.data(), v.size() * sizeof(float));
    return buffers_.back()->f32();
  }

  std::unique_ptr<Backend> gpu_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

TEST_F(CudaQuantTest, LinearMatchesTheHostReference) {
  std::mt19937 rng(5);
  struct Shape {
    WeightDType dtype;
    int64_t n, k, group;
  };
  const Shape shapes[] = {{WeightDType::kInt4, 96, 256, 32},  {WeightDType::kInt4, 160, 512, 128},
                          {WeightDType::kInt8, 64, 192, 16},  {WeightDType::kInt8, 80, 160, 160},
                          {WeightDType::kInt4, 48, 96, 96},   {WeightDType::kNvfp4, 96, 256, 16},
                          {WeightDType::kNvfp4, 40, 160, 16}};
  for (const Shape& s : shapes) {
    ASSERT_TRUE(gpu_->SupportsQuantizedShape(s.dtype, s.n, s.k, s.group));
    const HostQuant q = MakeQuant(s.dtype, s.n, s.k, s.group, rng);
    const MatView w = Upload(q);
    const std::vector<float> wf = q.Dequantized();
    for (int64_t m : {1, 3, 16, 17, 40}) {
      SCOPED_TRACE(absl::StrCat(q.View().DebugString(), " m=", m));
      std::vector<float> x(m * s.k), y0(m * s.n);
      for (float& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
      for (float& v : y0) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
      for (bool accumulate : {false, true}) {
        const MatView xd{Floats(x), m, s.k, s.k};
        const MatView yd{Floats(y0), m, s.n, s.n};
        gpu_->Linear(xd, w, yd, accumulate);
        std::vector<float> y(m * s.n);
        gpu_->CopyToHost(y.data(), yd.data, y.size() * sizeof(float));
        ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
        // Reference: bf16(x) . W (exact W up to 16 rows; W rounded to bf16 beyond), in double.
        const double tol = 2e-5;
        double worst = 0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            double sum = 0, mag = 0;
            for (int64_t c = 0; c < s.k; ++c) {
              const double wv = m <= kernels::kGemvQuantMaxM ? wf[j * s.k + c]
                                                              : Bf16Round(wf[j * s.k + c]);
              const double p = static_cast<double>(Bf16Round(x[i * s.k + c])) * wv;
              sum += p;
              mag += std::fabs(p);
            }
            if (accumulate) sum += y0[i * s.n + j];
            worst = std::max(worst, std::fabs(y[i * s.n + j] - sum) / std::max(mag, 1e-20));
          }
        }
        EXPECT_LT(worst, tol) << (accumulate ? "accumulate" : "overwrite");
      }
    }
  }
  // Shapes the kernels refuse are refused up front (the loader widens those).
  EXPECT_FALSE(gpu_->SupportsQuantizedShape(WeightDType::kInt4, 160, 48, 16));
  EXPECT_TRUE(gpu_->SupportsQuantizedShape(WeightDType::kInt8, 160, 48, 16));
}

TEST_F(CudaQuantTest, DecodeLinearAllocatesNothingOnceWarm) {
  std::mt19937 rng(9);
  const HostQuant q = MakeQuant(WeightDType::kInt4, 256, 512, 128, rng);
  const MatView w = Upload(q);
  std::vector<float> x(4 * 512, 0.5f), y(4 * 256, 0.0f);
  const MatView xd{Floats(x), 4, 512, 512};
  const MatView yd{Floats(y), 4, 256, 256};
  gpu_->Linear(xd, w, yd, false);
  gpu_->Synchronize();
  const int64_t epoch = gpu_->scratch_epoch();
  for (int i = 0; i < 3; ++i) gpu_->Linear(xd, w, yd, true);
  gpu_->Synchronize();
  EXPECT_EQ(gpu_->scratch_epoch(), epoch);
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  // And it records into a graph that replays.
  ASSERT_TRUE(gpu_->SupportsGraphs());
  gpu_->BeginCapture();
  gpu_->Linear(xd, w, yd, false);
  auto graph = gpu_->EndCapture();
  ASSERT_NE(graph, nullptr) << gpu_->status();
  gpu_->ReplayGraph(*graph);
  std::vector<float> replayed(y.size()), eager(y.size());
  gpu_->CopyToHost(replayed.data(), yd.data, y.size() * sizeof(float));
  gpu_->Linear(xd, w, yd, false);
  gpu_->CopyToHost(eager.data(), yd.data, y.size() * sizeof(float));
  EXPECT_EQ(replayed, eager);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// out (+)= the quantized experts' sum as kernels/moe_quant.h defines it, on the host.
void QuantExpertsHost(const std::vector<HostQuant>& gate, const std::vector<HostQuant>& up,
                      const std::vector<HostQuant>& down, const std::vector<float>& x,
                      int64_t tokens, const std::vector<int32_t>& ids,
                      const std::vector<float>& w, int top_k, std::vector<float>* out) {
  const int64_t inter = gate[0].n, hidden = gate[0].k;
  std::vector<float> g(inter), u(inter), act(inter), y(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      if (e < 0 || e >= static_cast<int32_t>(gate.size())) continue;
      const float* xr = x.data() + t * hidden;
      ASSERT_TRUE(
          kernels::GemvQuantHost(1, xr, hidden, gate[e].View(), g.data(), inter, false).ok());
      ASSERT_TRUE(
          kernels::GemvQuantHost(1, xr, hidden, up[e].View(), u.data(), inter, false).ok());
      for (int64_t i = 0; i < inter; ++i) act[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      ASSERT_TRUE(kernels::GemvQuantHost(1, act.data(), inter, down[e].View(), y.data(), hidden,
                                         false)
                      .ok());
      for (int64_t c = 0; c < hidden; ++c) (*out)[t * hidden + c] += w[t * top_k + j] * y[c];
    }
  }
}

// Decode sizes read the experts narrow (host reference of moe_quant's numerics), and so does a
// prefill of more pairs than kernels::kMoeQuantMaxPairs, in pieces (rows on both sides of a
// piece boundary against the same reference); nothing widens.
TEST_F(CudaQuantTest, MoeExpertsNarrowAtDecodeAndInPiecesBeyond) {
  const int64_t hidden = 128, inter = 64;
  const int32_t experts = 4;
  const int top_k = 2;
  std::mt19937 rng(3);
  for (const int64_t tokens : {int64_t{5}, kernels::kMoeQuantMaxPairs / top_k + 3}) {
    for (WeightDType dtype : {WeightDType::kInt4, WeightDType::kNvfp4}) {
      const bool pieces = tokens * top_k > kernels::kMoeQuantMaxPairs;
      SCOPED_TRACE(absl::StrCat(static_cast<int>(dtype), pieces ? " in pieces" : " one call"));
      const int64_t group = dtype == WeightDType::kNvfp4 ? 16 : 32;
      std::vector<HostQuant> hg, hu, hd;  // host packed weights (the narrow reference)
      std::vector<MatView> gg, gu, gd;  // GPU quantized views
      auto add = [&](int64_t n, int64_t k, std::vector<MatView>* g, std::vector<HostQuant>* h) {
        HostQuant q = MakeQuant(dtype, n, k, group, rng);
        // nvfp4: global scales that differ per expert and per projection.
        if (dtype == WeightDType::kNvfp4) {
          q.global_scale = 0.005f * static_cast<float>(1 + g->size() % 3 + h->size());
        }
        g->push_back(Upload(q));
        h->push_back(std::move(q));
      };
      for (int e = 0; e < experts; ++e) {
        add(inter, hidden, &gg, &hg);
        add(inter, hidden, &gu, &hu);
        add(hidden, inter, &gd, &hd);
      }
      std::vector<float> x(tokens * hidden), w(tokens * top_k);
      std::vector<int32_t> ids(tokens * top_k);
      for (float& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
      for (int64_t t = 0; t < tokens; ++t) {
        ids[t * top_k] = static_cast<int32_t>(t % experts);
        ids[t * top_k + 1] = static_cast<int32_t>((t + 1 + t / 2) % experts);
        w[t * top_k] = 0.7f, w[t * top_k + 1] = 0.3f;
      }
      std::vector<float> out_cpu(tokens * hidden, 0.0f), out_gpu(tokens * hidden);
      QuantExpertsHost(hg, hu, hd, x, tokens, ids, w, top_k, &out_cpu);
      const CudaQuantExpertCalls before = CudaQuantExpertCallCounts();
      buffers_.push_back(gpu_->Allocate(ids.size() * 4));
      gpu_->CopyToDevice(buffers_.back()->data(), ids.data(), ids.size() * 4);
      const int32_t* ids_d = buffers_.back()->i32();
      const MatView out_d{Floats(std::vector<float>(tokens * hidden, 0.0f)), tokens, hidden,
                          hidden};
      gpu_->MoeExperts(MatView{Floats(x), tokens, hidden, hidden}, ids_d, Floats(w), top_k,
                       ExpertWeights{gg.data(), gu.data(), gd.data(), experts}, out_d);
      gpu_->CopyToHost(out_gpu.data(), out_d.data, out_gpu.size() * sizeof(float));
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      const CudaQuantExpertCalls after = CudaQuantExpertCallCounts();
      EXPECT_EQ(after.narrow - before.narrow, 1);
      EXPECT_EQ(after.widened - before.widened, 0);
      double diff = 0, ref = 1e-30;
      for (size_t i = 0; i < out_cpu.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(out_gpu[i]) - out_cpu[i]));
        ref = std::max(ref, std::fabs(static_cast<double>(out_cpu[i])));
      }
      EXPECT_LT(diff / ref, 1e-3);
      // Routing inside the op, in the same pieces: equal to MoeRoute, then MoeExperts.
      std::vector<float> logits(tokens * experts);
      for (float& v : logits) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
      const MatView logits_d{Floats(logits), tokens, experts, experts};
      buffers_.push_back(gpu_->Allocate(tokens * top_k * 8));
      auto* rid = buffers_.back()->i32();
      auto* rw = reinterpret_cast<float*>(rid + tokens * top_k);
      MoeRouteArgs route;
      route.top_k = top_k, route.renormalize = true, route.ids = rid, route.weights = rw;
      const MatView fused{Floats(std::vector<float>(tokens * hidden, 0.0f)), tokens, hidden,
                          hidden};
      const MatView split{Floats(std::vector<float>(tokens * hidden, 0.0f)), tokens, hidden,
                          hidden};
      const ExpertWeights ew{gg.data(), gu.data(), gd.data(), experts};
      const MatView x_d{Floats(x), tokens, hidden, hidden};
      gpu_->MoeRouteExperts(logits_d, route, x_d, ew, fused);
      gpu_->MoeRoute(logits_d, nullptr, 1, 1, top_k, true, 1.0f, -1, rid, rw);
      gpu_->MoeExperts(x_d, rid, rw, top_k, ew, split);
      std::vector<float> a(tokens * hidden), b(tokens * hidden);
      gpu_->CopyToHost(a.data(), fused.data, a.size() * sizeof(float));
      gpu_->CopyToHost(b.data(), split.data, b.size() * sizeof(float));
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      EXPECT_EQ(a, b) << "routing inside the op differs from MoeRoute then MoeExperts";
      EXPECT_EQ(CudaQuantExpertCallCounts().widened, after.widened);
      std::printf("MoeExperts quantized (%d), %lld tokens, %s: %.3g of max |out|\n",
                  static_cast<int>(dtype), static_cast<long long>(tokens),
                  pieces ? "narrow in pieces vs the host reference"
                         : "narrow vs the host reference",
                  diff / ref);
    }
  }
}

// Which layers take the narrow expert path (host logic, no GPU needed): one quantized dtype and
// group size for every projection, at any number of pairs (pieces beyond
// kernels::kMoeQuantMaxPairs); the rest widen.
TEST(CudaQuantExperts, NarrowPathTakesUniformQuantizedLayersAtAnyPairCount) {
  auto view = [](WeightDType d, int64_t group) {
    MatView v;
    v.dtype = d;
    v.group_size = group;
    return v;
  };
  std::vector<MatView> g(3, view(WeightDType::kInt4, 128)), u = g, d = g;
  const ExpertWeights w{g.data(), u.data(), d.data(), 3};
  EXPECT_TRUE(cuda::QuantExpertsNarrow(w, 1));
  EXPECT_TRUE(cuda::QuantExpertsNarrow(w, kernels::kMoeQuantMaxPairs));
  EXPECT_TRUE(cuda::QuantExpertsNarrow(w, 8 * kernels::kMoeQuantMaxPairs + 1));  // prefill
  EXPECT_FALSE(cuda::QuantExpertsNarrow(w, 0));
  d[2] = view(WeightDType::kInt8, 128);  // a layer mixing formats
  EXPECT_FALSE(cuda::QuantExpertsNarrow(w, 8));
  d[2] = view(WeightDType::kInt4, 32);  // or group sizes
  EXPECT_FALSE(cuda::QuantExpertsNarrow(w, 8));
  d[2] = view(WeightDType::kBF16, 0);  // or quantized and bf16 projections
  EXPECT_FALSE(cuda::QuantExpertsNarrow(w, 8));
  std::vector<MatView> nv(3, view(WeightDType::kNvfp4, 16));
  EXPECT_TRUE(cuda::QuantExpertsNarrow(ExpertWeights{nv.data(), nv.data(), nv.data(), 3}, 64));
  std::vector<MatView> bf(3, view(WeightDType::kBF16, 0));
  EXPECT_FALSE(cuda::QuantExpertsNarrow(ExpertWeights{bf.data(), bf.data(), bf.data(), 3}, 8));
}

// ---- The loader's layout through the kernels' host mirror (no GPU needed) ----------------------

// The checkpoint source the model uses (glm_moe_dsa.cc StoreWeights), reduced to what the
// loader calls.
class StoreSource : public WeightSource {
 public:
  explicit StoreSource(std::unique_ptr<WeightStore> store) : store_(std::move(store)) {}
  bool Has(const std::string& name) const override { return store_->Contains(name); }
  absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                               std::vector<int64_t>* shape) override {
    auto s = store_->ShapeOf(name);
    if (!s.ok()) return s.status();
    if (shape != nullptr) *shape = *s;
    return store_->ReadFloat(name);
  }
  std::optional<QuantizedInfo> QuantizedInfoOf(const std::string& name) const override {
    return StoreQuantizedInfo(*store_, name);
  }
  absl::StatusOr<QuantizedTensor> ReadQuantized(const std::string& name,
                                                const TensorSlice& slice) override {
    return ReadStoreQuantized(*store_, name, slice);
  }
  const WeightStore& store() const { return *store_; }

 private:
  std::unique_ptr<WeightStore> store_;
};

// A CPU backend that takes what the CUDA backend takes (host memory the test can read).
class CudaShapedCpuBackend final : public CpuBackend {
 public:
  CudaShapedCpuBackend() : CpuBackend(1) {}
  bool SupportsWeightDType(WeightDType) const override { return true; }
  bool SupportsQuantizedShape(WeightDType d, int64_t rows, int64_t cols,
                              int64_t group) const override {
    return cuda::QuantShapeSupported(d, rows, cols, group);
  }
};

// What WeightLoader stores (checkpoint bytes, padded rows, TP slices) is what
// kernels/gemv_quant reads: DequantizeQuantHost on the stored view gives the dequantizer's
// values, for every format and for row- and column-parallel shares.
TEST(CudaQuantLayout, LoaderViewsDecodeThroughTheKernelsHostMirror) {
  const fs::path dir = testing_util::ScratchDir("cuda_quant_layout");
  constexpr int64_t kRows = 64, kCols = 256;
  std::mt19937 rng(17);
  std::vector<float> v(kRows * kCols);
  SafetensorsWriter w;
  auto fill = [&] {
    for (float& x : v) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  };
  fill();
  ASSERT_TRUE(w.AddPackQuantized("int4g32", {kRows, kCols}, v, 4, 32).ok());
  fill();
  ASSERT_TRUE(w.AddPackQuantized("int4ch", {kRows, kCols}, v, 4, 0).ok());
  fill();
  ASSERT_TRUE(w.AddPackQuantized("int8g16", {kRows, kCols}, v, 8, 16).ok());
  fill();
  ASSERT_TRUE(w.AddPackQuantized("int8ch", {kRows, kCols}, v, 8, 0).ok());
  fill();
  ASSERT_TRUE(w.AddNvfp4Quantized("nvfp4", {kRows, kCols}, v, nullptr, 0.0f, 0.5f).ok());
  ASSERT_TRUE(w.WriteFile((dir / "model.safetensors").string()).ok());
  auto store = WeightStore::Open(dir.string());
  ASSERT_TRUE(store.ok()) << store.status();
  StoreSource source(std::move(store).value());
  CudaShapedCpuBackend backend;
  for (const char* name :
       {"int4g32.weight", "int4ch.weight", "int8g16.weight", "int8ch.weight", "nvfp4.weight"}) {
    for (int tp : {1, 2, 4}) {
      for (TpSplit split : {TpSplit::kColumnParallel, TpSplit::kRowParallel}) {
        SCOPED_TRACE(absl::StrCat(name, " tp ", tp, split == TpSplit::kRowParallel ? " row" : ""));
        WeightLoader loader(source, &backend, LinearWeightMode::kAuto);
        loader.set_tp({tp - 1, tp});
        auto m = loader.Linear(name, kRows, kCols, split);
        ASSERT_TRUE(m.ok()) << m.status();
        const MatView& view = m->view;
        ASSERT_TRUE(IsQuantizedWeight(view.dtype));
        ASSERT_TRUE(kernels::CheckQuantWeight(cuda::QuantViewOf(view)).ok())
            << kernels::CheckQuantWeight(cuda::QuantViewOf(view));
        std::vector<float> got(view.rows * view.cols);
        ASSERT_TRUE(
            kernels::DequantizeQuantHost(cuda::QuantViewOf(view), got.data(), view.cols).ok());
        const bool by_rows = split == TpSplit::kColumnParallel;
        const int64_t n = (by_rows ? kRows : kCols) / tp, begin = (tp - 1) * n;
        auto want = by_rows ? source.store().ReadRowSlice(name, begin, begin + n)
                            : source.store().ReadColSlice(name, begin, begin + n);
        ASSERT_TRUE(want.ok()) << want.status();
        EXPECT_EQ(got, *want);
      }
    }
  }
  fs::remove_all(dir);
}

// ---- The model on tiny quantized checkpoints ----------------------------------------------------

json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// The quantized Linear weights a checkpoint stores (compressed-tensors' weight_packed, ModelOpt's
// weight_scale_2); -1 when the file does not open.
int CountQuantized(const fs::path& dir) {
  auto file = SafetensorsFile::Open((dir / "model.safetensors").string());
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return -1;
  int count = 0;
  for (const SafetensorsEntry& e : (*file)->tensors()) {
    count += e.name.ends_with(".weight_packed") || e.name.ends_with(".weight_scale_2") ? 1 : 0;
  }
  return count;
}

std::unique_ptr<Model> Load(const fs::path& dir, const std::string& backend,
                            const std::string& dtype) {
  ModelLoadOptions o;
  o.model_dir = dir.string();
  o.kv = {4, 64};
  o.num_threads = 2;
  o.backend = backend;
  o.weight_dtype = dtype;
  auto m = LoadGlmMoeDsa(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 1e-30;
  for (float f : v) m = std::max(m, std::fabs(static_cast<double>(f)));
  return m;
}

int32_t ArgMax(const std::vector<float>& v, size_t offset, size_t n) {
  return static_cast<int32_t>(std::max_element(v.begin() + offset, v.begin() + offset + n) -
                              (v.begin() + offset));
}

class CudaQuantModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << avail.message();
  }

  // Prompt logits (all positions) of `prompt`, then greedy decode of `steps` tokens.
  static void Run(Model& m, int64_t seq_id, const std::vector<int32_t>& prompt, int steps,
                  std::vector<float>* logits, std::vector<std::vector<float>>* step_logits,
                  const std::vector<int32_t>* forced, std::vector<int32_t>* ids) {
    ForwardBatch b;
    SequenceSlice s;
    s.seq_id = seq_id;
    s.token_ids = prompt;
    for (int i = 0; i < 32; ++i) s.block_table.push_back(static_cast<int32_t>((seq_id - 1) * 32 + i));
    s.all_logits = true;
    b.seqs.push_back(s);
    ForwardResult r;
    absl::Status st = m.Forward(b, &r);
    ASSERT_TRUE(st.ok()) << st;
    *logits = r.seqs[0].logits;
    const size_t V = logits->size() / prompt.size();
    int32_t tok = ArgMax(*logits, logits->size() - V, V);
    int32_t pos = static_cast<int32_t>(prompt.size());
    for (int i = 0; i < steps; ++i, ++pos) {
      ids->push_back(tok);
      ForwardBatch d;
      s.token_ids = {forced != nullptr ? (*forced)[i] : tok};
      s.start_pos = pos;
      s.all_logits = false;
      d.seqs = {s};
      ForwardResult dr;
      st = m.Forward(d, &dr);
      ASSERT_TRUE(st.ok()) << st;
      step_logits->push_back(dr.seqs[0].logits);
      tok = ArgMax(dr.seqs[0].logits, 0, V);
    }
  }

  // A quantized golden fixture on CUDA (auto: narrow) vs on the CPU (fp32: exact
  // dequantization).
  void Compare(const std::string& fixture) {
    const fs::path dir = fs::path(GLM_GOLDEN_DIR) / fixture;
    ASSERT_TRUE(fs::exists(dir / "reference.json"))
        << dir << " is missing: tools/golden/make_quantized_golden.py makes it";
    prompt_ = ReadJson(dir / "reference.json")["prompt_ids"].get<std::vector<int32_t>>();
    const int quantized_tensors = CountQuantized(dir);
    ASSERT_GT(quantized_tensors, 40);
    auto gpu = Load(dir, "cuda", "auto");
    auto cpu = Load(dir, "cpu", "fp32");
    ASSERT_NE(gpu, nullptr);
    ASSERT_NE(cpu, nullptr);
    const auto mem = WeightMemoryOf(*gpu);
    ASSERT_TRUE(mem.has_value());
    std::printf("cuda auto: %lld of %lld quantized tensors kept narrow, %lld bytes; Linear "
                "weights %lld bytes (%lld in fp32)\n",
                static_cast<long long>(mem->num_linear_quantized), quantized_tensors * 1LL,
                static_cast<long long>(mem->quantized_bytes),
                static_cast<long long>(mem->linear_bytes),
                static_cast<long long>(mem->linear_fp32_bytes));
    EXPECT_GT(mem->num_linear_quantized, 0);
    EXPECT_LE(mem->num_linear_quantized, quantized_tensors);
    EXPECT_GT(mem->quantized_bytes, 0);
    EXPECT_LT(mem->linear_bytes, mem->linear_fp32_bytes / 2);
    // Longer prompt too: prefill rows beyond the GEMV (weights widened to bf16 in scratch).
    std::vector<int32_t> long_prompt;
    while (long_prompt.size() < 40) {
      long_prompt.insert(long_prompt.end(), prompt_.begin(), prompt_.end());
    }
    long_prompt.resize(40);
    for (const auto* p : {&prompt_, &long_prompt}) {
      SCOPED_TRACE(p->size());
      std::vector<float> lc, lg;
      std::vector<std::vector<float>> sc, sg;
      std::vector<int32_t> ic, ig;
      const int64_t seq_id = p == &prompt_ ? 1 : 2;
      Run(*cpu, seq_id, *p, 8, &lc, &sc, nullptr, &ic);
      // The GPU decodes the CPU's tokens, so that both see the same prefixes.
      const CudaQuantExpertCalls before = CudaQuantExpertCallCounts();
      Run(*gpu, seq_id, *p, 8, &lg, &sg, &ic, &ig);
      const CudaQuantExpertCalls after = CudaQuantExpertCallCounts();
      std::printf("quantized expert calls: %lld narrow, %lld widened\n",
                  static_cast<long long>(after.narrow - before.narrow),
                  static_cast<long long>(after.widened - before.widened));
      EXPECT_GT(after.narrow, before.narrow);
      EXPECT_EQ(after.widened, before.widened) << "a step widened the experts";
      ASSERT_EQ(lc.size(), lg.size());
      double diff = 0;
      for (size_t i = 0; i < lc.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(lg[i]) - lc[i]));
      }
      const double rel = diff / MaxAbs(lc);
      std::printf("prompt of %zu: logits cuda narrow vs cpu fp32 %.3g of max |logit|\n",
                  p->size(), rel);
      EXPECT_LT(rel, kTol);
      const size_t V = sc[0].size();
      for (size_t i = 0; i < sc.size(); ++i) {
        const int32_t want = ArgMax(sc[i], 0, V), got = ArgMax(sg[i], 0, V);
        double step = 0;
        for (size_t j = 0; j < V; ++j) {
          step = std::max(step, std::fabs(static_cast<double>(sg[i][j]) - sc[i][j]));
        }
        EXPECT_LT(step / MaxAbs(sc[i]), kTol) << "decode step " << i;
        if (got != want) {
          const double margin = (sc[i][want] - sc[i][got]) / MaxAbs(sc[i]);
          EXPECT_LT(margin, kTol) << "decode step " << i << ": cuda " << got << " cpu " << want;
        }
      }
    }
  }

  static constexpr double kTol = 2e-2;
  std::vector<int32_t> prompt_;
};

// tests/golden/tiny-int4mix: compressed-tensors pack-quantized (INT4 experts, INT8 attention,
// dense and shared-expert MLPs, INT8 per channel for the last layer's attention).
TEST_F(CudaQuantModelTest, Int4Int8MixNarrowMatchesCpu) { Compare("tiny-int4mix"); }

// tests/golden/tiny-nvfp4: ModelOpt NVFP4 routed experts whose gate and up global scales differ.
TEST_F(CudaQuantModelTest, Nvfp4NarrowMatchesCpu) { Compare("tiny-nvfp4"); }

}  // namespace
}  // namespace glm::engine
