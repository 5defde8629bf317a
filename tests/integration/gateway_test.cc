// The OpenAI-compatible gateway through a real local cluster: `glmctl up` on the tiny-chat
// fixture (TP 2 over two agent processes), then HTTP on the controller's gateway port. The
// greedy completion of the fixture's prompt is exactly transformers' greedy continuation
// (reference.json), a chat renders the checkpoint's template and streams SSE to [DONE], /health
// follows the replica, and /metrics counts the requests. API keys come from the YAML's
// controller.api_key_file and are re-read on SIGHUP.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "controller/gateway/testing/http_client.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

using gateway::testing::Http;
using gateway::testing::HttpResult;
using Json = nlohmann::json;
using std::chrono::seconds;

class GatewayClusterTest : public LoopbackClusterTest {
 protected:
  GatewayClusterTest() : LoopbackClusterTest("gwtest") {}

  void Bring(int tensor = 2, const std::string& controller_lines = "",
             const std::string& sections = "") {
    ClusterYaml cluster;
    cluster.sections = sections;
    cluster.local = true;
    cluster.model_path = absl::StrCat(GLM_TEST_SOURCE_DIR_FOR_GOLDEN, "/tests/golden/tiny-chat");
    cluster.kv_cache_bytes = "8MiB";
    cluster.parallel_lines = absl::StrCat("  tensor: ", tensor, "\n  pipeline: 1\n");
    cluster.controller_lines = controller_lines;
    for (int i = 1; i <= tensor; ++i) cluster.nodes.push_back({absl::StrCat("node-", i), ""});
    WriteClusterYaml(cluster);
    CommandResult up = Glmctl({"up", yaml_}, seconds(120));
    ASSERT_EQ(up.exit_code, 0) << up.output;
  }

  HttpResult Post(const std::string& path, const Json& body) {
    return Http(GatewayPort(), "POST", path, body.dump(), {}, seconds(60));
  }
};

TEST_F(GatewayClusterTest, CompletionsChatHealthAndMetricsOverARealCluster) {
  // Self-healing off and a short queue: the dead rank below keeps the replica down, and a
  // request waits 0.5 s for a ready replica before its 503.
  Bring(2, "  gateway_queue: {max_requests: 8, timeout_s: 0.5}\n",
        "lifecycle:\n  restart_budget: 0\n");
  std::ifstream in(
      absl::StrCat(GLM_TEST_SOURCE_DIR_FOR_GOLDEN, "/tests/golden/tiny-chat/reference.json"));
  const Json reference = Json::parse(in);
  const std::vector<int32_t> prompt = reference["prompt_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> greedy = reference["greedy_ids"].get<std::vector<int32_t>>();
  greedy.resize(12);

  EXPECT_EQ(Http(GatewayPort(), "GET", "/health").status, 200);
  HttpResult models = Http(GatewayPort(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(Json::parse(models.body)["data"][0]["id"], "tiny-chat");

  // Greedy from token ids: the text of transformers' greedy continuation.
  HttpResult expected = Post("/detokenize", Json{{"tokens", greedy}});
  ASSERT_EQ(expected.status, 200) << expected.body;
  HttpResult completion = Post(
      "/v1/completions",
      Json{{"model", "tiny-chat"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(completion.status, 200) << completion.body;
  const Json c = Json::parse(completion.body);
  EXPECT_EQ(c["choices"][0]["text"], Json::parse(expected.body)["prompt"]) << completion.body;
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(c["usage"]["completion_tokens"], 12);

  // A streamed chat through the checkpoint's template.
  HttpResult chat = Post(
      "/v1/chat/completions",
      Json{{"messages", Json::array({Json{{"role", "user"}, {"content", "What is glmctl?"}}})},
           {"max_tokens", 6},
           {"temperature", 0},
           {"stream", true},
           {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  std::vector<std::string> events = chat.Events();
  ASSERT_GE(events.size(), 3u) << chat.body;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(Json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  const Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_GT(usage["usage"]["completion_tokens"].get<int>(), 0) << chat.body;
  EXPECT_LE(usage["usage"]["completion_tokens"].get<int>(), 6) << chat.body;

  HttpResult metrics = Http(GatewayPort(), "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("vllm:e2e_request_latency_seconds_count{model_name=\"tiny-chat\"} 2"),
            std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("glmctl_replica_state{replica=\"0\",state=\"ready\"} 1"),
            std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("glmctl_node_state{node=\"node-2\",state=\"ready\"} 1"),
            std::string::npos)
      << metrics.body;

  // A dead rank: /health turns 503 naming the replica, and requests get 503 with Retry-After
  // once they waited out the gateway's queue.
  const int pid = RunDirPid("agent-node-2");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  HttpResult health;
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    health = Http(GatewayPort(), "GET", "/health");
    if (health.status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(health.status, 503) << health.body;
  EXPECT_NE(health.body.find("replica 0"), std::string::npos) << health.body;
  HttpResult refused = Post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 2}});
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.Header("retry-after"), "5");
}

TEST_F(GatewayClusterTest, ApiKeysFromTheYamlAreReloadedOnSighup) {
  const std::string keys = dir_->path() + "/api-keys";
  WriteFile(keys, "# gateway keys\nsk-first-0123456789abcdef\n");
  ASSERT_EQ(::chmod(keys.c_str(), 0600), 0);
  Bring(1, absl::StrCat("  api_key_file: ", keys, "\n"));
  auto models = [&](const std::string& key) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (!key.empty()) headers.emplace_back("Authorization", "Bearer " + key);
    return Http(GatewayPort(), "GET", "/v1/models", "", headers).status;
  };
  EXPECT_EQ(models(""), 401);
  EXPECT_EQ(models("sk-first-0123456789abcdef"), 200);
  EXPECT_EQ(Http(GatewayPort(), "GET", "/health").status, 200);  // probes need no key

  WriteFile(keys, "sk-second-0123456789abcdef\n");
  const int controller = RunDirPid("controller");
  ASSERT_GT(controller, 0);
  ASSERT_EQ(::kill(controller, SIGHUP), 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    status = models("sk-second-0123456789abcdef");
    if (status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200);
  EXPECT_EQ(models("sk-first-0123456789abcdef"), 401);
}

}  // namespace
}  // namespace glm::testing
