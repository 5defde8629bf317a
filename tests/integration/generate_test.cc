// The cluster serves tokens: local clusters on loopback (glmctl starts the controller and the
// agents), `glmctl up` loads and starts every shard (the replica's groups form through the
// controller's rendezvous), and `glmctl generate` answers with exactly the greedy tokens the
// fixture recorded from transformers (which the single-process engine reproduces,
// engine_golden_test): PP 2, an uneven PP 3 whose boundaries fall before shared-indexer layers,
// TP 2 and TP 2 x PP 2; requests of different lengths at once; and a killed non-head agent fails
// the request within 3 s and shows the replica Failed, until `glmctl up` heals it. MTP drafting
// (model.mtp_draft_tokens) on the same layouts gives the tokens and logprobs of plain decoding.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "controller/gateway/testing/http_client.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

using std::chrono::seconds;

struct Golden {
  std::vector<int32_t> prompt, greedy;
};

// The fixture's main case and its extra cases (reference.json).
std::vector<Golden> LoadGolden(const std::string& fixture) {
  std::ifstream in(absl::StrCat(GLM_TEST_SOURCE_DIR_FOR_GOLDEN, "/tests/golden/", fixture,
                                "/reference.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Golden> out;
  out.push_back({j["prompt_ids"].get<std::vector<int32_t>>(),
                 j["greedy_ids"].get<std::vector<int32_t>>()});
  for (const auto& c : j["extra_cases"]) {
    out.push_back({c["prompt_ids"].get<std::vector<int32_t>>(),
                   c["greedy_ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& v, size_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + std::min(n, v.size()));
}

// The ids on the last non-empty line of glmctl's output.
std::vector<int32_t> LastLineIds(const std::string& output) {
  std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipWhitespace());
  std::vector<int32_t> ids;
  if (lines.empty()) return ids;
  for (absl::string_view part : absl::StrSplit(lines.back(), ',')) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) return {};
    ids.push_back(id);
  }
  return ids;
}

struct Layout {
  std::string name;
  std::string fixture;
  int nodes;
  std::string parallel;  // lines under parallel:
};

class GenerateClusterTest : public LoopbackClusterTest {
 protected:
  GenerateClusterTest() : LoopbackClusterTest("gentest") {}

  // `sections`: further top-level YAML (lifecycle:); `model_lines`: further lines under model:.
  void Bring(const Layout& layout, const std::string& sections = "",
             const std::string& model_lines = "") {
    ClusterYaml cluster;
    cluster.sections = sections;
    cluster.model_lines = model_lines;
    cluster.local = true;
    cluster.model_path = absl::StrCat(GLM_TEST_SOURCE_DIR_FOR_GOLDEN, "/tests/golden/",
                                      layout.fixture);
    cluster.kv_cache_bytes = "8MiB";
    cluster.parallel_lines = layout.parallel;
    for (int i = 1; i <= layout.nodes; ++i) {
      cluster.nodes.push_back({absl::StrCat("node-", i), ""});
    }
    WriteClusterYaml(cluster);
    const auto t0 = std::chrono::steady_clock::now();
    CommandResult up = Glmctl({"up", yaml_}, seconds(120));
    ASSERT_EQ(up.exit_code, 0) << up.output;
    std::cout << "[ measure ] glmctl up (" << layout.name << ", " << layout.fixture << "): "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << " s\n";
    EXPECT_NE(up.output.find("running: world rank 0 (pp 0, tp 0)"), std::string::npos)
        << up.output;
  }

  CommandResult Generate(const std::vector<int32_t>& prompt, int max_tokens,
                         std::chrono::milliseconds timeout = seconds(60),
                         const std::vector<std::string>& flags = {}) {
    std::vector<std::string> args = {"generate", yaml_, "--tokens", absl::StrJoin(prompt, ","),
                                     "--max-tokens", std::to_string(max_tokens)};
    args.insert(args.end(), flags.begin(), flags.end());
    return Glmctl(args, timeout);
  }
};

// The `logprobs=` line of `glmctl generate --logprobs`.
std::vector<double> LogprobsLine(const std::string& output) {
  std::vector<double> out;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, "logprobs=")) continue;
    for (absl::string_view part : absl::StrSplit(line, ',', absl::SkipEmpty())) {
      double v = 0;
      if (absl::SimpleAtod(part, &v)) out.push_back(v);
    }
  }
  return out;
}

