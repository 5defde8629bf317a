// MoeExperts on the CUDA backend (cuda_moe.cc, kernels/moe.h) against the CPU backend on the
// same (dequantized) expert weights, through every path (kernels::MoePolicy::Path, forced through
// the backend's kernel policy): the decode kernels, the token-group kernels, the fp8 tensor-core
// kernels and the tiled grouped GEMM (the reference), plus the default (kAuto), which must equal
// the forced path its shape selects bit for bit (so the selection itself is checked). Sweep: 1 /
// 2 / 8 / 33 tokens, fp32 / bf16 / fp8 (128x128 block scales) experts, top_k 1 and 8, 64
// experts of which only some are used (empty experts), an expert in every token (8 and 33 rows of
// one expert: several row passes, rows in both 32-pair halves), ids outside [0, experts)
// (contribute nothing), hidden / moe_inter that are not multiples of 128 (partial scale blocks).
// Weight rows are padded with NaN (a read past k poisons the output), outputs carry guards on
// both ends, every output is checked finite; each run is repeated for bit-identical results and
// a CUDA graph replay must equal the eager call bit for bit.
// Past 64 pairs: batch 9 / 16 / 33 / 64 / 130 with top-8 (pairs 72..1040) and top-1, an expert in
// every token (64 rows of one expert), every token on the same experts (8 experts of 20 / 130 /
// 512 rows: full and uneven token groups), invalid ids, 513 tokens (4104 pairs: the tiled GEMM
// under kAuto), the token-group kernels forced at 1 / 8 / 64 / 65 / 512 tokens. fp8 on tensor
// cores: forced at 1..512 tokens (hot, same experts, invalid ids, top-1), under kAuto in its
// range, rows scaled 2^-16..2^16 (split activations' block scales). MoeRouteExperts: the routing
// inside the gate|up decode kernel (kAuto at one token) equals MoeRoute's launch before the
// forced decode kernels bit for bit. Weight and expert setup: narrow_test_util.h (shared with
// cuda_narrow_test). GPU tests skip (printing why) without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/narrow_test_util.h"
#include "kernels/kernel_policy.h"
#include "kernels/moe.h"

namespace glm::engine {
namespace {

using Path = kernels::MoePolicy::Path;

// The path kAuto takes for `pairs` (the test's weights all have 16-byte rows).
Path AutoPath(int64_t pairs, WeightDType dtype) {
  if (pairs <= kernels::kMoeDecodeMaxPairs && dtype != WeightDType::kBF16) return Path::kDecode;
  if (pairs > kernels::kMoeGroupedMaxPairs) return Path::kTiled;
  if (dtype == WeightDType::kF8E4M3Block128 && pairs >= kernels::kMoeMmaMinPairs) {
    return Path::kMma;
  }
  return Path::kGrouped;
}

const char* PathName(Path p) {
  switch (p) {
    case Path::kAuto: return "auto";
    case Path::kDecode: return "decode";
    case Path::kGrouped: return "grouped";
    case Path::kMma: return "mma";
    case Path::kTiled: return "tiled";
  }
  return "?";
}

using narrow_test::DTypeName;
using narrow_test::kGuard;
using narrow_test::kGuardValue;
using Experts = narrow_test::NarrowExperts;

struct Case {
  int tokens, top_k;
  bool hot;           // expert 0 in every token
  bool invalid;       // some ids are -1 or num_experts
  bool same = false;  // every token routed to the same top_k experts (each has `tokens` rows)
};

class CudaMoeTest : public ::testing::Test {
 protected:
  static constexpr int kExperts = 64, kUsed = 40;
  // Widths that are not multiples of 128 (partial scale blocks) and, for fp8, not of 512 bytes
  // (the decode kernels' per-task form); StreamedDecodeMatchesCpu sets whole chunk iterations.
  int hidden_ = 528, inter_ = 272;

  void SetUp() override {
    const absl::Status avail = CudaDeviceAvailable();
    if (!avail.ok()) GTEST_SKIP() << avail.message();
    auto b = CreateCudaBackend(0);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    cpu_ = std::make_unique<CpuBackend>(4);
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
    }
  }

  void UsePath(Path path) {
    kernels::KernelPolicy policy;
    policy.moe.path = path;
    gpu_->SetKernelPolicy(policy);
  }

  // Weight rows padded by one 16-byte chunk of NaN, fp8 scale rows by NaN columns.
  Experts MakeExperts(WeightDType dtype) {
    return narrow_test::MakeNarrowExperts(*gpu_, dtype, kExperts, inter_, hidden_, rng_,
                                          {1, 1, std::numeric_limits<float>::quiet_NaN()});
  }

