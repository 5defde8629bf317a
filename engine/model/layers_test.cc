// WeightLoader::LinearRows and FusedLinear: Linear weights that share an input, stored as one
// weight, give the same outputs as separate Linear weights (CPU backend, bit for bit). Moe: the
// shared expert folded into MoeExperts gives the unfolded layer's output. Tensor parallelism:
// a rank's share of a Linear weight is the slice of the whole (every storage), and the ranks'
// partial MoE outputs add up to the unsharded layer's.
#include "engine/model/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/config/model_config.h"
#include "engine/dist/communicator.h"
#include "engine/dist/testing/fake_communicator.h"

namespace glm::engine {
namespace {

// InMemoryWeights whose tensors named in fp8_ are also served as e4m3 + 128 x 128 block scales.
class Fp8Weights : public InMemoryWeights {
 public:
  // A [rows, cols] fp8 tensor: e4m3 codes with exponent field <= 7 (no NaN), one random scale per
  // block; ReadFloat serves its dequantized values.
  void PutFp8(const std::string& name, int64_t rows, int64_t cols, std::mt19937& rng) {
    Fp8BlockTensor t;
    t.shape = {rows, cols};
    t.data.resize(rows * cols);
    const int64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
    t.scales.resize(srows * scols);
    for (float& s : t.scales) s = std::uniform_real_distribution<float>(0.25f, 2.0f)(rng);
    std::vector<float> f(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t b = static_cast<uint8_t>(rng() & 0xBF);  // sign | exponent <= 7 | mantissa
        t.data[r * cols + c] = b;
        f[r * cols + c] = Decode(b) * t.scales[(r / 128) * scols + c / 128];
      }
    }
    Put(name, {rows, cols}, std::move(f));
    fp8_[name] = std::move(t);
  }
  bool IsFp8Block(const std::string& name) const override { return fp8_.count(name) > 0; }
  absl::StatusOr<Fp8BlockTensor> ReadFp8Block(const std::string& name) override {
    auto it = fp8_.find(name);
    if (it == fp8_.end()) return absl::NotFoundError(name);
    return it->second;
  }

 private:
  static float Decode(uint8_t b) {
    const int e = (b >> 3) & 0xF, m = b & 7;
    const float v = e == 0 ? m / 8.0f / 64.0f : (1.0f + m / 8.0f) * std::ldexp(1.0f, e - 7);
    return (b & 0x80) ? -v : v;
  }
  std::map<std::string, Fp8BlockTensor> fp8_;
};

void PutPlain(InMemoryWeights& w, const std::string& name, int64_t rows, int64_t cols,
              std::mt19937& rng) {
  std::vector<float> v(rows * cols);
  for (float& x : v) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  w.Put(name, {rows, cols}, std::move(v));
}

class FusedLinearTest : public ::testing::Test {
 protected:
  static constexpr int64_t kCols = 160;  // two 128-column scale blocks, the second partial
  static constexpr int64_t kTokens = 3;

  void SetUp() override {
    std::mt19937 rng(7);
    src_.PutFp8("a", 200, kCols, rng);  // 1 full + 1 partial scale block of rows
    src_.PutFp8("b", 40, kCols, rng);
    src_.PutFp8("c", 130, kCols, rng);
    PutPlain(src_, "p", 24, kCols, rng);
    std::vector<float> x(kTokens * kCols);
    for (float& v : x) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    x_buf_ = backend_->Allocate(x.size() * sizeof(float));
    backend_->CopyToDevice(x_buf_->data(), x.data(), x.size() * sizeof(float));
    x_ = {x_buf_->f32(), kTokens, kCols, kCols};
  }

  // y = x . w^T on the backend, copied to the host.
  std::vector<float> Run(const MatView& w, int64_t n) {
    auto y = backend_->Allocate(kTokens * n * sizeof(float));
    backend_->Linear(x_, w, MatView{y->f32(), kTokens, n, n}, false);
    std::vector<float> h(kTokens * n);
    backend_->CopyToHost(h.data(), y->data(), h.size() * sizeof(float));
    return h;
  }

