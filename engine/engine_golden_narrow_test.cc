// The golden fixtures (tests/golden) with narrow Linear weights (EngineOptions::weight_dtype):
// "bf16" on every fixture, "auto" on fp8 checkpoints (e4m3 + 128x128 block scales kept). Both
// backends implement the same narrow numerics (backend.h Linear / MoeExperts: x rounded to bf16,
// for fp8 weights also quantized per row per 128 columns to e4m3; fp32 accumulation; MoE experts
// widened, x fp32), the cpu backend in engine/backend/cpu/cpu_narrow.h. Two comparisons:
//
// 1. CpuNarrowMatchesTransformers (runs in CI, no GPU; ~0.1 s per fixture): the cpu backend with
//    narrow weights against transformers' fp32 golden (logits.f32: prompt logits
//    [num_prompt, vocab]; greedy ids of every case). It measures what narrow weights cost in
//    accuracy: prompt logits within kTol = 2e-2 of max |logit|; greedy ids identical, or diverging
//    only at a near tie (margin = our logit of our token minus our logit of the reference token,
//    relative to our max |logit|, below kTol; identical up to there). The cases beyond kTol
//    (kBeyondTol, with the figures this test measures) are properties of bf16 / e4m3 arithmetic
//    on the tiny random fixtures, not backend defects: DSA top-4 selection (tiny-sparse) and MoE
//    top-k routing flip under the rounding of x and W, and per-token e4m3 activations move
//    tiny-fp8's logits by 0.68 of max |logit|. The cuda backend showed the same figures before
//    this test compared it to the cpu backend (tiny-sparse 0.324, tiny-fp8 0.676, the same
//    divergences). Each is held to a bound ~1.3x its measured figure (and a greedy divergence may
//    not come earlier than measured), so a regression still fails.
// 2. CudaNarrowMatchesCpuNarrow (needs a GPU; skips printing why): the cuda backend with narrow
//    weights against the cpu backend with narrow weights, same fixture, dtype and requests, for
//    EVERY case (no exception list). The two compute the same function and differ only by the
//    order of fp32 summation (cuBLASLt / our kernels vs the cpu kernels). That order difference
//    is ~1e-7 of max |logit| by itself, but it moves an activation across a bf16 (or e4m3)
//    rounding boundary now and then, and one such flip moves the logits by up to a few 1e-3:
//    reversing the cpu's fp32 summation order in the narrow Linear alone (an experiment, not in
//    the tree) moved the prompt logits by 9e-8..2.7e-7 on 3 of the 8 fixture x dtype cases and by
//    8.7e-4..4.9e-3 (flips) on the other 5; summing in double instead: 6e-8..2.6e-7 on 5, flips
//    of 8.9e-4..3.7e-3 on 3; greedy ids identical in all 16 runs. So: prompt logits within
//    kCudaTol = 1e-2 of max |logit| (the flip level with 2x room; printed, so a flip-free case
//    shows its ~1e-7), and greedy ids identical, a divergence accepted only at a near tie on the
//    cpu logits (margin below kCudaTol), comparing the tokens up to it. Measured on an H200
//    (tools/gpu/run_all_gpu.sh STEPS=tests): cuda vs cpu prompt logits 1.2e-7..2.7e-7 on
//    tiny-chat, tiny-fp8 bf16 and auto, tiny-sparse (no flip); 2.0e-3 tiny-dense, 2.7e-3 tiny-mtp,
//    3.7e-3 tiny-sharded, 4.9e-3 tiny-moe (flips); greedy ids identical in 23 of 24 cases,
//    tiny-moe case 2 diverging at its last token (31) at a cpu margin of 1.1e-4. Op-level agreement of the
//    two backends is cuda_narrow_test's job (Linear / MoeExperts on identical inputs, 5e-5..1e-4).
// The INT4 / INT8 / NVFP4 fixtures (tiny-int4mix, tiny-nvfp4) are not run here: widening their
// dequantized weights to bf16 rounds them a second time, and their routers' top-k gaps (down to
// 6e-4 relative, make_quantized_golden.py's log) flip under it (measured: greedy divergences at
// margins 0.09-0.27, cuda vs cpu 0.55). Their served form is narrow: cuda_quant_test compares it
// with the cpu backend's exact dequantization, golden_model_test the cpu with transformers.
// Also: weight bytes per dtype on the cpu backend (bf16 halves the Linear weights, fp8 keeps a
// quarter plus scales), and the error naming the accepted dtypes.
// Env GLM_GOLDEN_DIR overrides the fixtures' build-time path.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "engine/backend/create_backend.h"
#include "engine/engine.h"
#include "engine/golden_fixtures_test_util.h"
#include "engine/model/glm_moe_dsa.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;
using golden::Case;
using golden::Fixture;
using golden::GreedyRequest;
using golden::LoadFixtures;
using golden::ReadF32;
using golden::RelDiff;

