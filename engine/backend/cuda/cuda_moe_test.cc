// MoeExperts on the CUDA backend (cuda_ops_moe.cu) against the CPU backend on the same
// (dequantized) expert weights, through every GPU path (cuda_ops_moe.h MoeDecodePath): the
// decode kernels (default for tokens x top_k <= 64, fp32 / fp8; bf16 takes the token-group
// kernels there), their one-launch form (every decode case once more, bitwise against three
// launches; cuda_moe_progress_test runs it on two free SMs), the previous decode GEMV and the
// tiled grouped GEMM. Sweep: 1 / 2 / 8 / 33 tokens, fp32 / bf16 / fp8 (128x128 block scales) experts,
// top_k 1 and 8, 64 experts of which only some are used (empty experts), an expert in every
// token (8 and 33 rows of one expert: several row passes, rows in both 32-pair halves), ids
// outside [0, experts) (contribute nothing), hidden / moe_inter that are not multiples of 128
// (partial scale blocks). Weight rows are padded with NaN (a read past k poisons the output),
// outputs carry guards on both ends, every output is checked finite; each run is repeated for
// bit-identical results and a CUDA graph replay must equal the eager call bit for bit.
// Listed decode (64 < pairs <= 4096, cuda::kMoeListedMaxPairs: the token-group kernels; forced:
// them or the per-row listed kernels at any size up to 4096): batch 9 / 16 / 33 / 64 / 130
// with top-8 (pairs 72..1040) and top-1, fp32 / bf16 / fp8 experts, an expert in every token
// (64 rows of one expert), every token on the same experts (8 experts of 20 / 130 rows, 512
// forced: full and uneven token groups), invalid ids, 513 tokens (4104 pairs: the tiled GEMM
// under kAuto), both kernels forced at 1 / 8 / 64 / 65 tokens; each call is repeated with
// 1-row and 3-row token groups, which must not change a bit. Every call checks which kernels
// ran (cuda::LastMoeRanPath); graphs of the decode, token-group and tiled paths replay to the
// eager result bit for bit. fp8 on tensor cores (cuda::MoeDecodePath::kMma, MoeMmaKernel):
// forced at 1..512 tokens (hot, same experts, invalid ids, top-1), under kAuto in its range,
// rows scaled 2^-16..2^16 (split activations' block scales). Weight and expert setup:
// narrow_test_util.h (shared with cuda_narrow_test).
// GPU tests skip (printing why) without a usable GPU.
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
#include "engine/backend/cuda/cuda_ops_moe.h"
#include "engine/backend/cuda/narrow_test_util.h"

