// The golden fixtures (tests/golden) through the cuda backend with narrow Linear weights
// (EngineOptions::weight_dtype): "bf16" on every fixture, "auto" on fp8 checkpoints (e4m3 + block
// scales kept). Prompt logits within 2e-2 of max |logit| of transformers' fp32 logits; greedy ids
// identical to the reference. Where a greedy sequence diverges, the test prints the margin at the
// divergence (our logit of our token minus our logit of the reference token, relative to
// max |logit|) and accepts it only as a near tie (margin within the same 2e-2), comparing the
// tokens up to it; anything else fails, except the documented kKnown cases (printed as KNOWN,
// held to their own bounds). Also: weight bytes per dtype, and the cpu backend refusing narrow
// weights (runs without a GPU). GPU cases skip, printing why, without a GPU.
// Env GLM_GOLDEN_DIR overrides the fixtures' build-time path.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/backend/create_backend.h"
#include "engine/engine.h"
#include "engine/model/glm_moe_dsa.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;

constexpr double kTol = 2e-2;  // relative to max |logit| (issue 4: bf16 tolerance)

// Cases beyond kTol measured on an H200 (tools/gpu/run_narrow_gpu.sh) that a CPU emulation of the
// same numerics reproduces (fp32 CPU backend with x and W rounded to bf16 on every bf16 Linear;
// for fp8, x rounded to bf16 and quantized per 128 columns to e4m3 exactly as
// kernels/quant_fp8_group does): the GPU paths match that emulation (cuda_narrow_test, ~1e-6),
// and these differences from the fp32 reference are properties of bf16 / e4m3 arithmetic on the
// tiny random fixtures: DSA top-4 selection (tiny-sparse) and MoE top-k routing flip under the
// rounding, and per-token e4m3 activations move tiny-fp8's logits by ~0.7 of max |logit| (the
// emulation: 0.688). They are printed as KNOWN instead of failing kTol, but stay bounded: the
// relative difference (logits) or divergence margin (greedy) must stay under `bound` (about 1.3x
// what was measured), and a greedy divergence may not come earlier than `first_token`, so a
// regression in these cases still fails. Every other case must meet kTol.
// what: -1 = prompt logits, else the greedy case index.
struct Known {
  const char* fixture;
  const char* dtype;
  int what;
  double bound;
  int first_token;  // greedy only: earliest token index a divergence may appear at
  const char* measured;
};
constexpr Known kKnown[] = {
    {"tiny-sparse", "bf16", -1, 0.42, 0, "0.324 (CPU emulation 0.3225)"},
    {"tiny-sparse", "bf16", 0, 0.09, 15, "diverges at token 15, margin 0.064 (emulation: at 18)"},
    {"tiny-sparse", "bf16", 1, 0.83, 15, "diverges at token 15, margin 0.636"},
    {"tiny-moe", "bf16", -1, 0.027, 0, "0.0201 (CPU emulation 0.0177)"},
    {"tiny-moe", "bf16", 2, 0.21, 7,
     "diverges at token 7 (80 vs 184), margin 0.16; emulation: the same"},
    {"tiny-mtp", "bf16", 2, 0.14, 18,
     "diverges at token 18 (174 vs 122), margin 0.105; emulation: same"},
    {"tiny-fp8", "auto", -1, 0.88, 0, "0.676 (CPU emulation of e4m3 activations 0.688)"},
    {"tiny-fp8", "auto", 1, 0.032, 5, "diverges at token 5, margin 0.024 (emulation: at 5)"},
    {"tiny-fp8", "auto", 2, 0.73, 20, "diverges at token 20, margin 0.556 (emulation: at 18)"},
};

const Known* FindKnown(const std::string& fixture, const std::string& dtype, int what) {
  for (const Known& k : kKnown) {
    if (fixture == k.fixture && dtype == k.dtype && what == k.what) return &k;
  }
  return nullptr;
}

struct Case {
  std::vector<int32_t> prompt, greedy;
};
struct Fixture {
  std::string name, dir;
  std::vector<Case> cases;  // main first
  bool fp8 = false;         // config.json has an fp8 quantization_config
};