constexpr double kTol = 2e-2;  // cpu narrow vs transformers fp32, of max |logit|
// cuda narrow vs cpu narrow, of max |logit| (see the file comment).
constexpr double kCudaTol = 1e-2;

// The cpu narrow runs beyond (or within 1.5x of) kTol vs transformers (see the file comment), as
// this test measures them on the cpu backend; each bound replaces kTol for its case. what: -1 =
// prompt logits, else the greedy case index. The bf16 rows were re-measured when kv_b_proj
// became a narrow weight too (bf16 like the other Linears; it was fp32 in every mode before; the
// MLA products on it are weight-only, x fp32): tiny-sparse's divergences moved (case 0 from token
// 15 to 8; case 2 still at token 0, now at a margin of 0.204), tiny-moe case 1 now diverges at
// token 8. The fp8 ("auto") rows did not change: e4m3 weights widen to the values the fp32 load
// dequantized. Re-measured again when steps of <= 64 rows began computing the shared expert
// inside MoeExperts (x fp32 against the widened weights, where Linear rounds x to bf16 / e4m3;
// layers.h Moe): tiny-sparse case 1 now diverges at token 15 (was 19) and tiny-fp8 case 1 at
// the same token with a margin of 0.0215 (was 0.0102); the prompt logits moved by < 0.01
// (tiny-fp8 0.676 -> 0.668, tiny-sparse 0.334 -> 0.335), every other row as before.
struct BeyondTol {
  const char* fixture;
  const char* dtype;
  int what;
  double bound;     // relative difference (logits) or divergence margin (greedy) must stay below
  int first_token;  // greedy only: earliest token index a divergence may appear at
  const char* measured;
};
constexpr BeyondTol kBeyondTol[] = {
    {"tiny-sparse", "bf16", -1, 0.42, 0, "0.334 (DSA top-4 flips)"},
    {"tiny-sparse", "bf16", 0, 0.18, 8, "diverges at token 8 (72 vs 200), margin 0.138"},
    {"tiny-sparse", "bf16", 1, 0.82, 15, "diverges at token 15 (59 vs 214), margin 0.634"},
    {"tiny-sparse", "bf16", 2, 0.27, 0, "diverges at token 0 (214 vs 9), margin 0.204"},
    {"tiny-moe", "bf16", -1, 0.026, 0, "0.0181 (MoE routing flips)"},
    {"tiny-moe", "bf16", 1, 0.058, 8, "diverges at token 8 (186 vs 184), margin 0.0442"},
    {"tiny-moe", "bf16", 2, 0.21, 7, "diverges at token 7 (80 vs 184), margin 0.157"},
    {"tiny-mtp", "bf16", 2, 0.14, 18, "diverges at token 18 (174 vs 122), margin 0.107"},
    {"tiny-fp8", "auto", -1, 0.88, 0, "0.676 (e4m3 activations)"},
    {"tiny-fp8", "auto", 0, 0.021, 3, "diverges at token 3 (76 vs 230), margin 0.0160"},
    {"tiny-fp8", "auto", 1, 0.028, 5, "diverges at token 5 (78 vs 80), margin 0.0215"},
    {"tiny-fp8", "auto", 2, 0.70, 20, "diverges at token 20 (37 vs 90), margin 0.536"},
};

const BeyondTol* FindBeyondTol(const std::string& fixture, const std::string& dtype, int what) {
  for (const BeyondTol& k : kBeyondTol) {
    if (fixture == k.fixture && dtype == k.dtype && what == k.what) return &k;
  }
  return nullptr;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

EngineOptions Options(const std::string& dir, const std::string& backend,
                      const std::string& dtype) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.backend = backend;
  eo.weight_dtype = dtype;
  eo.kv_block_size = 4;
  eo.kv_num_blocks = 256;
  eo.max_num_batched_tokens = 7;  // chunked prefill, as engine_golden_test
  eo.max_num_seqs = 4;
  return eo;
}