  // Runs one case through `path`: GPU vs CPU, guards, finite, a repeat bit-identical; kAuto
  // also bit for bit against the path its shape selects, forced.
  void Check(Experts& ex, WeightDType dtype, const Case& c, Path path) {
    const std::string what =
        absl::StrCat(DTypeName(dtype), " ", PathName(path), " tokens=", c.tokens, " top_k=",
                     c.top_k, c.hot ? " hot" : "", c.invalid ? " invalid_ids" : "",
                     c.same ? " same_experts" : "");
    SCOPED_TRACE(what);
    std::vector<int32_t> ids;
    for (int t = 0; t < c.tokens; ++t) {
      std::vector<int32_t> perm(kUsed);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      if (c.hot) std::swap(*std::find(perm.begin(), perm.end(), 0), perm[0]);
      if (c.same && t > 0) std::copy(ids.begin(), ids.begin() + c.top_k, perm.begin());
      ids.insert(ids.end(), perm.begin(), perm.begin() + c.top_k);
    }
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    std::vector<float> wts(ids.size());
    for (float& v : wts) v = ud(rng_);
    // CPU reference: an invalid id contributes nothing = expert 0 with weight 0.
    std::vector<int32_t> cpu_ids = ids;
    std::vector<float> cpu_w = wts;
    if (c.invalid) {
      for (size_t i = 0; i < ids.size(); i += 3) {
        ids[i] = (i / 3) % 2 ? -1 : kExperts;
        cpu_ids[i] = 0;
        cpu_w[i] = 0.0f;
      }
    }
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(c.tokens) * hidden_), out0(size_t(c.tokens) * hidden_);
    for (float& v : x) v = nd(rng_);
    if (x_scale_spread_) {
      // Token t's row times 2^(8 (t % 5) - 16): 2^-16 .. 2^16.
      for (int t = 0; t < c.tokens; ++t) {
        const float s = std::ldexp(1.0f, 8 * (t % 5) - 16);
        for (int i = 0; i < hidden_; ++i) x[size_t(t) * hidden_ + i] *= s;
      }
    }
    for (float& v : out0) v = nd(rng_);
    std::vector<float> want = out0;
    cpu_->MoeExperts(MatView{x.data(), c.tokens, hidden_, hidden_}, cpu_ids.data(), cpu_w.data(),
                     c.top_k, ex.Host(), MatView{want.data(), c.tokens, hidden_, hidden_});

    std::vector<float> host(out0.size() + 2 * kGuard, kGuardValue);
    std::copy(out0.begin(), out0.end(), host.begin() + kGuard);
    auto dx = gpu_->Allocate(x.size() * 4), dout = gpu_->Allocate(host.size() * 4);
    auto dids = gpu_->Allocate(ids.size() * 4), dw = gpu_->Allocate(wts.size() * 4);
    gpu_->CopyToDevice(dx->data(), x.data(), x.size() * 4);
    gpu_->CopyToDevice(dids->data(), ids.data(), ids.size() * 4);
    gpu_->CopyToDevice(dw->data(), wts.data(), wts.size() * 4);
    const MatView xv{dx->f32(), c.tokens, hidden_, hidden_};
    const MatView ov{dout->f32() + kGuard, c.tokens, hidden_, hidden_};
    // Calls 0 and 1 through `path` (bit-identical: deterministic); under kAuto, call 2 through
    // the forced path of the shape (the same kernels: the same bits).
    const bool automatic = path == Path::kAuto;
    const Path selected = AutoPath(int64_t{c.tokens} * c.top_k, dtype);
    std::vector<float> got[3];
    for (int call = 0; call < (automatic ? 3 : 2); ++call) {
      std::vector<float>& g = got[call];
      UsePath(call == 2 ? selected : path);
      gpu_->CopyToDevice(dout->data(), host.data(), host.size() * 4);
      gpu_->MoeExperts(xv, dids->i32(), dw->f32(), c.top_k, ex.Device(), ov);
      g.resize(host.size());
      gpu_->CopyToHost(g.data(), dout->data(), g.size() * 4);
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    }
    UsePath(Path::kAuto);
    ASSERT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4), 0)
        << "a repeated call differs";
    if (automatic) {
      ASSERT_EQ(std::memcmp(got[0].data(), got[2].data(), got[0].size() * 4), 0)
          << "kAuto differs from the forced " << PathName(selected) << " path";
    }
    double max_ref = 1.0, max_diff = 0.0;
    for (size_t i = 0; i < host.size(); ++i) {
      if (i < kGuard || i >= kGuard + out0.size()) {
        ASSERT_EQ(got[0][i], kGuardValue) << "wrote outside the output at " << i;
        continue;
      }
      ASSERT_TRUE(std::isfinite(got[0][i])) << "non-finite at " << i - kGuard;
      max_ref = std::max(max_ref, std::abs(double(want[i - kGuard])));
      max_diff = std::max(max_diff, std::abs(double(got[0][i]) - want[i - kGuard]));
    }
    EXPECT_LE(max_diff, 1e-4 * max_ref) << "max_diff=" << max_diff;
    std::printf("[%s] max |gpu - cpu| = %.3g (max |ref| %.3g)\n", what.c_str(), max_diff, max_ref);
  }

  bool x_scale_spread_ = false;  // Check: token rows scaled by 2^-16 .. 2^16
  std::mt19937 rng_{11};
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<CpuBackend> cpu_;
};