  // Every part's columns of the fused output equal the part loaded on its own, bit for bit, and
  // the columns between parts are zero.
  void ExpectSameAsSeparate(LinearWeightMode mode, const std::vector<LinearPart>& parts,
                            size_t want_groups) {
    WeightLoader fused_loader(src_, backend_.get(), mode);
    auto f = FusedLinear::Load(fused_loader, parts, kCols);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->num_groups(), want_groups);
    auto out = backend_->Allocate(kTokens * f->out_cols() * sizeof(float));
    const MatView o{out->f32(), kTokens, f->out_cols(), f->out_cols()};
    backend_->Fill(o, 123.0f);
    StepContext ctx;
    ctx.backend = backend_.get();
    f->Forward(ctx, x_, o);
    std::vector<float> fused(kTokens * f->out_cols());
    backend_->CopyToHost(fused.data(), out->data(), fused.size() * sizeof(float));
    std::vector<bool> covered(f->out_cols(), false);
    WeightLoader plain_loader(src_, backend_.get(), mode);
    for (size_t i = 0; i < parts.size(); ++i) {
      auto w = plain_loader.Linear(parts[i].name, parts[i].rows, kCols);
      ASSERT_TRUE(w.ok()) << w.status();
      const std::vector<float> want = Run(w->view, parts[i].rows);
      const MatView p = f->Part(o, i);
      ASSERT_EQ(p.cols, parts[i].rows);
      const int64_t first = p.data - o.data;
      for (int64_t t = 0; t < kTokens; ++t) {
        for (int64_t j = 0; j < p.cols; ++j) {
          ASSERT_EQ(fused[t * o.ld + first + j], want[t * p.cols + j])
              << parts[i].name << " token " << t << " row " << j;
        }
      }
      for (int64_t j = 0; j < p.cols; ++j) covered[first + j] = true;
    }
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int64_t j = 0; j < o.cols; ++j) {
        if (!covered[j]) EXPECT_EQ(fused[t * o.ld + j], 0.0f) << "padding column " << j;
      }
    }
    // Each part counts as one Linear, padding aside.
    EXPECT_EQ(fused_loader.bytes().linear, plain_loader.bytes().linear);
    EXPECT_EQ(fused_loader.bytes().fp8_payload, plain_loader.bytes().fp8_payload);
    EXPECT_EQ(fused_loader.bytes().fp8_scales, plain_loader.bytes().fp8_scales);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(fused_loader.bytes().num_linear[k], plain_loader.bytes().num_linear[k]);
    }
    EXPECT_GE(fused_loader.bytes().total, plain_loader.bytes().total);
  }

  Fp8Weights src_;
  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
  std::unique_ptr<Buffer> x_buf_;
  MatView x_;
};

TEST_F(FusedLinearTest, Fp8PartsStartOnScaleBlocks) {
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kAuto);
  std::vector<int64_t> offsets;
  auto m = w.LinearRows({{"a", 200}, {"b", 40}, {"c", 130}}, kCols, &offsets);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 256, 384}));
  EXPECT_EQ(m->view.rows, 384 + 130);
  EXPECT_EQ(m->view.dtype, WeightDType::kF8E4M3Block128);
  EXPECT_EQ(w.bytes().fp8_payload, (200 + 40 + 130) * kCols);
  EXPECT_EQ(w.bytes().total, (384 + 130) * kCols + 5 * m->view.scale_ld * 4);
  ExpectSameAsSeparate(LinearWeightMode::kAuto, {{"a", 200}, {"b", 40}, {"c", 130}}, 1);
}

TEST_F(FusedLinearTest, MixedStorageMakesOneGroupPerRun) {
  // p is not fp8 in the checkpoint: bf16 in auto mode, between two fp8 runs.
  ExpectSameAsSeparate(LinearWeightMode::kAuto, {{"a", 200}, {"p", 24}, {"b", 40}, {"c", 130}},
                       3);
  ExpectSameAsSeparate(LinearWeightMode::kAuto, {{"a", 200}, {"b", 40}, {"p", 24}}, 2);
}