namespace glm::engine {
namespace {

using cuda::MoeDecodePath;
using cuda::MoeRanPath;

// The kernels MoeExperts must launch for `path` at `pairs` (the test's weights all have 16-byte
// rows, so the decode kernels apply).
// fp8 experts take the tensor-core kernels (MoeMmaKernel) under kAuto for
// cuda::kMoeMmaAutoMinPairs..kMoeMmaAutoMaxPairs pairs and whenever kMma is forced; kMma on
// bf16 / fp32 runs the token-group kernels.
MoeRanPath ExpectedPath(MoeDecodePath path, int64_t pairs, WeightDType dtype) {
  const bool fp8 = dtype == WeightDType::kF8E4M3Block128;
  switch (path) {
    case MoeDecodePath::kAuto:
      // bf16 at decode sizes: the token-group kernels (measured faster), else the decode ones.
      if (dtype == WeightDType::kBF16 && pairs <= cuda::kMoeDecodeMaxPairs) {
        return MoeRanPath::kGrouped;
      }
      return pairs <= cuda::kMoeDecodeMaxPairs ? MoeRanPath::kDecode
             : pairs <= cuda::kMoeListedMaxPairs
                 ? (fp8 && pairs >= cuda::kMoeMmaAutoMinPairs && pairs <= cuda::MoeMmaAutoMaxPairs()
                        ? MoeRanPath::kMma
                        : MoeRanPath::kGrouped)
                 : MoeRanPath::kTiled;
    case MoeDecodePath::kMma:
      return pairs <= cuda::kMoeListedForceMaxPairs
                 ? (fp8 ? MoeRanPath::kMma : MoeRanPath::kGrouped)
                 : MoeRanPath::kTiled;
    case MoeDecodePath::kLegacyGemv:
      return pairs <= cuda::kMoeDecodeMaxPairs ? MoeRanPath::kLegacyGemv : MoeRanPath::kTiled;
    case MoeDecodePath::kListed:
      return pairs <= cuda::kMoeListedForceMaxPairs ? MoeRanPath::kListed : MoeRanPath::kTiled;
    case MoeDecodePath::kGrouped:
      return pairs <= cuda::kMoeListedForceMaxPairs ? MoeRanPath::kGrouped : MoeRanPath::kTiled;
    case MoeDecodePath::kTiled:
      break;
  }
  return MoeRanPath::kTiled;
}

const char* RanName(MoeRanPath p) {
  switch (p) {
    case MoeRanPath::kNone: return "none";
    case MoeRanPath::kDecode: return "decode";
    case MoeRanPath::kListed: return "listed";
    case MoeRanPath::kGrouped: return "grouped";
    case MoeRanPath::kLegacyGemv: return "legacy_gemv";
    case MoeRanPath::kTiled: return "tiled";
    case MoeRanPath::kMma: return "mma";
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
  // (the decode kernels' per-task path); StreamedDecodeEqualsTasks sets whole chunk iterations.
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
    cuda::SetMoeDecodePath(MoeDecodePath::kAuto);
    cuda::SetMoeGroupTokens(4);
    cuda::SetMoeDecodeBalancedGrid(true);
    cuda::SetMoeRouteFuseMaxTokens(cuda::kMoeRouteFuseMaxTokens);
    cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeOneLaunchMaxTokens);
    if (gpu_ != nullptr) {
      EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
    }
  }

  // Weight rows padded by one 16-byte chunk of NaN, fp8 scale rows by NaN columns.
  Experts MakeExperts(WeightDType dtype) {
    return narrow_test::MakeNarrowExperts(*gpu_, dtype, kExperts, inter_, hidden_, rng_,
                                          {1, 1, std::numeric_limits<float>::quiet_NaN()});
  }