TEST_F(CudaMoeTest, AllPathsMatchCpu) {
  const Case cases[] = {{1, 8, false, false}, {1, 1, false, false}, {2, 8, false, false},
                        {8, 8, false, false}, {8, 8, true, false},  {8, 1, false, false},
                        {33, 1, true, false}, {33, 1, false, true}, {7, 8, true, true},
                        {33, 8, false, false}};
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    Experts ex = MakeExperts(dtype);
    for (const Case& c : cases) {
      Check(ex, dtype, c, Path::kAuto);
      // The decode kernels for every dtype (bf16 only forced) wherever they apply.
      if (c.tokens * c.top_k <= kernels::kMoeDecodeMaxPairs) Check(ex, dtype, c, Path::kDecode);
      if (c.tokens <= 8) Check(ex, dtype, c, Path::kTiled);
    }
  }
}

// The decode kernels' streamed form (moe_decode.cuh DecodeStream: a warp's tasks, one pass per
// pair, back to back through its ring) against the CPU, guards and NaN row padding. It applies
// to rows of whole 512-byte chunk iterations (hidden 1024, moe_inter 512 here) and, for fp8, to
// every decode step (several pairs per slot: passes in DecodeTask's order); fp32 only where
// every slot holds one pair (one token; the other cases run the per-task form).
TEST_F(CudaMoeTest, StreamedDecodeMatchesCpu) {
  hidden_ = 1024;
  inter_ = 512;
  const Case cases[] = {{1, 8, false, false},       {1, 8, false, true}, {1, 1, false, false},
                        {2, 8, false, false, true}, {8, 8, true, false}, {7, 8, true, true},
                        {33, 1, true, false}};
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kF8E4M3Block128}) {
    Experts ex = MakeExperts(dtype);
    for (const Case& c : cases) Check(ex, dtype, c, Path::kAuto);
  }
}

// Past 64 pairs: the token-group kernels (kAuto from 65 up to 4096 pairs, fp8 from 513 on the
// tensor cores, then tiled; forced at small and the largest sizes) against the CPU backend. With
// 40 used experts, batch 64 top-8 gives each expert ~13 rows (several token groups) and the hot
// expert 64; "same experts" routes every token to the same top_k experts (tokens rows each: 20 =
// 5 groups of 4, 130 = 33 groups of 3 or 4, 512 forced); batch 9 is the first past the decode
// kernels, 64 x top-1 (64 pairs) stays on them, 513 x top-8 (4104 pairs) is the first on the
// tiled GEMM.
TEST_F(CudaMoeTest, GroupedMatchesCpu) {
  const Case cases[] = {{9, 8, false, false},       {16, 8, false, false},
                        {33, 8, true, false},       {64, 8, false, false},
                        {64, 8, true, true},        {64, 1, false, false},
                        {20, 8, false, true, true}, {33, 1, true, false},
                        {130, 8, false, false, true}, {513, 8, false, false}};
  const Case grouped[] = {{1, 8, false, false}, {8, 8, true, true}, {64, 8, true, false},
                          {65, 8, true, false}, {512, 8, false, false, true}};
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    Experts ex = MakeExperts(dtype);
    for (const Case& c : cases) Check(ex, dtype, c, Path::kAuto);
    for (const Case& c : grouped) Check(ex, dtype, c, Path::kGrouped);
  }
}