// The logits the engine gives for the last position of `prompt`.
std::vector<float> LastLogits(Engine& engine, const std::vector<int32_t>& prompt, int vocab) {
  Request r = GreedyRequest(prompt, 1);
  r.return_prompt_logits = true;
  auto h = engine.Submit(r);
  if (!h.ok()) return {};
  TokenEvent ev;
  if (!h->stream->Next(&ev) || ev.prompt_logits.size() < static_cast<size_t>(vocab)) return {};
  h->stream->CollectTokens();
  return std::vector<float>(ev.prompt_logits.end() - vocab, ev.prompt_logits.end());
}

// One engine's answers on a fixture: prompt logits of the main case, greedy ids of every case
// (all submitted together).
struct EngineRun {
  std::vector<float> prompt_logits;  // [num_prompt, vocab]
  std::vector<std::vector<int32_t>> greedy;
};

void RunFixture(Engine& engine, const Fixture& fx, EngineRun* out) {
  Request r = GreedyRequest(fx.cases[0].prompt, 1);
  r.return_prompt_logits = true;
  auto h = engine.Submit(r);
  ASSERT_TRUE(h.ok()) << h.status();
  TokenEvent ev;
  ASSERT_TRUE(h->stream->Next(&ev));
  h->stream->CollectTokens();
  out->prompt_logits = ev.prompt_logits;
  std::vector<RequestHandle> hs;
  for (const Case& c : fx.cases) {
    auto hc = engine.Submit(GreedyRequest(c.prompt, static_cast<int>(c.greedy.size())));
    ASSERT_TRUE(hc.ok()) << hc.status();
    hs.push_back(*hc);
  }
  for (size_t i = 0; i < hs.size(); ++i) {
    out->greedy.push_back(hs[i].stream->CollectTokens());
    ASSERT_EQ(out->greedy.back().size(), fx.cases[i].greedy.size()) << fx.name << " case " << i;
  }
}

// Where `got` first differs from `want` (size if nowhere), and the margin there on `engine`'s
// logits after prompt + the common prefix: logit(got[d]) - logit(want[d]), relative to max |l|.
struct Divergence {
  size_t at = 0;
  double margin = 0;
};
Divergence FindDivergence(Engine& engine, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                          int vocab) {
  Divergence d;
  while (d.at < got.size() && got[d.at] == want[d.at]) ++d.at;
  if (d.at == got.size()) return d;
  std::vector<int32_t> prefix = prompt;
  prefix.insert(prefix.end(), got.begin(), got.begin() + d.at);
  const std::vector<float> l = LastLogits(engine, prefix, vocab);
  if (l.size() != static_cast<size_t>(vocab)) {
    d.margin = std::numeric_limits<double>::infinity();
    return d;
  }
  d.margin = (double(l[got[d.at]]) - l[want[d.at]]) / std::max(MaxAbs(l), 1e-30);
  return d;
}

// Param: (fixture name, weight dtype).
class NarrowGoldenTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    for (auto& fx : LoadFixtures()) {
      if (fx.name == std::get<0>(GetParam())) fixture_ = std::move(fx);
    }
    ASSERT_FALSE(fixture_.name.empty()) << "fixture " << std::get<0>(GetParam()) << " not found";
    dtype_ = std::get<1>(GetParam());
    if (dtype_ == "auto" && !fixture_.fp8) {
      GTEST_SKIP() << fixture_.name << " is not an fp8 checkpoint (auto == bf16 there)";
    }
    vocab_ = static_cast<int>(ReadF32(fixture_.dir + "/logits.f32").size() /
                              fixture_.cases[0].prompt.size());
  }
  const char* fx() const { return fixture_.name.c_str(); }
  Fixture fixture_;
  std::string dtype_;
  int vocab_ = 0;
};