class GenerateLayoutTest : public GenerateClusterTest,
                           public ::testing::WithParamInterface<Layout> {};

TEST_P(GenerateLayoutTest, GreedyTokensEqualTheFixtures) {
  const Layout& layout = GetParam();
  Bring(layout);
  const std::vector<Golden> golden = LoadGolden(layout.fixture);
  const auto t0 = std::chrono::steady_clock::now();
  CommandResult gen = Generate(golden[0].prompt, 16);
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  std::cout << "[ measure ] glmctl generate 16 tokens (" << layout.name << "): "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s\n";
  EXPECT_EQ(LastLineIds(gen.output), Prefix(golden[0].greedy, 16)) << gen.output;
  EXPECT_NE(gen.output.find("finish_reason=length"), std::string::npos) << gen.output;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GenerateLayoutTest,
    ::testing::Values(
        // Stage 1 starts on layer 2, a shared-indexer layer: the top-k crosses the boundary.
        Layout{"PP2", "tiny-sparse", 2, "  tensor: 1\n  pipeline: 2\n  layer_partition: [2, 3]\n"},
        // Uneven, boundaries before layers 2 and 4 (both shared-indexer layers).
        Layout{"PP3", "tiny-sparse", 3,
               "  tensor: 1\n  pipeline: 3\n  layer_partition: [2, 2, 1]\n"},
        Layout{"TP2", "tiny-moe", 2, "  tensor: 2\n  pipeline: 1\n"},
        Layout{"TP2xPP2", "tiny-sparse", 4,
               "  tensor: 2\n  pipeline: 2\n  layer_partition: [2, 3]\n"}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// MTP speculative decoding through the cluster (model.mtp_draft_tokens: 3 on tiny-mtp, whose MTP
// layer lives with the last stage): every fixture case gives the transformers greedy tokens with
// drafting on and with it off for the request (--mtp-draft-tokens 0), and the same logprobs for
// every token, so the KV of rejected drafts is rolled back on every rank exactly (a stale entry
// would change the logits of the steps after it). Status and /metrics count drafts and
// acceptances; a request asking for more drafts than the replica allows is refused.
class GenerateMtpTest : public GenerateClusterTest, public ::testing::WithParamInterface<Layout> {};

TEST_P(GenerateMtpTest, DraftingKeepsTheTokensAndLogprobsOfPlainDecoding) {
  const Layout& layout = GetParam();
  Bring(layout, "", "  mtp_draft_tokens: 3\n");
  const std::vector<Golden> golden = LoadGolden(layout.fixture);
  ASSERT_EQ(golden.size(), 3u);
  constexpr int kTokens = 24;
  for (size_t c = 0; c < golden.size(); ++c) {
    SCOPED_TRACE(absl::StrCat("case ", c));
    const auto t0 = std::chrono::steady_clock::now();
    CommandResult on = Generate(golden[c].prompt, kTokens, seconds(60), {"--logprobs"});
    const double on_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CommandResult off = Generate(golden[c].prompt, kTokens, seconds(60),
                                 {"--logprobs", "--mtp-draft-tokens", "0"});
    ASSERT_EQ(on.exit_code, 0) << on.output;
    ASSERT_EQ(off.exit_code, 0) << off.output;
    std::cout << "[ measure ] " << layout.name << " case " << c << ": " << kTokens
              << " tokens with MTP k=3 in " << on_s << " s\n";
    EXPECT_EQ(LastLineIds(on.output), Prefix(golden[c].greedy, kTokens)) << on.output;
    EXPECT_EQ(LastLineIds(off.output), Prefix(golden[c].greedy, kTokens)) << off.output;
    const std::vector<double> lp_on = LogprobsLine(on.output), lp_off = LogprobsLine(off.output);
    ASSERT_EQ(lp_on.size(), static_cast<size_t>(kTokens)) << on.output;
    ASSERT_EQ(lp_off.size(), static_cast<size_t>(kTokens)) << off.output;
    for (int t = 0; t < kTokens; ++t) {
      // Rows verified in a batch of 4 against rows run one at a time: the same math up to
      // float summation order.
      EXPECT_NEAR(lp_on[t], lp_off[t], 1e-4) << "token " << t;
    }
  }

  // The head publishes its counters with its status (about once a second): read status and
  // /metrics until both show the same final count.
  nlohmann::json spec;
  std::string metrics_body, series;
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    nlohmann::json status = StatusJson();
    if (status.is_object() && status["replicas"].is_array() && !status["replicas"].empty()) {
      spec = status["replicas"][0].value("spec_decode", nlohmann::json());
    }
    gateway::testing::HttpResult metrics =
        gateway::testing::Http(GatewayPort(), "GET", "/metrics");
    metrics_body = metrics.body;
    if (spec.is_object() && metrics.status == 200) {
      series = absl::StrCat(
          "vllm:spec_decode_num_draft_tokens_total{model_name=\"tiny-mtp\",replica=\"0\"} ",
          spec["draft_tokens"].get<int64_t>(), "\n");
      if (metrics_body.find(series) != std::string::npos) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  ASSERT_TRUE(spec.is_object()) << "no spec_decode in glmctl status --json";
  EXPECT_NE(metrics_body.find(series), std::string::npos) << series << metrics_body;
  EXPECT_EQ(spec["draft_tokens_per_step"], 3);
  const int64_t drafted = spec["draft_tokens"].get<int64_t>();
  const int64_t accepted = spec["accepted_tokens"].get<int64_t>();
  EXPECT_GT(drafted, 0);
  EXPECT_LE(accepted, drafted);
  EXPECT_LE(drafted, 3 * spec["drafts"].get<int64_t>());
  int64_t by_position = 0;
  for (const auto& n : spec["accepted_per_position"]) by_position += n.get<int64_t>();
  EXPECT_EQ(by_position, accepted);
  std::cout << "[ measure ] " << layout.name << ": " << accepted << " of " << drafted
            << " drafts accepted\n";
  CommandResult table = Glmctl({"status", yaml_}, seconds(10));
  EXPECT_NE(table.output.find("speculative decoding: 3 MTP drafts per step"), std::string::npos)
      << table.output;
  // The planner's projection takes the acceptance the running cluster measured: its counters,
  // which may have moved on since the reading above (the head publishes about once a second).
  CommandResult plan = Glmctl({"plan", yaml_, "--mtp-acceptance", "measured"}, seconds(10));
  const std::string line = "mtp acceptance measured by the running cluster: ";
  const size_t at = plan.output.find(line);
  ASSERT_NE(at, std::string::npos) << plan.output;
  long long plan_accepted = -1, plan_drafted = -1;
  ASSERT_EQ(std::sscanf(plan.output.c_str() + at + line.size(), "%lld of %lld", &plan_accepted,
                        &plan_drafted),
            2)
      << plan.output;
  EXPECT_GE(plan_drafted, drafted) << plan.output;
  EXPECT_GE(plan_accepted, accepted) << plan.output;
  EXPECT_LE(plan_accepted, plan_drafted) << plan.output;
  EXPECT_NE(plan.output.find("decode"), std::string::npos) << plan.output;

  // More drafts than model.mtp_draft_tokens: refused, naming the field and the limit.
  CommandResult over = Generate(golden[0].prompt, 4, seconds(30), {"--mtp-draft-tokens", "4"});
  EXPECT_NE(over.exit_code, 0) << over.output;
  EXPECT_NE(over.output.find("mtp_draft_tokens=4 is outside [0, 3]"), std::string::npos)
      << over.output;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GenerateMtpTest,
    ::testing::Values(
        Layout{"PP2", "tiny-mtp", 2, "  tensor: 1\n  pipeline: 2\n  layer_partition: [2, 1]\n"},
        Layout{"TP2", "tiny-mtp", 2, "  tensor: 2\n  pipeline: 1\n"},
        Layout{"TP2xPP2", "tiny-mtp", 4,
               "  tensor: 2\n  pipeline: 2\n  layer_partition: [2, 1]\n"}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// kill -9 of the stage holding the MTP layer while requests draft and verify: the request fails
// within 3 s with an error and the replica shows Failed (no rank waits forever on a verify step).
TEST_F(GenerateClusterTest, MtpStageKilledMidVerifyFailsTheGroupCleanly) {
  const Layout layout{"PP2", "tiny-mtp", 2,
                      "  tensor: 1\n  pipeline: 2\n  layer_partition: [2, 1]\n"};
  Bring(layout, "lifecycle:\n  restart_budget: 0\n", "  mtp_draft_tokens: 3\n");
  const std::vector<Golden> golden = LoadGolden(layout.fixture);
  const int pid = RunDirPid("agent-node-2");
  ASSERT_GT(pid, 0);
  auto long_request = std::async(std::launch::async, [&] {
    return Generate(golden[0].prompt, 480, seconds(30), {"--temperature", "1", "--seed", "7"});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  CommandResult failed = long_request.get();
  if (failed.exit_code == 0) failed = Generate(golden[0].prompt, 8, seconds(30));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_LT(took, 3.0) << failed.output;
  std::cout << "[ measure ] kill -9 of the MTP stage to the request's error: " << took << " s\n";
  EXPECT_TRUE(failed.output.find("rank") != std::string::npos ||
              failed.output.find("node-2") != std::string::npos)
      << failed.output;
  std::string replica_state;
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < deadline && replica_state != "Failed") {
    nlohmann::json status = StatusJson();
    if (status.is_object() && status["replicas"].is_array() && !status["replicas"].empty()) {
      replica_state = status["replicas"][0].value("state", "");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(replica_state, "Failed");
}

// parallel.micro_batches reaches the head's scheduler: at 1, two concurrent requests never have
// more than one step in flight (the default, pipeline = 2, lets them overlap), and the tokens
// stay the fixture's.
TEST_F(GenerateClusterTest, MicroBatchesFromTheYamlBoundTheStepsInFlight) {
  const Layout layout{"PP2", "tiny-sparse", 2,
                      "  tensor: 1\n  pipeline: 2\n  layer_partition: [2, 3]\n"
                      "  micro_batches: 1\n"};
  Bring(layout);
  const std::vector<Golden> golden = LoadGolden(layout.fixture);
  ASSERT_GE(golden.size(), 2u);
  auto a = std::async(std::launch::async, [&] { return Generate(golden[0].prompt, 16); });
  auto b = std::async(std::launch::async, [&] { return Generate(golden[1].prompt, 16); });
  CommandResult ra = a.get(), rb = b.get();
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  EXPECT_EQ(LastLineIds(ra.output), Prefix(golden[0].greedy, 16)) << ra.output;
  EXPECT_EQ(LastLineIds(rb.output), Prefix(golden[1].greedy, 16)) << rb.output;
  // The head publishes its stats about once a second: wait for a status showing the steps.
  int observed = -1;
  nlohmann::json status;
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < deadline && observed < 1) {
    status = StatusJson();
    if (status.is_object() && status["nodes"].is_array()) {
      for (const auto& n : status["nodes"]) {
        const nlohmann::json& shard = n.value("shard", nlohmann::json());
        if (shard.is_object() && shard.value("head", false)) {
          observed = shard.value("max_steps_in_flight_observed", -1);
        }
      }
    }
    if (observed < 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_EQ(observed, 1) << status.dump(2);
}

TEST_F(GenerateClusterTest, ConcurrentRequestsThenAKilledRankFailsTheReplica) {
  const Layout layout{"PP2", "tiny-sparse", 2,
                      "  tensor: 1\n  pipeline: 2\n  layer_partition: [2, 3]\n"};
  // Self-healing off: the replica stays Failed after the kill until `glmctl up` (the lifecycle
  // test covers healing with no command).
  Bring(layout, "lifecycle:\n  restart_budget: 0\n");
  const std::vector<Golden> golden = LoadGolden(layout.fixture);
  ASSERT_GE(golden.size(), 2u);

  // Two requests of different prompt and output lengths at once.
  auto a = std::async(std::launch::async, [&] { return Generate(golden[0].prompt, 24); });
  auto b = std::async(std::launch::async, [&] { return Generate(golden[1].prompt, 9); });
  CommandResult ra = a.get(), rb = b.get();
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  EXPECT_EQ(LastLineIds(ra.output), Prefix(golden[0].greedy, 24)) << ra.output;
  EXPECT_EQ(LastLineIds(rb.output), Prefix(golden[1].greedy, 9)) << rb.output;

  // kill -9 the non-head stage while a long request runs: the request fails within 3 s, with
  // an error, and the replica shows Failed.
  const int pid = RunDirPid("agent-node-2");
  ASSERT_GT(pid, 0);
  auto long_request = std::async(std::launch::async, [&] {
    return Generate(golden[0].prompt, 480, seconds(30));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  CommandResult failed = long_request.get();
  const bool finished_before_kill = failed.exit_code == 0;
  if (finished_before_kill) {
    // It finished before the kill landed: the next request must fail instead, refused up front
    // (the node is already seen gone) or mid-flight (the rank fails under it).
    failed = Generate(golden[0].prompt, 8, seconds(30));
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_LT(took, 3.0) << failed.output;
  std::cout << "[ measure ] kill -9 of pp 1 to the request's error: " << took << " s\n";
  EXPECT_NE(failed.output.find("glmctl generate:"), std::string::npos) << failed.output;
  // Names the failed rank, or (refused before it started) the node that went away.
  EXPECT_TRUE(failed.output.find("rank") != std::string::npos ||
              (finished_before_kill && failed.output.find("node-2") != std::string::npos))
      << failed.output;

  nlohmann::json status;
  std::string replica_state, message;
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    status = StatusJson();
    if (!status.is_null() && status["replicas"].is_array() && !status["replicas"].empty()) {
      replica_state = status["replicas"][0].value("state", "");
      message = status["replicas"][0].value("message", "");
      if (replica_state == "Failed") break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(replica_state, "Failed") << status.dump(2);
  // The reason names the failed rank (the head's group error) or the node that went away.
  EXPECT_TRUE(message.find("rank") != std::string::npos ||
              message.find("node-2") != std::string::npos)
      << status.dump(2);
  CommandResult table = Glmctl({"status", yaml_}, seconds(10));
  EXPECT_NE(table.output.find("Failed"), std::string::npos) << table.output;

  // No Ready replica: generate says so and exits non-zero.
  CommandResult refused = Generate(golden[0].prompt, 4, seconds(10));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("no replica"), std::string::npos) << refused.output;

  // `glmctl up` heals it: the launcher restarted the dead agent, the group re-forms in a new
  // epoch and serves the fixture's tokens.
  CommandResult healed = Glmctl({"up", yaml_}, seconds(120));
  ASSERT_EQ(healed.exit_code, 0) << healed.output;
  CommandResult again = Generate(golden[0].prompt, 8);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(LastLineIds(again.output), Prefix(golden[0].greedy, 8)) << again.output;
}

}  // namespace
}  // namespace glm::testing