std::string GoldenDir() {
  const char* env = std::getenv("GLM_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : GLM_GOLDEN_DIR;
}

std::vector<Fixture> LoadFixtures() {
  std::vector<Fixture> out;
  for (const auto& entry : fs::directory_iterator(GoldenDir())) {
    const fs::path ref = entry.path() / "reference.json";
    if (!entry.is_directory() || !fs::exists(ref) || !fs::exists(entry.path() / "config.json")) {
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(std::ifstream(ref));
    if (!j.contains("prompt_ids") || !j.contains("greedy_ids")) continue;
    Fixture fx;
    fx.name = entry.path().filename().string();
    fx.dir = entry.path().string();
    fx.cases.push_back({j["prompt_ids"].get<std::vector<int32_t>>(),
                        j["greedy_ids"].get<std::vector<int32_t>>()});
    if (j.contains("extra_cases")) {
      for (const auto& c : j["extra_cases"]) {
        fx.cases.push_back({c["prompt_ids"].get<std::vector<int32_t>>(),
                            c["greedy_ids"].get<std::vector<int32_t>>()});
      }
    }
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(entry.path() / "config.json"));
    fx.fp8 = cfg.contains("quantization_config") &&
             cfg["quantization_config"].value("quant_method", "") == "fp8";
    out.push_back(std::move(fx));
  }
  std::sort(out.begin(), out.end(),
            [](const Fixture& a, const Fixture& b) { return a.name < b.name; });
  return out;
}

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

double MaxAbs(const float* v, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(v[i])));
  return m;
}

Request GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  Request r;
  r.prompt_ids = prompt;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

EngineOptions Options(const std::string& dir, const std::string& dtype) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.backend = "cuda";
  eo.weight_dtype = dtype;
  eo.kv_block_size = 4;
  eo.kv_num_blocks = 256;
  eo.max_num_batched_tokens = 7;  // chunked prefill, as engine_golden_test
  eo.max_num_seqs = 4;
  return eo;
}

// The logits our engine gives for the last position of `prompt` (prompt logits, last row).
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

// Param: (fixture name, weight dtype).
class NarrowGoldenTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    const absl::Status avail = CudaBackendAvailable();
    if (!avail.ok()) GTEST_SKIP() << "backend cuda: " << avail.message();
    for (auto& fx : LoadFixtures()) {
      if (fx.name == std::get<0>(GetParam())) fixture_ = std::move(fx);
    }
    ASSERT_FALSE(fixture_.name.empty()) << "fixture " << std::get<0>(GetParam()) << " not found";
    dtype_ = std::get<1>(GetParam());
    if (dtype_ == "auto" && !fixture_.fp8) {
      GTEST_SKIP() << fixture_.name << " is not an fp8 checkpoint (auto == bf16 there)";
    }
  }
  Fixture fixture_;
  std::string dtype_;
};