  // Runs one case through `path`: GPU vs CPU, guards, finite, repeat bit-identical.
  void Check(Experts& ex, WeightDType dtype, const Case& c, MoeDecodePath path,
             const char* path_name) {
    const std::string what =
        absl::StrCat(DTypeName(dtype), " ", path_name, " tokens=", c.tokens, " top_k=", c.top_k,
                     c.hot ? " hot" : "", c.invalid ? " invalid_ids" : "",
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
    cuda::SetMoeDecodePath(path);
    // Calls 0 and 1 alike (4-row token groups) but for the decode kernels' grid (call 1: every
    // resident CTA instead of the balanced grid), call 2 with 1-row and call 3 with 3-row token
    // groups (the grouped kernels compute every row alike whatever its group, and the decode
    // kernels every task alike whatever warp runs it, so all four must be bit-identical); call
    // 4 with the decode kernels' one-launch form on (cuda::SetMoeOneLaunchMaxTokens: the same
    // bits as three launches). Every case runs call 4, so at decode sizes the one-launch
    // kernel runs again and again on the layer's counters: one left non-zero breaks the next.
    // Call 5: the decode kernels' register double buffer instead of the cp.async ring
    // (cuda::SetMoeDecodeAsyncCopies; the same bits).
    std::vector<float> got[6];
    const bool decode =
        ExpectedPath(path, int64_t{c.tokens} * c.top_k, dtype) == MoeRanPath::kDecode &&
        path == MoeDecodePath::kAuto;
    for (int call = 0; call < 6; ++call) {
      std::vector<float>& g = got[call];
      cuda::SetMoeGroupTokens(call == 2 ? 1 : call == 3 ? 3 : 4);
      cuda::SetMoeDecodeBalancedGrid(call != 1);
      cuda::SetMoeOneLaunchMaxTokens(call == 4 ? cuda::kMoeDecodeMaxPairs : 0);
      cuda::SetMoeDecodeAsyncCopies(call != 5);
      gpu_->CopyToDevice(dout->data(), host.data(), host.size() * 4);
      gpu_->MoeExperts(xv, dids->i32(), dw->f32(), c.top_k, ex.Device(), ov);
      g.resize(host.size());
      gpu_->CopyToHost(g.data(), dout->data(), g.size() * 4);
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      const MoeRanPath want_path = ExpectedPath(path, int64_t{c.tokens} * c.top_k, dtype);
      ASSERT_EQ(cuda::LastMoeRanPath(), want_path)
          << "ran " << RanName(cuda::LastMoeRanPath()) << ", want " << RanName(want_path);
      ASSERT_EQ(cuda::LastMoeOneLaunch(), decode && call == 4) << "call " << call;
      // The ring wherever its kernel keeps as many CTAs per SM as the register one (H100 / H200:
      // 3 vs 2; GB10: 2 vs 2).
      ASSERT_EQ(cuda::LastMoeDecodeAsync(), decode && call != 4 && call != 5) << "call " << call;
      if (decode && call != 4) {
        ASSERT_EQ(cuda::MoeDecodeStreamedOnDevice(), expect_stream_ && call != 5)
            << "call " << call;
      }
    }
    cuda::SetMoeDecodeAsyncCopies(true);
    cuda::SetMoeGroupTokens(4);
    cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeOneLaunchMaxTokens);
    ASSERT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4), 0)
        << "the unbalanced decode grid (or a repeated call) differs";
    ASSERT_EQ(std::memcmp(got[0].data(), got[2].data(), got[0].size() * 4), 0)
        << "1-row token groups differ from 4-row ones";
    ASSERT_EQ(std::memcmp(got[0].data(), got[3].data(), got[0].size() * 4), 0)
        << "3-row token groups differ from 4-row ones";
    ASSERT_EQ(std::memcmp(got[0].data(), got[4].data(), got[0].size() * 4), 0)
        << "the one-launch decode kernel differs from three launches";
    ASSERT_EQ(std::memcmp(got[0].data(), got[5].data(), got[0].size() * 4), 0)
        << "the decode kernels' register double buffer differs from the cp.async ring";
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
  bool expect_stream_ = false;   // Check: the decode kernels must run DecodeStream
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
      Check(ex, dtype, c, MoeDecodePath::kAuto, "decode");
      Check(ex, dtype, c, MoeDecodePath::kLegacyGemv, "legacy_gemv");
      if (c.tokens <= 8) Check(ex, dtype, c, MoeDecodePath::kTiled, "tiled");
    }
  }
}

// The decode kernels' streamed form (cuda_ops_moe.cu DecodeStream: a warp's tasks, one pass per
// pair, back to back through its ring) against the per-task register form (Check's call 5) bit
// for bit, the CPU, guards and NaN row padding. It applies to rows of whole 512-byte chunk
// iterations (hidden 1024, moe_inter 512 here) and, for fp8, to every decode step (several
// pairs per slot: passes in DecodeTask's order); fp32 only where every slot holds one pair (one
// token). The kernels must report whether they streamed (cuda::MoeDecodeStreamedOnDevice).
TEST_F(CudaMoeTest, StreamedDecodeEqualsTasks) {
  hidden_ = 1024;
  inter_ = 512;
  const Case one_pair[] = {{1, 8, false, false}, {1, 8, false, true}, {1, 1, false, false}};
  const Case shared_slots[] = {
      {2, 8, false, false, true}, {8, 8, true, false}, {7, 8, true, true}, {33, 1, true, false}};
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kF8E4M3Block128}) {
    Experts ex = MakeExperts(dtype);
    expect_stream_ = true;
    for (const Case& c : one_pair) Check(ex, dtype, c, MoeDecodePath::kAuto, "decode");
    expect_stream_ = dtype == WeightDType::kF8E4M3Block128;
    for (const Case& c : shared_slots) Check(ex, dtype, c, MoeDecodePath::kAuto, "decode");
  }
}