TEST_P(NarrowGoldenTest, CpuNarrowMatchesTransformers) {
  auto engine = Engine::Create(Options(fixture_.dir, "cpu", dtype_));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EngineRun run;
  ASSERT_NO_FATAL_FAILURE(RunFixture(**engine, fixture_, &run));
  const std::vector<float> ref = ReadF32(fixture_.dir + "/logits.f32");
  ASSERT_EQ(run.prompt_logits.size(), ref.size());
  const double rel = RelDiff(run.prompt_logits, ref);
  std::printf("%s [cpu %s] prompt logits vs transformers fp32: rel diff %.4g\n", fx(),
              dtype_.c_str(), rel);
  if (const BeyondTol* k = FindBeyondTol(fixture_.name, dtype_, -1); k != nullptr) {
    std::printf("  listed fixture property (measured %s): held to %.3g instead of %.3g\n",
                k->measured, k->bound, kTol);
    EXPECT_LT(rel, k->bound) << fx() << " " << dtype_ << ": got worse than measured";
  } else {
    EXPECT_LT(rel, kTol) << fx() << " " << dtype_;
  }
  for (size_t i = 0; i < fixture_.cases.size(); ++i) {
    const Case& c = fixture_.cases[i];
    const Divergence d = FindDivergence(**engine, c.prompt, run.greedy[i], c.greedy, vocab_);
    if (d.at == c.greedy.size()) {
      std::printf("%s [cpu %s] case %zu greedy: %zu/%zu identical to transformers\n", fx(),
                  dtype_.c_str(), i, d.at, c.greedy.size());
      continue;
    }
    std::printf("%s [cpu %s] case %zu greedy DIVERGES from transformers at token %zu of %zu: "
                "ours %d, reference %d; margin %.4g of max |logit|; identical up to there\n",
                fx(), dtype_.c_str(), i, d.at, c.greedy.size(), run.greedy[i][d.at],
                c.greedy[d.at], d.margin);
    if (const BeyondTol* k = FindBeyondTol(fixture_.name, dtype_, static_cast<int>(i));
        k != nullptr) {
      std::printf("  listed fixture property (measured %s): margin held to %.3g, from token %d\n",
                  k->measured, k->bound, k->first_token);
      EXPECT_LT(d.margin, k->bound) << fx() << " " << dtype_ << " case " << i;
      EXPECT_GE(static_cast<int>(d.at), k->first_token)
          << fx() << " " << dtype_ << " case " << i << ": diverges earlier than measured";
      continue;
    }
    EXPECT_LT(d.margin, kTol) << fx() << " " << dtype_ << " case " << i << ": divergence at "
                              << d.at << " is not a near tie";
  }
  ASSERT_TRUE((*engine)->Drain().ok());
}