TEST_P(NarrowGoldenTest, PromptLogitsAndGreedyMatchReference) {
  auto engine = Engine::Create(Options(fixture_.dir, dtype_));
  ASSERT_TRUE(engine.ok()) << engine.status();
  // Prompt logits.
  {
    Request r = GreedyRequest(fixture_.cases[0].prompt, 1);
    r.return_prompt_logits = true;
    auto h = (*engine)->Submit(r);
    ASSERT_TRUE(h.ok()) << h.status();
    TokenEvent ev;
    ASSERT_TRUE(h->stream->Next(&ev));
    h->stream->CollectTokens();
    const auto ref = ReadF32(fixture_.dir + "/logits.f32");
    ASSERT_EQ(ev.prompt_logits.size(), ref.size());
    double max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(double(ev.prompt_logits[i]) - ref[i]));
    }
    const double rel = max_diff / std::max(MaxAbs(ref.data(), ref.size()), 1e-30);
    std::printf("%s [cuda %s] prompt logits rel diff %.3g\n", fixture_.name.c_str(),
                dtype_.c_str(), rel);
    if (const Known* k = FindKnown(fixture_.name, dtype_, -1); k != nullptr && rel >= kTol) {
      std::printf("KNOWN beyond %.3g: %s\n", kTol, k->measured);
      EXPECT_LT(rel, k->bound) << fixture_.name << " " << dtype_ << ": known case got worse";
    } else {
      EXPECT_LT(rel, kTol) << fixture_.name << " " << dtype_;
    }
  }
  // Greedy, all cases concurrently.
  std::vector<RequestHandle> hs;
  for (const Case& c : fixture_.cases) {
    auto h = (*engine)->Submit(GreedyRequest(c.prompt, static_cast<int>(c.greedy.size())));
    ASSERT_TRUE(h.ok()) << h.status();
    hs.push_back(*h);
  }
  for (size_t i = 0; i < hs.size(); ++i) {
    const std::vector<int32_t> got = hs[i].stream->CollectTokens();
    const std::vector<int32_t>& want = fixture_.cases[i].greedy;
    ASSERT_EQ(got.size(), want.size()) << fixture_.name << " case " << i;
    size_t d = 0;
    while (d < got.size() && got[d] == want[d]) ++d;
    if (d == got.size()) {
      std::printf("%s [cuda %s] case %zu greedy: %zu/%zu identical\n", fixture_.name.c_str(),
                  dtype_.c_str(), i, d, want.size());
      continue;
    }
    // Divergence at d: our logits there, margin between our token and the reference's.
    std::vector<int32_t> prefix = fixture_.cases[i].prompt;
    prefix.insert(prefix.end(), got.begin(), got.begin() + d);
    const int v = static_cast<int>(ReadF32(fixture_.dir + "/logits.f32").size() /
                                   fixture_.cases[0].prompt.size());
    const std::vector<float> l = LastLogits(**engine, prefix, v);
    ASSERT_EQ(l.size(), static_cast<size_t>(v));
    const double margin = double(l[got[d]]) - l[want[d]];
    const double rel = margin / std::max(MaxAbs(l.data(), l.size()), 1e-30);
    std::printf("%s [cuda %s] case %zu greedy DIVERGES at token %zu of %zu: ours %d, reference %d;"
                " margin %.4g (%.3g of max |logit|); identical up to there\n",
                fixture_.name.c_str(), dtype_.c_str(), i, d, want.size(), got[d], want[d],
                margin, rel);
    if (const Known* k = FindKnown(fixture_.name, dtype_, static_cast<int>(i));
        k != nullptr && rel >= kTol) {
      std::printf("KNOWN beyond %.3g: %s\n", kTol, k->measured);
      EXPECT_LT(rel, k->bound) << fixture_.name << " " << dtype_ << " case " << i
                               << ": known divergence got worse";
      EXPECT_GE(static_cast<int>(d), k->first_token)
          << fixture_.name << " " << dtype_ << " case " << i << ": diverges earlier than known";
      continue;
    }
    EXPECT_LT(rel, kTol) << fixture_.name << " " << dtype_ << " case " << i
                         << ": divergence at token " << d << " is not a near tie";
  }
  ASSERT_TRUE((*engine)->Drain().ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NarrowGoldenTest,
                         ::testing::Combine(::testing::ValuesIn([] {
                                              std::vector<std::string> names;
                                              for (auto& fx : LoadFixtures()) {
                                                names.push_back(fx.name);
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

TEST(NarrowWeightsLoadTest, CpuBackendRefusesNarrowWeightsNamingTheFix) {
  const std::string dir = GoldenDir() + "/tiny-dense";
  for (const char* dtype : {"bf16", "auto"}) {
    auto m = LoadGlmMoeDsa(LoadOptions(dir, "cpu", dtype));
    ASSERT_FALSE(m.ok()) << dtype;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("--dtype fp32"), std::string::npos) << m.status();
    EXPECT_NE(m.status().message().find("cuda"), std::string::npos) << m.status();
  }
  auto bad = LoadGlmMoeDsa(LoadOptions(dir, "cpu", "fp16"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp32, bf16, auto"), std::string::npos) << bad.status();
  auto ok = LoadGlmMoeDsa(LoadOptions(dir, "cpu", "fp32"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto mem = WeightMemoryOf(**ok);
  ASSERT_TRUE(mem.has_value());
  EXPECT_EQ(mem->linear_bytes, mem->linear_fp32_bytes);
  EXPECT_EQ(mem->num_linear_bf16 + mem->num_linear_fp8, 0);
}

// Weight bytes per dtype: bf16 halves the Linear weights, fp8 keeps a quarter (+ scales).
TEST(NarrowWeightsLoadTest, WeightBytesPerDtype) {
  const absl::Status avail = CudaBackendAvailable();
  if (!avail.ok()) GTEST_SKIP() << "backend cuda: " << avail.message();
  for (const Fixture& fx : LoadFixtures()) {
    ModelWeightMemory mem[3];
    const char* dtypes[3] = {"fp32", "bf16", "auto"};
    for (int i = 0; i < 3; ++i) {
      auto m = LoadGlmMoeDsa(LoadOptions(fx.dir, "cuda", dtypes[i]));
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
