// Tensor parallelism inside the linear layers (tp.h) on the golden fixtures (tests/golden/tiny-*):
// TP = 2 and 4 ranks as threads of this process, each with its own model and a GlooCommunicator
// over loopback (InProcessRendezvous), against the unsharded model (TP = 1) and the transformers
// reference: prompt logits within 1e-4 relative, greedy continuations identical, and every rank's
// logits bit-identical (the all-reduce gives every rank the same sums). Fixtures: MoE layers
// (tiny-moe), IndexShare "shared" layers (tiny-sparse), the MTP layer (tiny-mtp), an fp8
// checkpoint read by slices (tiny-fp8) and a sharded checkpoint (tiny-sharded). Plus the load
// errors of bad TP options and a failing all-reduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/backend/backend.h"
#include "engine/dist/communicator.h"
#include "engine/dist/testing/fake_communicator.h"
#include "engine/golden_fixtures_test_util.h"
#include "engine/dist/gloo_communicator.h"
#include "engine/dist/in_process_rendezvous.h"
#include "engine/model/glm_moe_dsa.h"
#include "engine/model/random_weights.h"
#include "engine/model/weight_source.h"
#include "nlohmann/json.hpp"

namespace glm::engine {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTolerance = 1e-4;  // relative: max |diff| / max |reference|

fs::path GoldenDir() {
  if (const char* src = std::getenv("GLM_SOURCE_DIR"); src != nullptr && *src != '\0') {
    return fs::path(src) / "tests" / "golden";
  }
  return fs::path(GLM_GOLDEN_DIR);
}

struct Case {
  std::vector<int32_t> prompt, greedy;
};

struct Reference {
  std::vector<Case> cases;    // the main case first, then extra_cases
  std::vector<float> logits;  // [main prompt, vocab]
  int64_t vocab = 0;
};

Reference LoadReference(const fs::path& dir) {
  Reference r;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "reference.json"));
  r.cases.push_back({j.at("prompt_ids").get<std::vector<int32_t>>(),
                     j.at("greedy_ids").get<std::vector<int32_t>>()});
  if (j.contains("extra_cases")) {
    for (const auto& c : j.at("extra_cases")) {
      r.cases.push_back({c.at("prompt_ids").get<std::vector<int32_t>>(),
                         c.at("greedy_ids").get<std::vector<int32_t>>()});
    }
  }
  const auto shape = j.at("logits_shape").get<std::vector<int64_t>>();
  r.vocab = shape.at(1);
  r.logits = golden::ReadF32((dir / j.at("logits_file").get<std::string>()).string());
  EXPECT_EQ(r.logits.size(), static_cast<size_t>(shape.at(0) * shape.at(1)))
      << "logits file size in " << dir;
  return r;
}

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
  }
  return max_abs > 0 ? max_diff / max_abs : max_diff;
}

int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// What one rank (or the TP = 1 model) computed.
struct RunResult {
  absl::Status status;
  std::vector<float> prompt_logits;          // [main prompt, vocab]
  std::vector<std::vector<int32_t>> greedy;  // per case
  std::vector<float> mtp_logits;             // [main prompt - 1, vocab] when the model has MTP
};

std::vector<int32_t> Blocks(int n) {  // odd ids from 63 down: not the identity
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(63 - 2 * i);
  return t;
}