TEST_P(NarrowGoldenTest, CudaNarrowMatchesCpuNarrow) {
  const absl::Status avail = CudaBackendAvailable();
  if (!avail.ok()) GTEST_SKIP() << "backend cuda: " << avail.message();
  auto cpu = Engine::Create(Options(fixture_.dir, "cpu", dtype_));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Engine::Create(Options(fixture_.dir, "cuda", dtype_));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EngineRun c, g;
  ASSERT_NO_FATAL_FAILURE(RunFixture(**cpu, fixture_, &c));
  ASSERT_NO_FATAL_FAILURE(RunFixture(**gpu, fixture_, &g));
  ASSERT_EQ(g.prompt_logits.size(), c.prompt_logits.size());
  const double rel = RelDiff(g.prompt_logits, c.prompt_logits);
  std::printf("%s [%s] prompt logits cuda vs cpu: rel diff %.3g of max |logit| %.4g\n", fx(),
              dtype_.c_str(), rel, MaxAbs(c.prompt_logits));
  EXPECT_LE(rel, kCudaTol) << fx() << " " << dtype_;
  for (size_t i = 0; i < fixture_.cases.size(); ++i) {
    const Divergence d =
        FindDivergence(**cpu, fixture_.cases[i].prompt, c.greedy[i], g.greedy[i], vocab_);
    if (d.at == c.greedy[i].size()) {
      std::printf("%s [%s] case %zu greedy cuda vs cpu: %zu/%zu identical\n", fx(),
                  dtype_.c_str(), i, d.at, c.greedy[i].size());
      continue;
    }
    std::printf("%s [%s] case %zu greedy cuda vs cpu DIVERGES at token %zu of %zu: cpu %d, cuda "
                "%d; cpu margin %.3g of max |logit|; identical up to there\n",
                fx(), dtype_.c_str(), i, d.at, c.greedy[i].size(), c.greedy[i][d.at],
                g.greedy[i][d.at], d.margin);
    EXPECT_LE(d.margin, kCudaTol) << fx() << " " << dtype_ << " case " << i
                                  << ": cuda and cpu differ at a token that is not a near tie";
  }
  ASSERT_TRUE((*cpu)->Drain().ok());
  ASSERT_TRUE((*gpu)->Drain().ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NarrowGoldenTest,
                         ::testing::Combine(::testing::ValuesIn([] {
                                              std::vector<std::string> names;
                                              for (auto& fx : LoadFixtures()) {
                                                if (!fx.quantized) names.push_back(fx.name);
                                              }
                                              return names;
                                            }()),
                                            ::testing::Values("bf16", "auto")),
                         [](const auto& p) {
                           std::string n = std::get<0>(p.param) + "_" + std::get<1>(p.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

ModelLoadOptions LoadOptions(const std::string& dir, const std::string& backend,
                             const std::string& dtype) {
  ModelLoadOptions lo;
  lo.model_dir = dir;
  lo.kv.block_size = 4;
  lo.kv.num_blocks = 16;
  lo.num_threads = 1;
  lo.backend = backend;
  lo.weight_dtype = dtype;
  return lo;
}

TEST(NarrowWeightsLoadTest, UnknownDtypeNamesTheAcceptedOnes) {
  auto bad = LoadGlmMoeDsa(LoadOptions(golden::Dir() + "/tiny-dense", "cpu", "fp16"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("fp32, bf16, auto"), std::string::npos) << bad.status();
}

// Weight bytes per dtype on the cpu backend (the narrow bytes stay narrow in host memory): bf16
// halves the Linear weights, fp8 keeps a quarter (+ scales).
TEST(NarrowWeightsLoadTest, CpuWeightBytesPerDtype) {
  for (const Fixture& fx : LoadFixtures()) {
    ModelWeightMemory mem[3];
    const char* dtypes[3] = {"fp32", "bf16", "auto"};
    for (int i = 0; i < 3; ++i) {
      auto m = LoadGlmMoeDsa(LoadOptions(fx.dir, "cpu", dtypes[i]));
      ASSERT_TRUE(m.ok()) << fx.name << " " << dtypes[i] << ": " << m.status();
      auto w = WeightMemoryOf(**m);
      ASSERT_TRUE(w.has_value());
      mem[i] = *w;
      std::printf("%s weights %-4s: total %lld bytes, Linear %lld bytes (fp32 %lld; %lld fp32 / "
                  "%lld bf16 / %lld fp8 tensors; fp8 payload %lld + scales %lld)\n",
                  fx.name.c_str(), dtypes[i], static_cast<long long>(w->total_bytes),
                  static_cast<long long>(w->linear_bytes),
                  static_cast<long long>(w->linear_fp32_bytes),
                  static_cast<long long>(w->num_linear_f32),
                  static_cast<long long>(w->num_linear_bf16),
                  static_cast<long long>(w->num_linear_fp8),
                  static_cast<long long>(w->fp8_payload_bytes),
                  static_cast<long long>(w->fp8_scale_bytes));
    }
    EXPECT_EQ(mem[0].linear_bytes, mem[0].linear_fp32_bytes) << fx.name;
    EXPECT_EQ(mem[0].num_linear_bf16 + mem[0].num_linear_fp8, 0) << fx.name;
    EXPECT_EQ(mem[1].linear_fp32_bytes, mem[0].linear_fp32_bytes) << fx.name;
    // Row strides are padded to 8 bf16 elements; the fixtures' widths are multiples of 8.
    EXPECT_EQ(mem[1].linear_bytes * 2, mem[0].linear_bytes) << fx.name;
    EXPECT_EQ(mem[1].num_linear_f32 + mem[1].num_linear_fp8, 0) << fx.name;
    EXPECT_LT(mem[1].total_bytes, mem[0].total_bytes) << fx.name;
    if (fx.fp8) {
      EXPECT_GT(mem[2].num_linear_fp8, 0) << fx.name;
      EXPECT_LT(mem[2].linear_bytes, mem[1].linear_bytes) << fx.name;
      // fp8 tensors: one byte per element, a quarter of fp32; the rest bf16 (half).
      const int64_t bf16_part = mem[2].linear_bytes - mem[2].fp8_payload_bytes -
                                mem[2].fp8_scale_bytes;
      EXPECT_EQ(mem[2].fp8_payload_bytes * 4 + bf16_part * 2, mem[0].linear_bytes) << fx.name;
    } else {
      EXPECT_EQ(mem[2].linear_bytes, mem[1].linear_bytes) << fx.name;
    }
  }
}

}  // namespace
}  // namespace glm::engine
