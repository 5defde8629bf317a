// The model against the transformers 5.17 reference (tests/golden/tiny-*/, see README.md there):
// prompt logits within 1e-4 relative (max |diff| / max |reference logit|), greedy continuations
// identical, and the same through chunked prefill and both MLA attention forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/glm_moe_dsa.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTolerance = 1e-4;   // vs the reference
constexpr double kSelfTolerance = 1e-5;    // between our own execution paths
constexpr size_t kMinGreedyTokens = 24;

fs::path GoldenDir() {
  if (const char* src = std::getenv("GLM_SOURCE_DIR"); src != nullptr && *src != '\0') {
    return fs::path(src) / "tests" / "golden";
  }
  return fs::path(GLM_GOLDEN_DIR);
}

// Every fixture directory with a model (config.json) and a reference.json.
std::vector<std::string> DiscoverFixtures() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(GoldenDir(), ec)) {
    if (entry.is_directory() && fs::exists(entry.path() / "reference.json") &&
        fs::exists(entry.path() / "config.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct Case {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

struct Reference {
  Case main;
  std::vector<Case> extra;
  std::vector<float> logits;  // [prompt, vocab]
  int64_t vocab = 0;
};

std::vector<int32_t> Ints(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

Reference LoadReference(const fs::path& dir) {
  Reference r;
  std::ifstream in(dir / "reference.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  r.main = {Ints(j.at("prompt_ids")), Ints(j.at("greedy_ids"))};
  if (j.contains("extra_cases")) {
    for (const auto& c : j.at("extra_cases")) {
      r.extra.push_back({Ints(c.at("prompt_ids")), Ints(c.at("greedy_ids"))});
    }
  }
  const auto shape = j.at("logits_shape").get<std::vector<int64_t>>();
  r.vocab = shape.at(1);
  std::ifstream lf(dir / j.at("logits_file").get<std::string>(), std::ios::binary);
  r.logits.resize(shape.at(0) * shape.at(1));
  lf.read(reinterpret_cast<char*>(r.logits.data()),
          static_cast<std::streamsize>(r.logits.size() * sizeof(float)));
  EXPECT_TRUE(lf.good()) << "short logits file in " << dir;
  return r;
}

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - want[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[i])));
  }
  return max_abs > 0 ? max_diff / max_abs : max_diff;
}

int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);  // first max, as torch
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = GoldenDir() / GetParam();
    ref_ = LoadReference(dir_);
  }

  std::unique_ptr<Model> Load(bool expanded_prefill = true) {
    ModelLoadOptions o;
    o.model_dir = dir_.string();
    o.kv = {4, 64};  // 256 positions; blocks of 4 so sequences span many blocks
    o.num_threads = 2;
    o.expanded_prefill = expanded_prefill;
    auto m = LoadGlmMoeDsa(o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(m).value() : nullptr;
  }

  // Prefill of `prompt` in chunks; logits of every position [n, vocab]. Blocks are taken in
  // reverse order from `first_block` down so the block table is not the identity.
  static std::vector<float> Prefill(Model& m, const std::vector<int32_t>& prompt, size_t chunk,
                                    std::vector<int32_t>* table) {
    std::vector<float> out;
    for (size_t start = 0; start < prompt.size(); start += chunk) {
      ForwardBatch b;
      SequenceSlice s;
      s.seq_id = 1;
      s.token_ids.assign(prompt.begin() + start,
                         prompt.begin() + std::min(prompt.size(), start + chunk));
      s.start_pos = static_cast<int32_t>(start);
      s.block_table = *table;
      s.all_logits = true;
      b.seqs.push_back(s);
      ForwardResult r;
      absl::Status st = m.Forward(b, &r);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return {};
      out.insert(out.end(), r.seqs[0].logits.begin(), r.seqs[0].logits.end());
    }
    return out;
  }

  static std::vector<int32_t> Blocks(int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(63 - 2 * i);
    return t;
  }

  // Greedy decoding through the paged cache: prefill, then one token per step.
  std::vector<int32_t> Greedy(Model& m, const Case& c) {
    const int64_t V = ref_.vocab;
    std::vector<int32_t> table = Blocks(static_cast<int>((c.prompt.size() + c.greedy.size()) / 4 + 1));
    std::vector<float> logits = Prefill(m, c.prompt, c.prompt.size(), &table);
    if (logits.empty()) return {};
    std::vector<int32_t> out = {Argmax(logits.data() + logits.size() - V, V)};
    int32_t pos = static_cast<int32_t>(c.prompt.size());
    while (out.size() < c.greedy.size()) {
      ForwardBatch b;
      b.seqs.push_back({1, {out.back()}, pos++, table, false, false});
      ForwardResult r;
      absl::Status st = m.Forward(b, &r);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) break;
      out.push_back(Argmax(r.seqs[0].logits.data(), V));
    }
    return out;
  }

  fs::path dir_;
  Reference ref_;
};