// Prompt logits of the main case (and, with MTP, the MTP layer's logits over the prompt), then
// the greedy continuation of the first `num_cases` cases: a prefill and one decode step per token.
absl::Status RunModel(Model& m, const Reference& ref, bool mtp, size_t num_cases,
                      RunResult* out) {
  const int64_t V = ref.vocab;
  const std::vector<int32_t> table = Blocks(32);  // 128 positions
  const Case& main = ref.cases.front();
  {
    ForwardBatch b;
    SequenceSlice s;
    s.seq_id = 100;
    s.token_ids = main.prompt;
    s.block_table = table;
    s.all_logits = true;
    s.want_hidden = mtp;
    b.seqs.push_back(s);
    ForwardResult r;
    GLM_RETURN_IF_ERROR(m.Forward(b, &r));
    out->prompt_logits = r.seqs[0].logits;
    if (mtp) {
      // MTP over the prompt: hidden rows t = 0 .. n-2 with tokens t + 1.
      const int64_t n = static_cast<int64_t>(main.prompt.size()) - 1;
      const int64_t H = m.config().hidden_size;
      ForwardBatch mb;
      SequenceSlice ms;
      ms.seq_id = 100;
      ms.token_ids.assign(main.prompt.begin() + 1, main.prompt.end());
      ms.block_table = table;
      ms.all_logits = true;
      mb.seqs.push_back(ms);
      std::vector<std::vector<float>> hidden = {
          std::vector<float>(r.seqs[0].hidden.begin(), r.seqs[0].hidden.begin() + n * H)};
      ForwardResult mr;
      GLM_RETURN_IF_ERROR(m.ForwardMtp(mb, hidden, &mr));
      out->mtp_logits = mr.seqs[0].logits;
    }
    m.ReleaseSequence(100);
  }
  for (size_t ci = 0; ci < num_cases; ++ci) {
    const Case& c = ref.cases[ci];
    const int64_t seq = static_cast<int64_t>(ci) + 1;
    ForwardBatch b;
    SequenceSlice s;
    s.seq_id = seq;
    s.token_ids = c.prompt;
    s.block_table = table;
    b.seqs.push_back(s);
    ForwardResult r;
    GLM_RETURN_IF_ERROR(m.Forward(b, &r));
    std::vector<int32_t> tokens = {Argmax(r.seqs[0].logits.data(), V)};
    int32_t pos = static_cast<int32_t>(c.prompt.size());
    while (tokens.size() < c.greedy.size()) {
      ForwardBatch d;
      SequenceSlice ds;
      ds.seq_id = seq;
      ds.token_ids = {tokens.back()};
      ds.start_pos = pos++;
      ds.block_table = table;
      d.seqs.push_back(ds);
      ForwardResult dr;
      GLM_RETURN_IF_ERROR(m.Forward(d, &dr));
      tokens.push_back(Argmax(dr.seqs[0].logits.data(), V));
    }
    out->greedy.push_back(tokens);
    m.ReleaseSequence(seq);
  }
  return absl::OkStatus();
}

ModelLoadOptions BaseOptions(const fs::path& dir, const std::string& weight_dtype) {
  ModelLoadOptions o;
  o.model_dir = dir.string();
  o.kv = {4, 64};  // 256 positions in blocks of 4
  o.num_threads = 1;
  o.weight_dtype = weight_dtype;
  return o;
}

