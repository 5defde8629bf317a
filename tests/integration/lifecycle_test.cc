// Lifecycle through a real local cluster (tiny-chat, one agent per replica) with a load
// generator on the gateway: a rolling restart of two replicas fails no request; with one
// replica, requests wait in the gateway's queue and each gets an answer (200, or 503 with
// Retry-After past the queue bound); kill -9 of an agent under load takes its replica out of
// rotation within 3 s while the other serves, and the launcher plus self-healing bring it back
// with no command; a replica that keeps dying exhausts lifecycle.restart_budget and stays Failed
// with the reason until `glmctl restart --replica N`. Every load test is bounded in requests
// and time.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/gateway/testing/http_client.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

using gateway::testing::Http;
using gateway::testing::HttpResult;
using Json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// Greedy completions of the fixture's prompt from `threads` clients until Stop() (or
// `max_requests` in all), each checked against the expected text.
class Load {
 public:
  Load(int port, std::vector<int32_t> prompt, std::string expected, int threads,
       int max_requests = 5000)
      : port_(port), prompt_(std::move(prompt)), expected_(std::move(expected)) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, max_requests] {
        while (!stop_.load() && sent_.fetch_add(1) < max_requests) One();
      });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  // Waits until at least `n` more requests were answered (bounded).
  void AwaitAnswers(int n, seconds bound = seconds(30)) {
    const int target = answered() + n;
    const auto deadline = Clock::now() + bound;
    while (answered() < target && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  int answered() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& [k, v] : counts_) n += v;
    return n;
  }
  std::map<std::string, int> counts() {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }
  std::vector<std::string> samples() {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_;
  }
  std::string Summary() {
    std::vector<std::string> parts;
    for (const auto& [k, v] : counts()) parts.push_back(absl::StrCat(k, "=", v));
    return absl::StrCat(absl::StrJoin(parts, " "), "; first failures:\n  ",
                        absl::StrJoin(samples(), "\n  "));
  }

 private:
  void One() {
    const Json body{{"prompt", prompt_}, {"max_tokens", 8}, {"temperature", 0}};
    HttpResult r = Http(port_, "POST", "/v1/completions", body.dump(), {}, seconds(60));
    std::string kind;
    if (r.status == 200) {
      const Json j = Json::parse(r.body, nullptr, false);
      kind = !j.is_discarded() && j["choices"][0]["text"] == expected_ ? "ok" : "wrong_text";
    } else if (r.status == 503 && !r.Header("retry-after").empty()) {
      kind = "503_retry_after";
    } else {
      kind = absl::StrCat("status_", r.status);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[kind];
    if (kind != "ok" && samples_.size() < 5) {
      samples_.push_back(absl::StrCat(kind, ": ", r.body.substr(0, 400)));
    }
  }

  const int port_;
  const std::vector<int32_t> prompt_;
  const std::string expected_;
  std::atomic<bool> stop_{false};
  std::atomic<int> sent_{0};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::map<std::string, int> counts_;
  std::vector<std::string> samples_;
};

class LifecycleTest : public LoopbackClusterTest {
 protected:
  LifecycleTest() : LoopbackClusterTest("lifecycle") {
    std::ifstream in(
        absl::StrCat(GLM_TEST_SOURCE_DIR_FOR_GOLDEN, "/tests/golden/tiny-chat/reference.json"));
    const Json reference = Json::parse(in);
    prompt_ = reference["prompt_ids"].get<std::vector<int32_t>>();
    greedy_ = reference["greedy_ids"].get<std::vector<int32_t>>();
    greedy_.resize(8);
  }