TEST_F(FusedLinearTest, Bf16AndFp32PartsArePacked) {
  for (const LinearWeightMode mode : {LinearWeightMode::kBF16, LinearWeightMode::kF32}) {
    WeightLoader w(src_, backend_.get(), mode);
    std::vector<int64_t> offsets;
    auto m = w.LinearRows({{"a", 200}, {"p", 24}, {"b", 40}}, kCols, &offsets);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(offsets, (std::vector<int64_t>{0, 200, 224}));
    EXPECT_EQ(m->view.rows, 264);
    ExpectSameAsSeparate(mode, {{"a", 200}, {"p", 24}, {"b", 40}}, 1);
  }
}

TEST_F(FusedLinearTest, FuseOffLoadsEveryPartOnItsOwn) {
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kAuto);
  w.set_fuse(false);
  auto f = FusedLinear::Load(w, {{"a", 200}, {"b", 40}, {"c", 130}}, kCols);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->num_groups(), 3u);
  EXPECT_EQ(f->out_cols(), 200 + 40 + 130);  // no padding between groups
}

TEST_F(FusedLinearTest, LinearRowsRefusesPartsStoredDifferently) {
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kAuto);
  auto m = w.LinearRows({{"a", 200}, {"p", 24}}, kCols);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("p is not stored like a"), std::string::npos)
      << m.status();
}

TEST_F(FusedLinearTest, WrongPartShapeNamesTheTensor) {
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kAuto);
  auto f = FusedLinear::Load(w, {{"a", 200}, {"b", 41}}, kCols);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("tensor b has shape [40, 160]"), std::string::npos)
      << f.status();
}

TEST_F(FusedLinearTest, WeightPartIsEachPartsOwnWeight) {
  // Every storage: fp8 parts on scale-block boundaries (views of data and scales), bf16, fp32.
  for (const LinearWeightMode mode :
       {LinearWeightMode::kAuto, LinearWeightMode::kBF16, LinearWeightMode::kF32}) {
    WeightLoader fused_loader(src_, backend_.get(), mode);
    auto f = FusedLinear::Load(fused_loader, {{"a", 200}, {"b", 40}, {"c", 130}}, kCols);
    ASSERT_TRUE(f.ok()) << f.status();
    WeightLoader plain_loader(src_, backend_.get(), mode);
    const std::vector<LinearPart> parts = {{"a", 200}, {"b", 40}, {"c", 130}};
    for (size_t i = 0; i < parts.size(); ++i) {
      auto w = plain_loader.Linear(parts[i].name, parts[i].rows, kCols);
      ASSERT_TRUE(w.ok()) << w.status();
      const MatView part = f->WeightPart(i);
      EXPECT_EQ(part.rows, parts[i].rows);
      EXPECT_EQ(part.dtype, w->view.dtype);
      EXPECT_EQ(Run(part, parts[i].rows), Run(w->view, parts[i].rows))
          << parts[i].name << " mode " << static_cast<int>(mode);
    }
  }
}

// A Moe layer (spec §3.4) with a shared expert, on the CPU backend.
class MoeFoldTest : public ::testing::Test {
 protected:
  static constexpr int64_t kHidden = 256, kInter = 128, kTokens = 5;
  static constexpr int kExperts = 6, kTopK = 2;

  // Weights for n_shared shared experts; fp8 tensors when fp8.
  void MakeWeights(int n_shared, bool fp8) {
    std::mt19937 rng(11);
    auto put = [&](const std::string& name, int64_t rows, int64_t cols) {
      if (fp8) {
        src_.PutFp8(name, rows, cols, rng);
      } else {
        PutPlain(src_, name, rows, cols, rng);
      }
    };
    PutPlain(src_, "m.gate.weight", kExperts, kHidden, rng);
    for (int e = 0; e < kExperts; ++e) {
      const std::string p = "m.experts." + std::to_string(e);
      put(p + ".gate_proj.weight", kInter, kHidden);
      put(p + ".up_proj.weight", kInter, kHidden);
      put(p + ".down_proj.weight", kHidden, kInter);
    }
    put("m.shared_experts.gate_proj.weight", kInter * n_shared, kHidden);
    put("m.shared_experts.up_proj.weight", kInter * n_shared, kHidden);
    put("m.shared_experts.down_proj.weight", kHidden, kInter * n_shared);
    config_.hidden_size = kHidden;
    config_.moe_intermediate_size = kInter;
    config_.n_routed_experts = kExperts;
    config_.num_experts_per_tok = kTopK;
    config_.n_shared_experts = n_shared;
    config_.routed_scaling_factor = 2.5;
  }