// Decode batches past 64 pairs: the token-group listed kernels (kAuto from 65 up to 4096 pairs,
// then tiled; forced at small and the largest sizes) and the per-row listed kernels (forced)
// against the CPU backend. With 40 used experts, batch 64 top-8 gives each expert ~13 rows
// (several token groups) and the hot expert 64; "same experts" routes every token to the same
// top_k experts (tokens rows each: 20 = 5 groups of 4, 130 = 33 groups of 3 or 4, 512
// forced); batch 9 is the first past the decode kernels, 64 x top-1 (64 pairs) stays on them,
// 513 x top-8 (4104 pairs) is the first on the tiled GEMM.
TEST_F(CudaMoeTest, ListedDecodeMatchesCpu) {
  const Case cases[] = {{9, 8, false, false},       {16, 8, false, false},
                        {33, 8, true, false},       {64, 8, false, false},
                        {64, 8, true, true},        {64, 1, false, false},
                        {20, 8, false, true, true}, {33, 1, true, false},
                        {130, 8, false, false, true}, {513, 8, false, false}};
  const Case grouped[] = {{1, 8, false, false}, {8, 8, true, true}, {64, 8, true, false},
                          {65, 8, true, false}, {512, 8, false, false, true}};
  const Case listed[] = {{1, 8, false, false}, {8, 8, true, true}, {64, 8, true, false},
                         {65, 8, true, false}};
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    Experts ex = MakeExperts(dtype);
    for (const Case& c : cases) Check(ex, dtype, c, MoeDecodePath::kAuto, "auto");
    for (const Case& c : grouped) Check(ex, dtype, c, MoeDecodePath::kGrouped, "grouped_forced");
    for (const Case& c : listed) Check(ex, dtype, c, MoeDecodePath::kListed, "listed_forced");
  }
}

// fp8 experts on the tensor cores (MoeMmaKernel, forced) against the CPU backend: batch 1 / 9 /
// 16 / 33 / 64 / 130 / 512 (4096 pairs, the largest listed size) with top-8 and top-1, a hot
// expert (64 and 130 rows of one expert: 8-row n-tiles in sequence), every token on the same
// experts, invalid ids; hidden 528 / moe_inter 272 leave a last K block of 16 values (the other
// 48 of its chunk load zeros; the rows' NaN padding would poison a read past k) and a down
// tile half past n. Also runs a few rows far from 1 in magnitude (per-block power-of-two
// scales of the split activations). kMma forced on bf16 runs the token-group kernels.
TEST_F(CudaMoeTest, MmaMatchesCpu) {
  const Case cases[] = {{1, 8, false, false},        {1, 1, false, false},
                        {9, 8, false, false},        {16, 8, false, false},
                        {33, 8, true, false},        {33, 1, true, false},
                        {64, 8, false, false},       {64, 8, true, true},
                        {64, 1, false, true},        {20, 8, false, false, true},
                        {130, 8, true, false},       {130, 8, false, false, true},
                        {512, 8, false, false}};
  {
    Experts ex = MakeExperts(WeightDType::kF8E4M3Block128);
    for (const Case& c : cases) {
      Check(ex, WeightDType::kF8E4M3Block128, c, MoeDecodePath::kMma, "mma_forced");
    }
    // kAuto inside its mma range (65..512 tokens with top-8).
    for (const Case& c : {Case{65, 8, false, false}, Case{100, 8, true, true},
                          Case{128, 8, false, false}, Case{300, 8, false, false}}) {
      Check(ex, WeightDType::kF8E4M3Block128, c, MoeDecodePath::kAuto, "auto");
    }
    x_scale_spread_ = true;
    for (const Case& c : {Case{16, 8, false, false}, Case{64, 8, true, false}}) {
      Check(ex, WeightDType::kF8E4M3Block128, c, MoeDecodePath::kMma, "mma_forced_spread");
    }
    x_scale_spread_ = false;
  }
  Experts bf = MakeExperts(WeightDType::kBF16);
  Check(bf, WeightDType::kBF16, Case{16, 8, false, false}, MoeDecodePath::kMma, "mma_forced");
}