// Every rank of a TP group of `tp_size` as a thread: Gloo group, model, RunModel.
std::vector<RunResult> RunTpGroup(const fs::path& dir, const std::string& weight_dtype,
                                  int tp_size, const Reference& ref, bool mtp, size_t num_cases) {
  static std::atomic<int> group_id{0};
  const std::string prefix = absl::StrCat("tp_golden/", group_id++);
  InProcessRendezvous rendezvous;
  std::vector<RunResult> results(tp_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < tp_size; ++rank) {
    threads.emplace_back([&, rank] {
      RunResult& res = results[rank];
      GlooCommunicatorOptions co;
      co.rank = rank;
      co.size = tp_size;
      co.key_prefix = prefix;
      co.host = "127.0.0.1";
      co.connect_timeout = std::chrono::seconds(30);
      co.op_timeout = std::chrono::seconds(30);
      auto comm = GlooCommunicator::Create(&rendezvous, co);
      if (!comm.ok()) {
        res.status = comm.status();
        return;
      }
      {
        ModelLoadOptions o = BaseOptions(dir, weight_dtype);
        o.tp_rank = rank;
        o.tp_size = tp_size;
        o.tp_comm = comm->get();
        auto model = LoadGlmMoeDsa(o);
        if (!model.ok()) {
          res.status = model.status();
          return;  // the other ranks fail at their first all-reduce (connection closed)
        }
        res.status = RunModel(**model, ref, mtp, num_cases, &res);
      }
      // Nobody leaves while a peer may still be in its last all-reduce.
      if (res.status.ok()) res.status = (*comm)->Barrier();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

struct TpParam {
  std::string fixture;
  int tp_size = 2;
  std::string weight_dtype = "fp32";
  friend void PrintTo(const TpParam& p, std::ostream* os) {
    *os << p.fixture << " tp_size=" << p.tp_size << " " << p.weight_dtype;
  }
};

std::string ParamName(const ::testing::TestParamInfo<TpParam>& info) {
  std::string name = absl::StrCat(info.param.fixture, "_tp", info.param.tp_size, "_",
                                  info.param.weight_dtype);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

class TpGoldenTest : public ::testing::TestWithParam<TpParam> {};

TEST_P(TpGoldenTest, RanksMatchTp1AndTheReference) {
  const TpParam& p = GetParam();
  const fs::path dir = GoldenDir() / p.fixture;
  ASSERT_TRUE(fs::exists(dir / "config.json")) << dir;
  const Reference ref = LoadReference(dir);

  auto tp1 = LoadGlmMoeDsa(BaseOptions(dir, p.weight_dtype));
  ASSERT_TRUE(tp1.ok()) << tp1.status();
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  const bool mtp = cfg.value("num_nextn_predict_layers", 0) > 0;
  // Every case at TP = 2 (prompts of other lengths); the main one elsewhere (CI time: each
  // all-reduce is a loopback round trip between threads sharing two cores).
  const size_t num_cases =
      p.tp_size == 2 && p.weight_dtype == "fp32" ? ref.cases.size() : size_t{1};
  RunResult base;
  const absl::Status base_status = RunModel(**tp1, ref, mtp, num_cases, &base);
  ASSERT_TRUE(base_status.ok()) << base_status;
  tp1->reset();

  const std::vector<RunResult> ranks =
      RunTpGroup(dir, p.weight_dtype, p.tp_size, ref, mtp, num_cases);
  double max_rel_tp1 = 0, max_rel_ref = 0, max_rel_mtp = 0;
  for (int rank = 0; rank < p.tp_size; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", p.tp_size));
    const RunResult& r = ranks[rank];
    ASSERT_TRUE(r.status.ok()) << r.status;
    const double rel_tp1 = MaxRelDiff(r.prompt_logits, base.prompt_logits);
    max_rel_tp1 = std::max(max_rel_tp1, rel_tp1);
    EXPECT_LT(rel_tp1, kLogitTolerance);
    if (p.weight_dtype == "fp32") {  // the reference is an fp32 model
      const double rel_ref = MaxRelDiff(r.prompt_logits, ref.logits);
      max_rel_ref = std::max(max_rel_ref, rel_ref);
      EXPECT_LT(rel_ref, kLogitTolerance);
    }
    ASSERT_EQ(r.greedy.size(), num_cases);
    for (size_t c = 0; c < num_cases; ++c) {
      EXPECT_EQ(r.greedy[c], base.greedy[c]) << "case " << c << " vs TP=1";
      if (p.weight_dtype == "fp32") {
        EXPECT_EQ(r.greedy[c], ref.cases[c].greedy) << "case " << c << " vs the reference";
      }
    }
    if (mtp) {
      ASSERT_FALSE(r.mtp_logits.empty());
      const double rel = MaxRelDiff(r.mtp_logits, base.mtp_logits);
      max_rel_mtp = std::max(max_rel_mtp, rel);
      EXPECT_LT(rel, kLogitTolerance);
    }
    // The all-reduce gives every rank the same sums, and everything after it is replicated.
    EXPECT_EQ(r.prompt_logits, ranks[0].prompt_logits);
    EXPECT_EQ(r.mtp_logits, ranks[0].mtp_logits);
  }
  std::printf("[tp] %s tp=%d %s: prompt logits max rel err vs TP=1 %.3g%s%s\n",
              p.fixture.c_str(), p.tp_size, p.weight_dtype.c_str(), max_rel_tp1,
              p.weight_dtype == "fp32" ? absl::StrCat(", vs reference ", max_rel_ref).c_str() : "",
              mtp ? absl::StrCat(", MTP vs TP=1 ", max_rel_mtp).c_str() : "");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, TpGoldenTest,
    ::testing::Values(TpParam{"tiny-moe", 2}, TpParam{"tiny-moe", 4},
                      TpParam{"tiny-sparse", 2}, TpParam{"tiny-sparse", 4},
                      TpParam{"tiny-mtp", 2}, TpParam{"tiny-fp8", 2},
                      TpParam{"tiny-sharded", 2}, TpParam{"tiny-moe", 2, "bf16"}),
    ParamName);

// A group member whose all-reduce fails (fail), or (fail = false) is never reached.
FakeCommunicator StubComm(int rank, int size, bool fail) {
  return FakeCommunicator(
      rank, size,
      fail ? absl::UnavailableError("peer rank 1 closed the connection") : absl::OkStatus());
}

absl::Status LoadStatus(const ModelLoadOptions& o) { return LoadGlmMoeDsa(o).status(); }

TEST(TpOptionsTest, BadOptionsNameTheFieldAndTheFix) {
  const fs::path dir = GoldenDir() / "tiny-moe";  // 4 heads, intermediate 128, moe 24
  ModelLoadOptions o = BaseOptions(dir, "fp32");
  o.tp_size = 2;
  absl::Status st = LoadStatus(o);  // no communicator
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tp_comm is null"), std::string::npos) << st;

  auto three = StubComm(0, 3, false);
  o.tp_size = 3;
  o.tp_comm = &three;
  st = LoadStatus(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("num_attention_heads=4"), std::string::npos) << st;
  EXPECT_NE(st.message().find("tp_size=3"), std::string::npos) << st;
  EXPECT_NE(st.message().find("1, 2, 4"), std::string::npos) << st;

  // heads 4 do not split 8 ways either; the first check fires.
  auto eight = StubComm(0, 8, false);
  o.tp_size = 8;
  o.tp_comm = &eight;
  EXPECT_NE(LoadStatus(o).message().find("num_attention_heads"), std::string::npos);

  auto other_rank = StubComm(1, 2, false);
  o.tp_size = 2;
  o.tp_rank = 0;
  o.tp_comm = &other_rank;
  st = LoadStatus(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rank 1 of 2"), std::string::npos) << st;

  o.tp_rank = 2;
  st = LoadStatus(o);
  EXPECT_NE(st.message().find("tp_rank in [0, tp_size)"), std::string::npos) << st;
  EXPECT_EQ(three.num_all_reduce + eight.num_all_reduce + other_rank.num_all_reduce, 0);
}

TEST(TpOptionsTest, IntermediateSizesOfTheLayersHeldMustSplit) {
  // 4 heads, dense layers 0-1 (intermediate 128 -> 126), MoE layers 2-3 and MTP (moe 32 -> 30):
  // at tp 4 the dense width fails for a shard holding layer 0, the MoE width for the rest.
  ModelConfig c = SmallTestConfig(/*num_layers=*/4, /*num_dense=*/2, /*index_share=*/false);
  c.intermediate_size = 126;
  c.moe_intermediate_size = 30;
  InMemoryWeights none;  // the options are checked before any tensor is read
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  auto comm = StubComm(0, 4, false);
  ModelLoadOptions o;
  o.kv = {4, 16};
  o.tp_size = 4;
  o.tp_comm = &comm;
  o.first_layer = 0;
  o.last_layer = 1;
  absl::Status st = CreateGlmMoeDsa(c, none, backend.get(), o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("intermediate_size=126 does not split across tp_size=4"),
            std::string::npos)
      << st;
  o.first_layer = 2;
  o.last_layer = -1;
  st = CreateGlmMoeDsa(c, none, backend.get(), o).status();
  EXPECT_NE(st.message().find("moe_intermediate_size=30"), std::string::npos) << st;
  EXPECT_NE(st.message().find("1, 2, 3, 5, 6, 10, 15, 30"), std::string::npos) << st;
  // Widths that split get as far as reading tensors.
  c.intermediate_size = 128;
  c.moe_intermediate_size = 32;
  o.first_layer = 0;
  st = CreateGlmMoeDsa(c, none, backend.get(), o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
}

TEST(TpOptionsTest, FailedAllReduceFailsTheStepAndEveryLaterOne) {
  const fs::path dir = GoldenDir() / "tiny-moe";
  auto comm = StubComm(0, 2, /*fail=*/true);
  ModelLoadOptions o = BaseOptions(dir, "fp32");
  o.tp_size = 2;
  o.tp_comm = &comm;
  auto m = LoadGlmMoeDsa(o);
  ASSERT_TRUE(m.ok()) << m.status();
  ForwardBatch b;
  SequenceSlice s;
  s.seq_id = 1;
  s.token_ids = {1, 2, 3};
  s.block_table = {0};
  b.seqs.push_back(s);
  ForwardResult r;
  absl::Status st = (*m)->Forward(b, &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("TP all-reduce on rank 0 of 2"), std::string::npos) << st;
  EXPECT_NE(st.message().find("closed the connection"), std::string::npos) << st;
  EXPECT_FALSE((*m)->AfterFailedStep(st).ok());  // fatal: the group is broken
  const int calls = comm.num_all_reduce;
  EXPECT_GT(calls, 0);
  EXPECT_EQ((*m)->Forward(b, &r).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(comm.num_all_reduce, calls);  // the later step fails before running anything
}

}  // namespace
}  // namespace glm::engine