  // out = x_resid + moe(x) for T rows, with the fold at max_tokens.
  std::vector<float> Forward(Moe& m, int64_t max_tokens) { return ForwardTp(m, max_tokens, nullptr); }
  // The same as a rank of the TP group `tp` (null: one rank).
  std::vector<float> ForwardTp(Moe& m, int64_t max_tokens, TpGroup* tp) {
    m.shared_fold_max_tokens = max_tokens;
    std::mt19937 rng(3);
    std::vector<float> x(kTokens * kHidden), resid(kTokens * kHidden);
    for (float& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    for (float& v : resid) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    auto xb = backend_->Allocate(x.size() * 4), ob = backend_->Allocate(resid.size() * 4);
    backend_->CopyToDevice(xb->data(), x.data(), x.size() * 4);
    backend_->CopyToDevice(ob->data(), resid.data(), resid.size() * 4);
    Workspace ws(backend_.get());
    StepContext ctx;
    ctx.backend = backend_.get();
    ctx.ws = &ws;
    ctx.tp = tp;
    m.Forward(ctx, {xb->f32(), kTokens, kHidden, kHidden}, {ob->f32(), kTokens, kHidden, kHidden});
    std::vector<float> out(resid.size());
    backend_->CopyToHost(out.data(), ob->data(), out.size() * 4);
    EXPECT_TRUE(backend_->status().ok()) << backend_->status();
    return out;
  }

  // Largest |a - b| over the largest |b - resid| (the size of the layer's own contribution).
  static double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, size = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
      size = std::max(size, std::abs(static_cast<double>(b[i])));
    }
    return diff / size;
  }

  Fp8Weights src_;
  ModelConfig config_;
  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
};

TEST_F(MoeFoldTest, FoldedSharedExpertGivesTheUnfoldedOutput) {
  MakeWeights(/*n_shared=*/1, /*fp8=*/false);
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kF32);
  auto m = Moe::Load(w, config_, "m");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->shared_folds);
  const std::vector<float> off = Forward(*m, 0), on = Forward(*m, kTokens);
  EXPECT_NE(off, on);  // another rounding order: the fold did run
  EXPECT_LT(RelDiff(on, off), 1e-5);
  // One row past the limit is the unfolded path again, bit for bit.
  EXPECT_EQ(Forward(*m, kTokens - 1), off);
}

TEST_F(MoeFoldTest, Fp8SharedExpertFoldsThroughWeightViews) {
  MakeWeights(/*n_shared=*/1, /*fp8=*/true);
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kAuto);
  auto m = Moe::Load(w, config_, "m");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->shared_folds);
  EXPECT_EQ(m->gate_views.back().dtype, WeightDType::kF8E4M3Block128);
  // Unfolded, Linear quantizes x to e4m3 per 128 columns; folded, MoeExperts multiplies the fp32
  // x: the outputs differ by that quantization (~1e-2), not by a wrong weight view (~1).
  EXPECT_LT(RelDiff(Forward(*m, kTokens), Forward(*m, 0)), 5e-2);
}

TEST_F(MoeFoldTest, WiderSharedExpertIsNotFolded) {
  MakeWeights(/*n_shared=*/2, /*fp8=*/false);
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kF32);
  auto m = Moe::Load(w, config_, "m");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->shared_folds);
  EXPECT_EQ(m->gate_views.size(), static_cast<size_t>(kExperts));
  EXPECT_EQ(Forward(*m, kTokens), Forward(*m, 0));
}