  // `replicas` replicas of one agent each; the canary is transformers' greedy continuation.
  void Bring(int replicas, const std::string& sections = "",
             const std::string& controller_lines = "") {
    ClusterYaml cluster;
    cluster.local = true;
    cluster.model_path = absl::StrCat(GLM_TEST_SOURCE_DIR_FOR_GOLDEN, "/tests/golden/tiny-chat");
    cluster.kv_cache_bytes = "8MiB";
    cluster.model_lines = absl::StrCat("  canary:\n    prompt_ids: [", absl::StrJoin(prompt_, ", "),
                                       "]\n    expect_ids: [", absl::StrJoin(greedy_, ", "),
                                       "]\n");
    cluster.parallel_lines =
        absl::StrCat("  tensor: 1\n  pipeline: 1\n  replicas: ", replicas, "\n");
    cluster.sections = sections;
    cluster.controller_lines = controller_lines;
    for (int i = 1; i <= replicas; ++i) cluster.nodes.push_back({absl::StrCat("node-", i), ""});
    WriteClusterYaml(cluster);
    CommandResult up = Glmctl({"up", yaml_}, seconds(120));
    ASSERT_EQ(up.exit_code, 0) << up.output;
    ASSERT_NE(up.output.find("canary passed"), std::string::npos) << up.output;
    HttpResult text = Http(GatewayPort(), "POST", "/detokenize",
                           Json{{"tokens", greedy_}}.dump(), {}, seconds(20));
    ASSERT_EQ(text.status, 200) << text.body;
    expected_ = Json::parse(text.body)["prompt"];
  }