// The launch settings that change captured steps move MoeSettingsGeneration (the CUDA backend's
// scratch_epoch includes it: decode graphs are recaptured); setting a value it has does not.
TEST_F(CudaMoeTest, LaunchSettingsMoveTheGeneration) {
  const int64_t g0 = cuda::MoeSettingsGeneration();
  const int64_t epoch0 = gpu_->scratch_epoch();
  cuda::SetMoeDecodeBalancedGrid(true);  // already the default
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0);
  cuda::SetMoeDecodeBalancedGrid(false);
  EXPECT_FALSE(cuda::MoeDecodeBalancedGrid());
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 1);
  EXPECT_NE(gpu_->scratch_epoch(), epoch0);
  cuda::SetMoeDecodeBalancedGrid(true);
  const int pairs = cuda::MoeMmaAutoMaxPairs();
  cuda::SetMoeMmaAutoMaxPairs(pairs == 1024 ? 2048 : 1024);
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 3);
  cuda::SetMoeMmaAutoMaxPairs(pairs);
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 4);
  cuda::SetMoeRouteFuseMaxTokens(0);
  EXPECT_EQ(cuda::MoeRouteFuseMaxTokens(), 0);
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 5);
  cuda::SetMoeRouteFuseMaxTokens(cuda::kMoeRouteFuseMaxTokens);
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 6);
  cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeDecodeMaxPairs);
  EXPECT_EQ(cuda::MoeOneLaunchMaxTokens(), cuda::kMoeDecodeMaxPairs);
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 7);
  cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeOneLaunchMaxTokens);
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 8);
  EXPECT_TRUE(cuda::MoeDecodeAsyncCopies());  // the default
  cuda::SetMoeDecodeAsyncCopies(false);
  EXPECT_FALSE(cuda::MoeDecodeAsyncCopies());
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 9);
  cuda::SetMoeDecodeAsyncCopies(true);
  EXPECT_EQ(cuda::MoeSettingsGeneration(), g0 + 10);
}