// A TP group member whose all-reduce leaves the data as it is, so that a test sees each rank's
// partial output (and sums the ranks itself).
using PartialsComm = FakeCommunicator;

TEST_F(MoeFoldTest, TpRanksPartialOutputsSumToTheWholeLayer) {
  MakeWeights(/*n_shared=*/1, /*fp8=*/false);
  WeightLoader whole_loader(src_, backend_.get(), LinearWeightMode::kF32);
  auto whole = Moe::Load(whole_loader, config_, "m");
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const int64_t fold_max : {int64_t{0}, kTokens}) {  // shared expert apart, then folded
    const std::vector<float> want = Forward(*whole, fold_max);
    constexpr int kTp = 2;
    std::vector<float> sum(want.size(), 0.0f);
    for (int rank = 0; rank < kTp; ++rank) {
      WeightLoader w(src_, backend_.get(), LinearWeightMode::kF32);
      w.set_tp({rank, kTp});
      auto m = Moe::Load(w, config_, "m");
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->gate_views[0].rows, kInter / kTp);
      EXPECT_EQ(m->down_views[0].cols, kInter / kTp);
      EXPECT_TRUE(m->shared_folds);  // the shared expert's share has the routed experts' shape
      PartialsComm comm(rank, kTp);
      TpGroup tp(rank, kTp, &comm);
      // Rank 0 adds its partial to the residual, the others start from zero (tp.h).
      const std::vector<float> out = ForwardTp(*m, fold_max, &tp);
      EXPECT_EQ(comm.num_all_reduce, 1) << "one all-reduce for routed and shared experts";
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
    }
    EXPECT_LT(RelDiff(sum, want), 1e-5) << "fold_max " << fold_max;
  }
}

// A rank's share of a Linear weight, in every storage, is the slice of the whole weight.
class TpLoaderTest : public ::testing::Test {
 protected:
  static constexpr int64_t kRows = 256, kCols = 256, kTokens = 3;

  void SetUp() override {
    std::mt19937 rng(5);
    src_.PutFp8("w", kRows, kCols, rng);  // 2 x 2 scale blocks
    PutPlain(src_, "f", kRows, kCols, rng);
    x_.resize(kTokens * kCols);
    for (float& v : x_) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  }

  // y = x[:, col_begin : col_begin + w.cols] . w^T, [kTokens, w.rows], on the host.
  std::vector<float> Run(const MatView& w, int64_t col_begin = 0) {
    std::vector<float> xs(kTokens * w.cols);
    for (int64_t t = 0; t < kTokens; ++t) {
      std::copy_n(x_.data() + t * kCols + col_begin, w.cols, xs.data() + t * w.cols);
    }
    auto xb = backend_->Allocate(xs.size() * 4);
    backend_->CopyToDevice(xb->data(), xs.data(), xs.size() * 4);
    auto y = backend_->Allocate(kTokens * w.rows * 4);
    backend_->Linear({xb->f32(), kTokens, w.cols, w.cols}, w,
                     MatView{y->f32(), kTokens, w.rows, w.rows}, false);
    std::vector<float> h(kTokens * w.rows);
    backend_->CopyToHost(h.data(), y->data(), h.size() * 4);
    return h;
  }

  Fp8Weights src_;
  std::vector<float> x_;  // [kTokens, kCols]
  std::unique_ptr<Backend> backend_ = CreateCpuBackend(1);
};