  std::string ReplicaState(int r, std::string* message = nullptr) {
    Json s = StatusJson();
    if (s.is_null() || s["replicas"].size() <= static_cast<size_t>(r)) return "";
    if (message) *message = s["replicas"][r]["message"];
    return s["replicas"][r]["state"];
  }
  // Polls until replica `r` is (or, with `negate`, is no longer) in `state`; the time it took,
  // or -1 after `bound`.
  double AwaitReplica(int r, const std::string& state, seconds bound, bool negate = false) {
    const auto start = Clock::now();
    while (Clock::now() - start < bound) {
      if ((ReplicaState(r) == state) != negate) {
        return std::chrono::duration<double>(Clock::now() - start).count();
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    return -1;
  }

  std::vector<int32_t> prompt_;
  std::vector<int32_t> greedy_;
  std::string expected_;
};

TEST_F(LifecycleTest, RollingRestartOfTwoReplicasUnderLoadFailsNothing) {
  Bring(2);
  Load load(GatewayPort(), prompt_, expected_, /*threads=*/4);
  load.AwaitAnswers(10);
  CommandResult restart = Glmctl({"restart", yaml_, "--rolling"}, seconds(180));
  load.AwaitAnswers(10);
  load.Stop();
  ASSERT_EQ(restart.exit_code, 0) << restart.output;
  EXPECT_NE(restart.output.find("replica 0: back in service"), std::string::npos)
      << restart.output;
  EXPECT_NE(restart.output.find("replica 1: back in service"), std::string::npos)
      << restart.output;
  EXPECT_NE(restart.output.find("canary passed"), std::string::npos) << restart.output;
  const auto counts = load.counts();
  EXPECT_GE(load.answered(), 20);
  EXPECT_EQ(counts.size(), 1u) << load.Summary();  // only "ok"
  EXPECT_GT(counts.count("ok") ? counts.at("ok") : 0, 0) << load.Summary();
  EXPECT_EQ(ReplicaState(0), "Ready");
  EXPECT_EQ(ReplicaState(1), "Ready");
  CommandResult health = Glmctl({"health", yaml_});
  EXPECT_EQ(health.exit_code, 0) << health.output;
}

TEST_F(LifecycleTest, OneReplicaRestartQueuesRequestsAndAnswersEveryOne) {
  // A short queue bound, so that some requests outwait it: those get 503 with Retry-After.
  Bring(1, "", "  gateway_queue: {max_requests: 64, timeout_s: 0.3}\n");
  Load load(GatewayPort(), prompt_, expected_, /*threads=*/3, /*max_requests=*/2000);
  load.AwaitAnswers(5);
  CommandResult restart = Glmctl({"restart", yaml_, "--rolling"}, seconds(120));
  load.AwaitAnswers(5);
  load.Stop();
  ASSERT_EQ(restart.exit_code, 0) << restart.output;
  const auto counts = load.counts();
  for (const auto& [kind, n] : counts) {
    EXPECT_TRUE(kind == "ok" || kind == "503_retry_after") << load.Summary();
  }
  EXPECT_GT(counts.count("ok") ? counts.at("ok") : 0, 0) << load.Summary();
}

TEST_F(LifecycleTest, KilledAgentLeavesRotationAndHealsWithNoCommand) {
  Bring(2);
  Load load(GatewayPort(), prompt_, expected_, /*threads=*/4);
  load.AwaitAnswers(10);
  const int before_kill = load.answered();
  const int pid = RunDirPid("agent-node-2");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const double out_s = AwaitReplica(1, "Ready", seconds(10), /*negate=*/true);
  EXPECT_GE(out_s, 0.0);
  EXPECT_LE(out_s, 3.0);
  // The other replica keeps serving meanwhile.
  load.AwaitAnswers(10);
  EXPECT_GE(load.answered(), before_kill + 10);
  // Back with no command: the launcher restarts the agent, the controller re-forms the group.
  const double healed_s = AwaitReplica(1, "Ready", seconds(60));
  load.AwaitAnswers(5);
  load.Stop();
  ASSERT_GE(healed_s, 0.0) << Glmctl({"status", yaml_}).output;
  const auto counts = load.counts();
  // Only requests in flight on the killed replica may fail (at most one per client thread).
  int failed = 0;
  for (const auto& [kind, n] : counts) {
    if (kind != "ok") failed += n;
  }
  EXPECT_LE(failed, 4) << load.Summary();
  Json status = StatusJson();
  EXPECT_EQ(status["replicas"][1]["auto_restarts"], 1) << status.dump(2);
  std::cout << "kill -9 -> out of rotation " << out_s << " s, -> healed " << healed_s << " s\n";
}

TEST_F(LifecycleTest, FlappingReplicaExhaustsTheBudgetUntilAnOperatorRestartsIt) {
  Bring(2, "lifecycle:\n  restart_budget: 1\n  restart_window_s: 600\n");
  // First death: healed (the one restart the budget allows).
  ASSERT_EQ(::kill(RunDirPid("agent-node-2"), SIGKILL), 0);
  ASSERT_GE(AwaitReplica(1, "Ready", seconds(10), /*negate=*/true), 0.0);
  ASSERT_GE(AwaitReplica(1, "Ready", seconds(60)), 0.0) << Glmctl({"status", yaml_}).output;
  // Second death: the budget is spent; the replica stays Failed with the reason.
  int pid = 0;
  const auto deadline = Clock::now() + seconds(20);
  while (Clock::now() < deadline && (pid = RunDirPid("agent-node-2")) <= 0) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  std::string message;
  const auto until = Clock::now() + seconds(30);
  while (Clock::now() < until) {
    if (ReplicaState(1, &message) == "Failed" &&
        message.find("restart budget exhausted") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_NE(message.find("restart budget exhausted"), std::string::npos) << message;
  EXPECT_NE(message.find("glmctl restart --replica 1"), std::string::npos) << message;
  CommandResult health = Glmctl({"health", yaml_});
  EXPECT_NE(health.exit_code, 0);
  EXPECT_NE(health.output.find("degraded"), std::string::npos) << health.output;
  // The operator's restart brings it back (its agent is up again by now) and resets the budget.
  CommandResult restart = Glmctl({"restart", yaml_, "--replica", "1"}, seconds(120));
  EXPECT_EQ(restart.exit_code, 0) << restart.output;
  EXPECT_EQ(ReplicaState(1), "Ready");
}

TEST_F(LifecycleTest, RestartProcessesGivesEveryAgentANewInstance) {
  Bring(1);
  Json before = StatusJson();
  CommandResult restart =
      Glmctl({"restart", yaml_, "--rolling", "--processes"}, seconds(120));
  ASSERT_EQ(restart.exit_code, 0) << restart.output;
  EXPECT_NE(restart.output.find("agent restarted"), std::string::npos) << restart.output;
  // The status stream reconnects to the new process within a heartbeat or two.
  Json after;
  const auto deadline = Clock::now() + seconds(10);
  do {
    after = StatusJson();
    if (!after.is_null() && after["nodes"][0]["instance_id"] != before["nodes"][0]["instance_id"]) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  } while (Clock::now() < deadline);
  EXPECT_NE(before["nodes"][0]["instance_id"], after["nodes"][0]["instance_id"]);
  EXPECT_EQ(ReplicaState(0), "Ready");
  HttpResult r = Http(GatewayPort(), "POST", "/v1/completions",
                      Json{{"prompt", prompt_}, {"max_tokens", 8}, {"temperature", 0}}.dump(), {},
                      seconds(60));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["text"], expected_);
}

}  // namespace
}  // namespace glm::testing