// fp8 experts on the tensor cores (forced) against the CPU backend: batch 1 / 9 / 16 / 33 / 64
// / 130 / 512 (4096 pairs, the largest listed size) with top-8 and top-1, a hot expert (64 and
// 130 rows of one expert: 8-row n-tiles in sequence), every token on the same experts, invalid
// ids; hidden 528 / moe_inter 272 leave a last K block of 16 values (the other 48 of its chunk
// load zeros; the rows' NaN padding would poison a read past k) and a down tile half past n.
// Also runs a few rows far from 1 in magnitude (per-block power-of-two scales of the split
// activations), and kAuto inside its tensor-core range.
TEST_F(CudaMoeTest, MmaMatchesCpu) {
  const Case cases[] = {{1, 8, false, false},        {1, 1, false, false},
                        {9, 8, false, false},        {16, 8, false, false},
                        {33, 8, true, false},        {33, 1, true, false},
                        {64, 8, false, false},       {64, 8, true, true},
                        {64, 1, false, true},        {20, 8, false, false, true},
                        {130, 8, true, false},       {130, 8, false, false, true},
                        {512, 8, false, false}};
  Experts ex = MakeExperts(WeightDType::kF8E4M3Block128);
  for (const Case& c : cases) Check(ex, WeightDType::kF8E4M3Block128, c, Path::kMma);
  // kAuto inside its mma range (65..512 tokens with top-8).
  for (const Case& c : {Case{65, 8, false, false}, Case{100, 8, true, true},
                        Case{128, 8, false, false}, Case{300, 8, false, false}}) {
    Check(ex, WeightDType::kF8E4M3Block128, c, Path::kAuto);
  }
  x_scale_spread_ = true;
  for (const Case& c : {Case{16, 8, false, false}, Case{64, 8, true, false}}) {
    Check(ex, WeightDType::kF8E4M3Block128, c, Path::kMma);
  }
  x_scale_spread_ = false;
}

// A new kernel policy moves the backend's scratch epoch (decode graphs are recaptured under it).
TEST_F(CudaMoeTest, PolicyMovesTheEpoch) {
  const int64_t epoch0 = gpu_->scratch_epoch();
  UsePath(Path::kTiled);
  EXPECT_NE(gpu_->scratch_epoch(), epoch0);
}