TEST_F(TpLoaderTest, ColumnAndRowParallelSharesAreSlicesOfTheWhole) {
  for (const LinearWeightMode mode :
       {LinearWeightMode::kF32, LinearWeightMode::kBF16, LinearWeightMode::kAuto}) {
    for (const std::string name : {"w", "f"}) {
      SCOPED_TRACE(name + " mode " + std::to_string(static_cast<int>(mode)));
      WeightLoader whole_loader(src_, backend_.get(), mode);
      auto whole = whole_loader.Linear(name, kRows, kCols);
      ASSERT_TRUE(whole.ok()) << whole.status();
      const std::vector<float> want = Run(whole->view);  // [kTokens, kRows]
      constexpr int kTp = 2;
      std::vector<float> row_sum(want.size(), 0.0f);
      for (int rank = 0; rank < kTp; ++rank) {
        WeightLoader w(src_, backend_.get(), mode);
        w.set_tp({rank, kTp});
        // Column-parallel: this rank's output columns, the same dot products bit for bit.
        auto col = w.Linear(name, kRows, kCols, TpSplit::kColumnParallel);
        ASSERT_TRUE(col.ok()) << col.status();
        ASSERT_EQ(col->view.rows, kRows / kTp);
        ASSERT_EQ(col->view.cols, kCols);
        EXPECT_EQ(col->view.dtype, whole->view.dtype);  // 128-row shares keep fp8
        const std::vector<float> got = Run(col->view);
        for (int64_t t = 0; t < kTokens; ++t) {
          for (int64_t j = 0; j < kRows / kTp; ++j) {
            ASSERT_EQ(got[t * (kRows / kTp) + j], want[t * kRows + rank * (kRows / kTp) + j])
                << "rank " << rank << " token " << t << " output " << j;
          }
        }
        // Row-parallel: partial sums over this rank's input columns.
        auto row = w.Linear(name, kRows, kCols, TpSplit::kRowParallel);
        ASSERT_TRUE(row.ok()) << row.status();
        ASSERT_EQ(row->view.rows, kRows);
        ASSERT_EQ(row->view.cols, kCols / kTp);
        EXPECT_EQ(row->view.dtype, whole->view.dtype);
        const std::vector<float> part = Run(row->view, rank * (kCols / kTp));
        for (size_t i = 0; i < part.size(); ++i) row_sum[i] += part[i];
      }
      double diff = 0, size = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(row_sum[i]) - want[i]));
        size = std::max(size, std::abs(static_cast<double>(want[i])));
      }
      EXPECT_LT(diff / size, 1e-5);
    }
  }
}

TEST_F(TpLoaderTest, Fp8ShareOffScaleBlocksIsDequantizedToBf16) {
  // tp_size 4: 64-row shares cut through the 128-row scale blocks.
  WeightLoader bf16_loader(src_, backend_.get(), LinearWeightMode::kBF16);
  auto whole = bf16_loader.Linear("w", kRows, kCols);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::vector<float> want = Run(whole->view);
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kAuto);
  w.set_tp({3, 4});
  EXPECT_EQ(w.LinearKind({"w", kRows, TpSplit::kColumnParallel}, kCols), WeightDType::kBF16);
  EXPECT_EQ(w.LinearKind({"w", kRows}, kCols), WeightDType::kF8E4M3Block128);
  auto share = w.Linear("w", kRows, kCols, TpSplit::kColumnParallel);
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_EQ(share->view.dtype, WeightDType::kBF16);
  const std::vector<float> got = Run(share->view);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t j = 0; j < 64; ++j) ASSERT_EQ(got[t * 64 + j], want[t * kRows + 192 + j]);
  }
}

TEST_F(TpLoaderTest, UnevenSplitAndOffBlockFp8SliceAreErrors) {
  WeightLoader w(src_, backend_.get(), LinearWeightMode::kF32);
  w.set_tp({0, 3});
  auto m = w.Linear("f", kRows, kCols, TpSplit::kRowParallel);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("tp_size=3"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("tensor f"), std::string::npos) << m.status();
  // The fp8 slice reader takes whole scale blocks only.
  auto t = src_.ReadFp8BlockSlice("w", {TensorSlice::kCols, 64, 128});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("128 boundaries"), std::string::npos) << t.status();
  auto ok = src_.ReadFp8BlockSlice("w", {TensorSlice::kCols, 128, 256});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->shape, (std::vector<int64_t>{kRows, 128}));
  EXPECT_EQ(ok->full_shape, (std::vector<int64_t>{kRows, kCols}));
  EXPECT_EQ(ok->scales.size(), 2u);
}

}  // namespace
}  // namespace glm::engine