TEST_P(GoldenTest, PromptLogitsMatchReference) {
  auto m = Load();
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->config().vocab_size, ref_.vocab);
  std::vector<int32_t> table = Blocks(16);
  const auto logits = Prefill(*m, ref_.main.prompt, ref_.main.prompt.size(), &table);
  const double rel = MaxRelDiff(logits, ref_.logits);
  std::printf("[golden] %s prompt logits max rel err %.3g (%zu tokens)\n", GetParam().c_str(), rel,
              ref_.main.prompt.size());
  EXPECT_LT(rel, kLogitTolerance);
}

TEST_P(GoldenTest, GreedyContinuationMatchesReference) {
  auto m = Load();
  ASSERT_NE(m, nullptr);
  ASSERT_GE(ref_.main.greedy.size(), kMinGreedyTokens);
  EXPECT_EQ(Greedy(*m, ref_.main), ref_.main.greedy);
  for (size_t i = 0; i < ref_.extra.size(); ++i) {
    EXPECT_EQ(Greedy(*m, ref_.extra[i]), ref_.extra[i].greedy) << "extra case " << i;
  }
}

TEST_P(GoldenTest, ChunkedPrefillMatches) {
  auto m = Load();
  ASSERT_NE(m, nullptr);
  std::vector<int32_t> table = Blocks(16);
  const auto whole = Prefill(*m, ref_.main.prompt, ref_.main.prompt.size(), &table);
  for (size_t chunk : {5, 1}) {
    std::vector<int32_t> other = {1, 5, 3, 7, 9, 11, 13, 0, 2, 4, 6, 8, 10, 12, 14, 15};
    const auto chunked = Prefill(*m, ref_.main.prompt, chunk, &other);
    const double rel = MaxRelDiff(chunked, ref_.logits);
    std::printf("[golden] %s chunked prefill (chunk %zu) max rel err %.3g\n", GetParam().c_str(),
                chunk, rel);
    EXPECT_LT(rel, kLogitTolerance) << "chunk " << chunk;
    EXPECT_LT(MaxRelDiff(chunked, whole), kSelfTolerance) << "chunk " << chunk;
  }
}

TEST_P(GoldenTest, ExpandedAndAbsorbedAttentionAgree) {
  auto expanded = Load(true);
  auto absorbed = Load(false);
  ASSERT_NE(expanded, nullptr);
  ASSERT_NE(absorbed, nullptr);
  std::vector<int32_t> table = Blocks(16);
  const auto a = Prefill(*expanded, ref_.main.prompt, ref_.main.prompt.size(), &table);
  const auto b = Prefill(*absorbed, ref_.main.prompt, ref_.main.prompt.size(), &table);
  const double rel_ab = MaxRelDiff(b, a), rel_ref = MaxRelDiff(b, ref_.logits);
  std::printf("[golden] %s absorbed vs expanded %.3g, absorbed vs reference %.3g\n",
              GetParam().c_str(), rel_ab, rel_ref);
  EXPECT_LT(rel_ab, kSelfTolerance);
  EXPECT_LT(rel_ref, kLogitTolerance);
}