// MoeRouteExperts: under kAuto, at <= kernels::kMoeRouteFuseMaxTokens tokens on the decode
// kernels the gate|up kernel routes for itself; it must give the ids, weights and out of the
// separate MoeRoute launch before the same kernels (the decode path forced, which never fuses)
// bit for bit (the same RouteRowWarp arithmetic), and match the CPU backend's default
// MoeRouteExperts (ids equal, weights within 1e-6, out within 1e-4 relative). Cases: 1 / 2 / 3 /
// 4 tokens, top-8 and top-1, with and without bias, with and without the shared expert appended
// (63 routed experts + expert 63 as the shared one), a group-limited routing (n_group 4,
// topk_group 2: never fused), fp32 / bf16 / fp8 experts (bf16: the token-group kernels under
// kAuto, against them forced), and a graph capture of the fused call replaying to the eager
// result.
TEST_F(CudaMoeTest, RouteExpertsFusedEqualsSeparateRoute) {
  struct RCase {
    int tokens, top_k;
    bool bias, appended;
    int n_group = 1, topk_group = 1;
  };
  const RCase cases[] = {{1, 8, true, true},  {1, 8, false, false}, {2, 8, true, true},
                         {2, 1, true, false}, {3, 8, true, true},   {1, 8, true, false, 4, 2},
                         {1, 1, false, true}, {4, 8, true, true}};
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    Experts ex = MakeExperts(dtype);
    for (const RCase& c : cases) {
      const int routed = c.appended ? kExperts - 1 : kExperts;
      const int k = c.top_k + (c.appended ? 1 : 0);
      // bf16 experts run the token-group kernels at decode sizes (kAuto), which never fuse.
      const Path separate_path = dtype == WeightDType::kBF16 ? Path::kGrouped : Path::kDecode;
      const bool may_fuse = dtype != WeightDType::kBF16 &&
                            c.tokens <= kernels::kMoeRouteFuseMaxTokens && c.n_group == 1;
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " tokens=", c.tokens, " top_k=", c.top_k,
                                c.bias ? " bias" : "", c.appended ? " shared_appended" : "",
                                " n_group=", c.n_group));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> logits(size_t(c.tokens) * routed), bias(routed);
      for (float& v : logits) v = 2.0f * nd(rng_);
      for (float& v : bias) v = 0.1f * nd(rng_);
      std::vector<float> x(size_t(c.tokens) * hidden_), out0(x.size());
      for (float& v : x) v = nd(rng_);
      for (float& v : out0) v = nd(rng_);
      auto dl = gpu_->Allocate(logits.size() * 4), db = gpu_->Allocate(bias.size() * 4);
      auto dx = gpu_->Allocate(x.size() * 4), dout = gpu_->Allocate(x.size() * 4);
      auto dids = gpu_->Allocate(size_t(c.tokens) * k * 4);
      auto dw = gpu_->Allocate(size_t(c.tokens) * k * 4);
      gpu_->CopyToDevice(dl->data(), logits.data(), logits.size() * 4);
      gpu_->CopyToDevice(db->data(), bias.data(), bias.size() * 4);
      gpu_->CopyToDevice(dx->data(), x.data(), x.size() * 4);
      const MatView lv{dl->f32(), c.tokens, routed, routed};
      const MatView xv{dx->f32(), c.tokens, hidden_, hidden_};
      const MatView ov{dout->f32(), c.tokens, hidden_, hidden_};
      MoeRouteArgs r;
      r.bias = c.bias ? db->f32() : nullptr, r.n_group = c.n_group, r.topk_group = c.topk_group;
      r.top_k = c.top_k, r.renormalize = true, r.scale = 2.5f;
      r.appended = c.appended ? routed : -1;
      r.ids = dids->i32(), r.weights = dw->f32();
      struct Result {
        std::vector<int32_t> ids;
        std::vector<float> w, out;
      };
      auto run = [&](Path path) {
        UsePath(path);
        gpu_->CopyToDevice(dout->data(), out0.data(), out0.size() * 4);
        std::vector<int32_t> poison_i(size_t(c.tokens) * k, -7);
        std::vector<float> poison_w(poison_i.size(), -7.0f);
        gpu_->CopyToDevice(dids->data(), poison_i.data(), poison_i.size() * 4);
        gpu_->CopyToDevice(dw->data(), poison_w.data(), poison_w.size() * 4);
        gpu_->MoeRouteExperts(lv, r, xv, ex.Device(), ov);
        Result res{std::vector<int32_t>(poison_i.size()), std::vector<float>(poison_w.size()),
                   std::vector<float>(x.size())};
        gpu_->CopyToHost(res.ids.data(), dids->data(), res.ids.size() * 4);
        gpu_->CopyToHost(res.w.data(), dw->data(), res.w.size() * 4);
        gpu_->CopyToHost(res.out.data(), dout->data(), res.out.size() * 4);
        EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
        return res;
      };
      const Result fused = run(Path::kAuto);  // fused where may_fuse
      const Result separate = run(separate_path);
      UsePath(Path::kAuto);
      ASSERT_EQ(fused.ids, separate.ids);
      ASSERT_EQ(std::memcmp(fused.w.data(), separate.w.data(), fused.w.size() * 4), 0);
      ASSERT_EQ(std::memcmp(fused.out.data(), separate.out.data(), fused.out.size() * 4), 0)
          << (may_fuse ? "routing inside the gate|up kernel" : "kAuto")
          << " differs from MoeRoute before the forced path";

      // The CPU backend's default MoeRouteExperts (MoeRoute, then MoeExperts).
      std::vector<int32_t> cids(fused.ids.size());
      std::vector<float> cw(fused.w.size()), cout = out0;
      MoeRouteArgs cr = r;
      cr.bias = c.bias ? bias.data() : nullptr, cr.ids = cids.data(), cr.weights = cw.data();
      cpu_->MoeRouteExperts(MatView{logits.data(), c.tokens, routed, routed}, cr,
                            MatView{x.data(), c.tokens, hidden_, hidden_}, ex.Host(),
                            MatView{cout.data(), c.tokens, hidden_, hidden_});
      ASSERT_EQ(fused.ids, cids);
      double max_ref = 1.0, max_diff = 0.0;
      for (size_t i = 0; i < cw.size(); ++i) {
        ASSERT_NEAR(fused.w[i], cw[i], 1e-6f * std::abs(cw[i]) + 1e-7f) << "weight " << i;
      }
      for (size_t i = 0; i < cout.size(); ++i) {
        ASSERT_TRUE(std::isfinite(fused.out[i])) << "non-finite at " << i;
        max_ref = std::max(max_ref, std::abs(double(cout[i])));
        max_diff = std::max(max_diff, std::abs(double(fused.out[i]) - cout[i]));
      }
      EXPECT_LE(max_diff, 1e-4 * max_ref) << "max_diff=" << max_diff;

      if (may_fuse && gpu_->SupportsGraphs()) {
        gpu_->SetPointerChecks(false);  // as the decode graphs run
        gpu_->BeginCapture();
        gpu_->MoeRouteExperts(lv, r, xv, ex.Device(), ov);
        std::unique_ptr<BackendGraph> graph = gpu_->EndCapture();
        gpu_->SetPointerChecks(true);
        ASSERT_NE(graph, nullptr) << gpu_->status();
        gpu_->CopyToDevice(dout->data(), out0.data(), out0.size() * 4);
        const std::vector<int32_t> poison(fused.ids.size(), -7);
        gpu_->CopyToDevice(dids->data(), poison.data(), poison.size() * 4);
        gpu_->ReplayGraph(*graph);
        std::vector<float> replay(x.size());
        std::vector<int32_t> rids(fused.ids.size());
        gpu_->CopyToHost(replay.data(), dout->data(), replay.size() * 4);
        gpu_->CopyToHost(rids.data(), dids->data(), rids.size() * 4);
        ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
        EXPECT_EQ(rids, fused.ids);
        EXPECT_EQ(std::memcmp(replay.data(), fused.out.data(), replay.size() * 4), 0)
            << "graph replay differs from eager";
      }
    }
  }
}