// MoeRouteExperts: at <= cuda::MoeRouteFuseMaxTokens() tokens (and at most 64 pairs) the gate|up
// decode kernel routes for itself; it must give the ids, weights and out of the separate
// MoeRoute launch bit for bit (the same RouteRowWarp arithmetic), and match the CPU backend's
// default MoeRouteExperts (ids equal, weights within 1e-6, out within 1e-4 relative). Cases: 1 /
// 2 / 3 / 4 tokens, each run with the fuse limit at 3 (4: past it) and at 0, top-8 and top-1, with
// and without bias, with and without the shared expert appended (63 routed experts + expert 63 as
// the shared one), a group-limited routing (n_group 4, topk_group 2: never fused), fp32 / bf16 /
// fp8 experts, and a graph capture of the fused call replaying to the eager result.
TEST_F(CudaMoeTest, RouteExpertsFusedEqualsSeparateRoute) {
  struct RCase {
    int tokens, top_k;
    bool bias, appended;
    int n_group = 1, topk_group = 1;
  };
  const RCase cases[] = {{1, 8, true, true},  {1, 8, false, false}, {2, 8, true, true},
                         {2, 1, true, false}, {3, 8, true, true},   {1, 8, true, false, 4, 2},
                         {1, 1, false, true}, {4, 8, true, true}};
  constexpr int kFuseLimit = 3;
  ASSERT_EQ(cuda::MoeRouteFuseMaxTokens(), cuda::kMoeRouteFuseMaxTokens);
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kF8E4M3Block128}) {
    Experts ex = MakeExperts(dtype);
    for (const RCase& c : cases) {
      const int routed = c.appended ? kExperts - 1 : kExperts;
      const int k = c.top_k + (c.appended ? 1 : 0);
      // bf16 experts run the token-group kernels at decode sizes (kAuto), which never fuse.
      const bool decode = dtype != WeightDType::kBF16;
      const bool want_fused = decode && c.tokens <= kFuseLimit && c.n_group == 1;
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
      auto run = [&](int fuse_max) {
        cuda::SetMoeRouteFuseMaxTokens(fuse_max);
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
      const Result fused = run(kFuseLimit);
      ASSERT_EQ(cuda::LastMoeRouteFused(), want_fused);
      ASSERT_FALSE(cuda::LastMoeOneLaunch());
      const Result separate = run(0);
      ASSERT_FALSE(cuda::LastMoeRouteFused());
      // The same (fused) routing with gate|up, down and the combine in one launch.
      cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeDecodeMaxPairs);
      const Result one = run(kFuseLimit);
      ASSERT_EQ(cuda::LastMoeOneLaunch(), decode);
      ASSERT_EQ(cuda::LastMoeRouteFused(), want_fused);
      cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeOneLaunchMaxTokens);
      cuda::SetMoeRouteFuseMaxTokens(cuda::kMoeRouteFuseMaxTokens);
      ASSERT_EQ(fused.ids, separate.ids);
      ASSERT_EQ(std::memcmp(fused.w.data(), separate.w.data(), fused.w.size() * 4), 0);
      ASSERT_EQ(std::memcmp(fused.out.data(), separate.out.data(), fused.out.size() * 4), 0);
      ASSERT_EQ(fused.ids, one.ids);
      ASSERT_EQ(std::memcmp(fused.w.data(), one.w.data(), fused.w.size() * 4), 0);
      ASSERT_EQ(std::memcmp(fused.out.data(), one.out.data(), fused.out.size() * 4), 0)
          << "the one-launch decode kernel differs from three launches";

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

      if (want_fused && gpu_->SupportsGraphs()) {
        cuda::SetMoeRouteFuseMaxTokens(kFuseLimit);
        gpu_->SetPointerChecks(false);  // as the decode graphs run
        gpu_->BeginCapture();
        gpu_->MoeRouteExperts(lv, r, xv, ex.Device(), ov);
        std::unique_ptr<BackendGraph> graph = gpu_->EndCapture();
        gpu_->SetPointerChecks(true);
        ASSERT_NE(graph, nullptr) << gpu_->status();
        ASSERT_TRUE(cuda::LastMoeRouteFused());
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
// kernels at 1 / 8 tokens, the token-group listed kernels at 9 / 16 / 64 (device token
// lists), the fp8 tensor-core kernels at 65 / 100 (520 / 800 pairs), the tiled GEMM at 513
// (4104 pairs, past kMoeListedMaxPairs); and the one-launch decode kernel at 1 / 8 tokens.
TEST_F(CudaMoeTest, GraphReplayEqualsEager) {
  if (!gpu_->SupportsGraphs()) GTEST_SKIP() << "backend without graphs";
  Experts ex = MakeExperts(WeightDType::kF8E4M3Block128);
  // One launch (decode sizes): a replay equals eager, and a second replay the first (the
  // counters are zero again after each launch).
  for (int tokens : {1, 8, 9, 16, 64, 65, 100, 513, -1, -8}) {
    const bool one_launch = tokens < 0;
    tokens = std::abs(tokens);
    cuda::SetMoeOneLaunchMaxTokens(one_launch ? cuda::kMoeDecodeMaxPairs : 0);
    SCOPED_TRACE(absl::StrCat("tokens=", tokens, one_launch ? " one launch" : ""));
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
    ASSERT_EQ(cuda::LastMoeRanPath(), ExpectedPath(MoeDecodePath::kAuto, int64_t{tokens} * top_k,
                                                   WeightDType::kF8E4M3Block128));
    ASSERT_EQ(cuda::LastMoeOneLaunch(), one_launch);
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
  cuda::SetMoeOneLaunchMaxTokens(cuda::kMoeOneLaunchMaxTokens);
}

}  // namespace
}  // namespace glm::engine