// Two pipeline stages, split after the first layer and at the first IndexShare "shared" layer
// (so the top-k crosses the stage boundary): prompt logits still match the reference.
TEST_P(GoldenTest, PipelineStagesMatchReference) {
  auto probe = Load();
  ASSERT_NE(probe, nullptr);
  const ModelConfig& c = probe->config();
  std::vector<int> splits = {1};
  for (int l = 1; l < c.num_hidden_layers; ++l) {
    if (!c.HasIndexer(l)) {
      splits.push_back(l);
      break;
    }
  }
  for (int split : splits) {
    if (split >= c.num_hidden_layers) continue;
    ModelLoadOptions o;
    o.model_dir = dir_.string();
    o.kv = {4, 64};
    o.num_threads = 2;
    o.last_layer = split - 1;
    auto s0 = LoadGlmMoeDsa(o);
    o.first_layer = split;
    o.last_layer = -1;
    auto s1 = LoadGlmMoeDsa(o);
    ASSERT_TRUE(s0.ok()) << s0.status();
    ASSERT_TRUE(s1.ok()) << s1.status();
    ForwardBatch b;
    b.seqs.push_back({1, ref_.main.prompt, 0, Blocks(16), true, false});
    ForwardResult r0, r1;
    ASSERT_TRUE((*s0)->Forward(b, &r0).ok());
    b.seqs[0].input_residual = r0.seqs[0].residual;
    b.seqs[0].input_topk = r0.seqs[0].topk;
    absl::Status st = (*s1)->Forward(b, &r1);
    ASSERT_TRUE(st.ok()) << st;
    const double rel = MaxRelDiff(r1.seqs[0].logits, ref_.logits);
    std::printf("[golden] %s pipeline split at layer %d (%s) max rel err %.3g\n",
                GetParam().c_str(), split, c.HasIndexer(split) ? "full" : "shared", rel);
    EXPECT_LT(rel, kLogitTolerance) << "split at " << split;
  }
}

TEST_P(GoldenTest, MtpDraftRunsWhenPresent) {
  auto m = Load();
  ASSERT_NE(m, nullptr);
  if (m->config().num_nextn_predict_layers == 0) GTEST_SKIP() << "fixture has no MTP layer";
  const auto& p = ref_.main.prompt;
  std::vector<int32_t> table = Blocks(16);
  ForwardBatch b;
  b.seqs.push_back({1, p, 0, table, true, true});
  ForwardResult main;
  ASSERT_TRUE(m->Forward(b, &main).ok());
  const int64_t H = m->config().hidden_size, n = static_cast<int64_t>(p.size()) - 1;
  ForwardBatch mb;
  mb.seqs.push_back({1, {p.begin() + 1, p.end()}, 0, table, true, false});
  std::vector<std::vector<float>> hidden = {
      std::vector<float>(main.seqs[0].hidden.begin(), main.seqs[0].hidden.begin() + n * H)};
  ForwardResult draft;
  absl::Status st = m->ForwardMtp(mb, hidden, &draft);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(draft.seqs[0].logits.size(), static_cast<size_t>(n * ref_.vocab));
  for (float x : draft.seqs[0].logits) ASSERT_TRUE(std::isfinite(x));
  // No reference for MTP (HF ignores the layer): the draft must at least differ from the main
  // model's next-token logits, proving the MTP weights are used.
  EXPECT_GT(MaxRelDiff(draft.seqs[0].logits,
                       std::vector<float>(ref_.logits.begin() + ref_.vocab, ref_.logits.end())),
            1e-3);
}

TEST(GoldenFixtures, Present) {
  if (DiscoverFixtures().empty()) {
    GTEST_SKIP() << "no fixtures under " << GoldenDir()
                 << " (tiny-*/config.json + reference.json); see tests/golden/README.md";
  }
}

std::string FixtureName(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);
INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(DiscoverFixtures()),
                         FixtureName);

}  // namespace
}  // namespace glm::engine