// A captured graph of each default path replays to the eager result bit for bit: the decode
// kernels at 1 / 8 tokens, the token-group kernels at 9 / 16 / 64 (device token
// lists), the fp8 tensor-core kernels at 65 / 100 (520 / 800 pairs), the tiled GEMM at 513
// (4104 pairs, past kernels::kMoeGroupedMaxPairs).
TEST_F(CudaMoeTest, GraphReplayEqualsEager) {
  if (!gpu_->SupportsGraphs()) GTEST_SKIP() << "backend without graphs";
  Experts ex = MakeExperts(WeightDType::kF8E4M3Block128);
  // A replay equals eager, and a second replay the first.
  for (int tokens : {1, 8, 9, 16, 64, 65, 100, 513}) {
    SCOPED_TRACE(absl::StrCat("tokens=", tokens));
    const int top_k = 8;
    std::vector<int32_t> ids;
    for (int t = 0; t < tokens; ++t) {
      std::vector<int32_t> perm(kExperts);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      ids.insert(ids.end(), perm.begin(), perm.begin() + top_k);
    }
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(tokens) * hidden_), out0(x.size()), wts(ids.size());
    for (float& v : x) v = nd(rng_);
    for (float& v : out0) v = nd(rng_);
    for (float& v : wts) v = std::abs(nd(rng_));
    auto dx = gpu_->Allocate(x.size() * 4), dout = gpu_->Allocate(x.size() * 4);
    auto dids = gpu_->Allocate(ids.size() * 4), dw = gpu_->Allocate(wts.size() * 4);
    gpu_->CopyToDevice(dx->data(), x.data(), x.size() * 4);
    gpu_->CopyToDevice(dids->data(), ids.data(), ids.size() * 4);
    gpu_->CopyToDevice(dw->data(), wts.data(), wts.size() * 4);
    gpu_->CopyToDevice(dout->data(), out0.data(), out0.size() * 4);
    const MatView xv{dx->f32(), tokens, hidden_, hidden_},
        ov{dout->f32(), tokens, hidden_, hidden_};
    gpu_->MoeExperts(xv, dids->i32(), dw->f32(), top_k, ex.Device(), ov);
    std::vector<float> eager(x.size()), replay(x.size());
    gpu_->CopyToHost(eager.data(), dout->data(), eager.size() * 4);
    gpu_->SetPointerChecks(false);  // as the decode graphs run
    gpu_->BeginCapture();
    gpu_->MoeExperts(xv, dids->i32(), dw->f32(), top_k, ex.Device(), ov);
    std::unique_ptr<BackendGraph> graph = gpu_->EndCapture();
    ASSERT_NE(graph, nullptr) << gpu_->status();
    for (int round = 0; round < 2; ++round) {
      gpu_->CopyToDevice(dout->data(), out0.data(), out0.size() * 4);
      gpu_->ReplayGraph(*graph);
      gpu_->CopyToHost(replay.data(), dout->data(), replay.size() * 4);
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      EXPECT_EQ(std::memcmp(eager.data(), replay.data(), eager.size() * 4), 0) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace glm::engine
