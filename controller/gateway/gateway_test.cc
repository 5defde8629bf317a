// The gateway's routes over a real HTTP server on loopback and a scripted replica backend: the
// OpenAI shapes (JSON and SSE), the GLM parsers in the loop, errors and their statuses, API keys,
// health, metrics, a disconnecting client cancelling its generation, the admission queue (no
// replica ready) and the retry of a generation a replica failed before its first token.
#include "controller/gateway/gateway.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <set>
#include <thread>

#include "controller/gateway/testing/fake_replica_backend.h"
#include "controller/gateway/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::gateway {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using testing::FakeReplicaBackend;
using testing::Http;

// A GLM-5-shaped template (spec §2.3), small enough to read here.
constexpr char kTemplate[] =
    "[gMASK]<sop>"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|system|>{{ m.content }}"
    "{%- elif m.role == 'user' -%}<|user|>{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|></think>{{ m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}</think>"
    "{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}";

std::string SourceDir() {
  const char* dir = std::getenv("GLM_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("glm-gateway-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    fs::copy_file(fs::path(SourceDir()) / "tests/golden/tiny-chat/tokenizer.json",
                  dir_ / "tokenizer.json", fs::copy_options::overwrite_existing);
    std::ofstream(dir_ / "chat_template.jinja") << kTemplate;
    std::ofstream(dir_ / "config.json") << R"({"eos_token_id": [1014, 1021, 1023]})";
    Start(nullptr);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::milliseconds(0));
    server_.reset();
    gateway_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void Start(std::shared_ptr<ApiKeys> keys) {
    if (server_) server_->Shutdown(std::chrono::milliseconds(0));
    absl::StatusOr<ModelFiles> model = ModelFiles::Load(dir_.string());
    ASSERT_TRUE(model.ok()) << model.status();
    tokenizer_ = model->tokenizer;
    GatewayOptions options;
    options.served_name = "tiny-chat";
    options.max_model_len = 256;
    options.version = "1.2.3";
    options.max_queued = max_queued_;
    options.queue_timeout = queue_timeout_;
    options.queue_recheck = queue_recheck_;
    gateway_.reset();  // one gateway (and readiness listener) at a time
    gateway_ = std::make_unique<Gateway>(options, *model, &backend_, std::move(keys), &metrics_,
                                         clock_);
    http::ServerOptions server_options;
    server_options.io_threads = 2;
    auto server = http::Server::Start(
        server_options, [this](std::shared_ptr<http::Exchange> ex) { gateway_->Handle(ex); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::vector<int32_t> Ids(const std::string& text) { return tokenizer_->Encode(text, false); }
  void Script(const std::string& text, std::vector<int32_t> extra = {}) {
    FakeReplicaBackend::Script s;
    s.tokens = Ids(text);
    s.tokens.insert(s.tokens.end(), extra.begin(), extra.end());
    backend_.SetScript(s);
  }
  testing::HttpResult Post(const std::string& path, const Json& body,
                           std::vector<std::pair<std::string, std::string>> headers = {}) {
    return Http(server_->port(), "POST", path, body.dump(), headers);
  }
  testing::HttpResult Get(const std::string& path) { return Http(server_->port(), "GET", path); }
  // A request from a thread of its own, for requests that wait in the gateway's queue.
  std::future<testing::HttpResult> PostAsync(const std::string& path, const Json& body) {
    const int port = server_->port();
    return std::async(std::launch::async,
                      [port, path, text = body.dump()] { return Http(port, "POST", path, text); });
  }
  // Polls `done` until it holds or 10 s pass.
  static bool WaitFor(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
  std::vector<int32_t> ChatPrompt(const std::string& user) {
    return Ids("[gMASK]<sop><|user|>" + user + "<|assistant|><think>");
  }
  FakeReplicaBackend::Script Fails(absl::Status error, const std::string& text = "") {
    FakeReplicaBackend::Script s;
    s.tokens = text.empty() ? std::vector<int32_t>{} : Ids(text);
    s.error = std::move(error);
    return s;
  }
  FakeReplicaBackend::Script Answers(const std::string& text) {
    FakeReplicaBackend::Script s;
    s.tokens = Ids(text);
    return s;
  }

  // Options of the next Start().
  int max_queued_ = 256;
  std::chrono::milliseconds queue_timeout_{30000};
  std::chrono::milliseconds queue_recheck_{25};
  Clock* clock_ = Clock::Real();
  FakeClock fake_clock_;

  fs::path dir_;
  FakeReplicaBackend backend_{1};
  GatewayMetrics metrics_{"tiny-chat", 256};
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<http::Server> server_;
};

Json ChatBody(bool stream = false) {
  return Json{{"model", "tiny-chat"},
              {"messages", Json::array({Json{{"role", "user"}, {"content", "Hi"}}})},
              {"stream", stream}};
}

TEST_F(GatewayTest, ModelsListsTheServedModel) {
  testing::HttpResult r = Get("/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny-chat");
  EXPECT_EQ(j["data"][0]["max_model_len"], 256);
  EXPECT_EQ(Json::parse(Get("/version").body)["version"], "1.2.3");
}

TEST_F(GatewayTest, ChatSplitsReasoningFromContentAndHidesTheStopToken) {
  Script("hmm</think>Hello there", {1014});
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody());
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_THAT(j["id"].get<std::string>(), ::testing::StartsWith("chatcmpl-"));
  EXPECT_EQ(j["model"], "tiny-chat");
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Hello there");
  EXPECT_EQ(choice["message"]["reasoning_content"], "hmm");
  EXPECT_EQ(choice["message"]["reasoning"], "hmm");
  EXPECT_EQ(choice["finish_reason"], "stop");
  // The prompt is the template's rendering, tokenized; the replica got exactly it.
  const std::vector<int32_t> prompt = Ids("[gMASK]<sop><|user|>Hi<|assistant|><think>");
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], Ids("hmm</think>Hello there").size() + 1);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt.size() + Ids("hmm</think>Hello there").size() + 1);
  auto requests = backend_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].second.prompt_token_ids, prompt);
  EXPECT_EQ(requests[0].second.max_tokens, 256 - static_cast<int>(prompt.size()));
  EXPECT_THAT(requests[0].second.stop_token_ids, ::testing::ElementsAre(1014, 1021, 1023));
}

TEST_F(GatewayTest, ThinkingOffRendersTheClosedBlockAndAllIsContent) {
  Script("Plain answer");
  Json body = ChatBody();
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  testing::HttpResult r = Post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Plain answer");
  EXPECT_TRUE(j["choices"][0]["message"]["reasoning_content"].is_null());
  EXPECT_EQ(backend_.requests()[0].second.prompt_token_ids,
            Ids("[gMASK]<sop><|user|>Hi<|assistant|></think>"));
}

TEST_F(GatewayTest, StreamSendsRoleFirstThenDeltasThenFinishUsageAndDone) {
  Script("a</think>bc");
  Json body = ChatBody(true);
  body["stream_options"] = {{"include_usage", true}};
  testing::HttpResult r = Post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.Header("content-type"), HasSubstr("text/event-stream"));
  std::vector<std::string> events = r.Events();
  ASSERT_GE(events.size(), 4u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (Json{{"role", "assistant"}, {"content", ""}}));
  std::string reasoning, content;
  std::string finish;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    Json c = Json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]);
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "a");
  EXPECT_EQ(content, "bc");
  EXPECT_EQ(finish, "stop");
  Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], Ids("a</think>bc").size());
}

TEST_F(GatewayTest, ToolCallsAreParsedTypedAndFinishWithToolCalls) {
  Script("</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
         "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
         {1023});
  Json body = ChatBody();
  body["tools"] = Json::array({Json{
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"parameters",
         {{"type", "object"},
          {"properties",
           {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}}}}}}}});
  testing::HttpResult r = Post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], "{\"city\": \"Paris\", \"days\": 2}");
}

TEST_F(GatewayTest, StopStringEndsTheAnswerAndCancelsTheGeneration) {
  Script("</think>one two STOP three four five six seven");
  Json body = ChatBody();
  body["stop"] = "STOP";
  testing::HttpResult r = Post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "one two ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(GatewayTest, LengthFinishAndCompletionsWithTokenPromptEchoAndLogprobs) {
  Script(" world and more");
  Json body = {{"prompt", Ids("Hello")}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}};
  testing::HttpResult r = Post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  const std::vector<int32_t> all = Ids(" world and more");
  const std::vector<int32_t> two(all.begin(), all.begin() + 2);
  EXPECT_EQ(choice["text"], "Hello" + tokenizer_->Decode(two));
  ASSERT_EQ(choice["logprobs"]["token_logprobs"].size(), 2u);
  EXPECT_FLOAT_EQ(choice["logprobs"]["token_logprobs"][0].get<float>(), -0.5f);
  EXPECT_EQ(backend_.requests()[0].second.logprobs, 1);
}

TEST_F(GatewayTest, BadRequestsNameTheParameter) {
  testing::HttpResult r = Http(server_->port(), "POST", "/v1/chat/completions", "{not json");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["code"], 400);

  Json body = ChatBody();
  body["n"] = 2;
  r = Post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "n");

  body = ChatBody();
  body["max_tokens"] = 100000;
  r = Post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "max_tokens");
  EXPECT_THAT(r.body, HasSubstr("maximum context length is 256"));

  body = ChatBody();
  body["model"] = "gpt-4";
  r = Post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Json::parse(r.body)["error"]["type"], "NotFoundError");

  r = Post("/v1/completions", Json{{"prompt", Json::array({5000})}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "prompt[0]");

  r = Get("/v1/nothing");
  EXPECT_EQ(r.status, 404);
  r = Get("/v1/chat/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_TRUE(backend_.requests().empty());
}

TEST_F(GatewayTest, NoReadyReplicaIs503WithRetryAfterAndHealthSaysWhy) {
  queue_timeout_ = std::chrono::milliseconds(0);  // no queue: 503 at once
  Start(nullptr);
  EXPECT_EQ(Get("/health").status, 200);
  backend_.SetReady(0, false);
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody());
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.Header("retry-after"), "5");
  EXPECT_THAT(r.body, HasSubstr("replica 0 is failed"));
  testing::HttpResult health = Get("/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_THAT(health.body, HasSubstr("replica 0 is down"));
}

TEST_F(GatewayTest, ReplicaErrorMidStreamSendsAnErrorFrameThenDone) {
  FakeReplicaBackend::Script s;
  s.tokens = Ids("</think>partial");
  s.error = absl::UnavailableError("replica 0 (head shard on node n1): rank 1 died");
  backend_.SetScript(s);
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody(true));
  ASSERT_EQ(r.status, 200);
  std::vector<std::string> events = r.Events();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  Json error = Json::parse(events[events.size() - 2]);
  EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr("rank 1 died"));
  EXPECT_EQ(error["error"]["code"], 503);
}

TEST_F(GatewayTest, ApiKeysGuardTheApiButNotHealth) {
  const fs::path keys = dir_ / "keys";
  std::ofstream(keys) << "# gateway keys\nsk-test-0123456789abcdef\n";
  fs::permissions(keys, fs::perms::owner_read | fs::perms::owner_write);
  absl::StatusOr<std::unique_ptr<ApiKeys>> loaded = ApiKeys::Load(keys.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Start(std::shared_ptr<ApiKeys>(std::move(*loaded)));
  Script("</think>ok");
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody()).status, 401);
  testing::HttpResult wrong =
      Post("/v1/chat/completions", ChatBody(), {{"Authorization", "Bearer sk-wrong-key-000000000"}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(Json::parse(wrong.body)["error"]["code"], 401);
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody(),
                 {{"Authorization", "Bearer sk-test-0123456789abcdef"}})
                .status,
            200);
  EXPECT_EQ(Get("/health").status, 200);
  EXPECT_EQ(Get("/v1/models").status, 401);
}

TEST_F(GatewayTest, NamedHashedKeysAreCountedByNameAndRateLimited) {
  // sha256("sk-hashed-0123456789abcdef"), as `printf %s "$KEY" | sha256sum` prints it.
  const std::string hashed_hex = "a3c66bc68e5294b6b2a60d75ff071010df2ade6140d82c191f74db7654a2441e";
  const fs::path keys = dir_ / "keys";
  std::ofstream(keys) << "alice: sk-alice-0123456789abcdef rate=2/s\n"
                      << "bob: sha256:" << hashed_hex << "\n";
  fs::permissions(keys, fs::perms::owner_read | fs::perms::owner_write);
  absl::StatusOr<std::unique_ptr<ApiKeys>> loaded = ApiKeys::Load(keys.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  clock_ = &fake_clock_;
  Start(std::shared_ptr<ApiKeys>(std::move(*loaded)));
  Script("</think>ok");
  const std::vector<std::pair<std::string, std::string>> alice = {
      {"Authorization", "Bearer sk-alice-0123456789abcdef"}};
  const std::vector<std::pair<std::string, std::string>> bob = {
      {"Authorization", "Bearer sk-hashed-0123456789abcdef"}};
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody(), bob).status, 200);
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody(),
                 {{"Authorization", "Bearer sha256:" + hashed_hex}})
                .status,
            401);  // the digest itself is no key
  // Burst 2, then 429 until a token refills (0.5 s at 2/s; Retry-After rounds up to 1 s).
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody(), alice).status, 200);
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody(), alice).status, 200);
  testing::HttpResult limited = Post("/v1/chat/completions", ChatBody(), alice);
  EXPECT_EQ(limited.status, 429);
  EXPECT_EQ(limited.Header("retry-after"), "1");
  EXPECT_EQ(Json::parse(limited.body)["error"]["code"], 429);
  EXPECT_THAT(limited.body, HasSubstr("alice"));
  fake_clock_.Advance(std::chrono::milliseconds(500));
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody(), alice).status, 200);
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody(), alice).status, 429);

  const std::string metrics = Get("/metrics").body;
  EXPECT_THAT(metrics, HasSubstr("glmctl_gateway_requests_total{key=\"alice\"} 5"));
  EXPECT_THAT(metrics, HasSubstr("glmctl_gateway_requests_total{key=\"bob\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("glmctl_gateway_rate_limited_total{key=\"alice\"} 2"));
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("sk-alice")));
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("sk-hashed")));
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr(hashed_hex)));
}

TEST_F(GatewayTest, ClientDisconnectCancelsTheGeneration) {
  FakeReplicaBackend::Script s;
  s.tokens = Ids("</think>never sent");
  s.hold = true;
  backend_.SetScript(s);
  const int fd = testing::ConnectLoopback(server_->port(), std::chrono::seconds(5));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::SendAll(
      fd, testing::RequestText("POST", "/v1/chat/completions", ChatBody(true).dump(), {})));
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);  // headers and the role chunk
  ::close(fd);
  for (int i = 0; i < 500 && backend_.cancels() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(backend_.cancels(), 1);
  for (int i = 0; i < 500 && gateway_->in_flight() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(gateway_->in_flight(), 0);
}

TEST_F(GatewayTest, TokenizeAndDetokenizeUseVllmShapes) {
  testing::HttpResult r = Post("/tokenize", Json{{"prompt", "Hello world"}});
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  const std::vector<int32_t> ids = tokenizer_->Encode("Hello world", true);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(j["count"], ids.size());
  EXPECT_EQ(j["max_model_len"], 256);
  r = Post("/tokenize", Json{{"messages", ChatBody()["messages"]}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["tokens"].get<std::vector<int32_t>>(),
            Ids("[gMASK]<sop><|user|>Hi<|assistant|><think>"));
  r = Post("/detokenize", Json{{"tokens", ids}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["prompt"], tokenizer_->Decode(ids));
  EXPECT_EQ(Post("/detokenize", Json{{"tokens", {-1}}}).status, 400);
}

TEST_F(GatewayTest, MetricsUseVllmNamesAndCountRequests) {
  Script("</think>ok");
  ASSERT_EQ(Post("/v1/chat/completions", ChatBody()).status, 200);
  testing::HttpResult r = Get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr("vllm:e2e_request_latency_seconds_count{model_name=\"tiny-chat\"} 1"));
  EXPECT_THAT(r.body, HasSubstr("vllm:time_to_first_token_seconds_count"));
  EXPECT_THAT(r.body, ::testing::ContainsRegex("vllm:request_success_total\\{[^}]*finished_reason=\"stop\"[^}]*\\} 1"));
  EXPECT_THAT(r.body, HasSubstr("vllm:kv_cache_usage_perc"));
  EXPECT_THAT(r.body, HasSubstr("glmctl_replica_state"));
}


// The content deltas of a chat stream, joined.
std::string StreamedContent(const testing::HttpResult& r) {
  std::string content;
  for (const std::string& event : r.Events()) {
    if (event == "[DONE]") continue;
    Json c = Json::parse(event);
    if (!c.contains("choices") || c["choices"].empty()) continue;
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  return content;
}

Json ChatSays(const std::string& user, bool stream = false) {
  Json body = ChatBody(stream);
  body["messages"][0]["content"] = user;
  return body;
}

TEST_F(GatewayTest, QueuedRequestStartsWhenAReplicaBecomesReady) {
  backend_.SetReady(0, false);
  Script("</think>later");
  auto pending = PostAsync("/v1/chat/completions", ChatBody());
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1; }));
  EXPECT_TRUE(backend_.requests().empty());
  EXPECT_THAT(Get("/metrics").body,
              HasSubstr("glmctl_gateway_requests_queued{model_name=\"tiny-chat\"} 1\n"));
  backend_.SetReady(0, true);  // the readiness listener wakes the queue
  testing::HttpResult r = pending.get();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["message"]["content"], "later");
  EXPECT_EQ(backend_.requests().size(), 1u);
  EXPECT_EQ(gateway_->queued(), 0);
  const std::string metrics = Get("/metrics").body;
  EXPECT_THAT(metrics, HasSubstr("glmctl_gateway_requests_queued{model_name=\"tiny-chat\"} 0\n"));
  EXPECT_THAT(metrics,
              HasSubstr("glmctl_gateway_queue_time_seconds_count{model_name=\"tiny-chat\"} 1\n"));
}

TEST_F(GatewayTest, QueueRechecksReadinessWithoutANotification) {
  backend_.SetReady(0, false);
  Script("</think>polled");
  auto pending = PostAsync("/v1/chat/completions", ChatBody(true));
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1; }));
  backend_.SetReady(0, true, "", /*notify=*/false);  // seen at the next periodic re-check
  testing::HttpResult r = pending.get();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(StreamedContent(r), "polled");
  EXPECT_EQ(r.Events().back(), "[DONE]");
}

TEST_F(GatewayTest, QueueTimeoutIs503WithRetryAfterSayingWhyAndHowLong) {
  clock_ = &fake_clock_;
  Start(nullptr);
  backend_.SetReady(0, false);
  auto first = PostAsync("/v1/chat/completions", ChatBody());
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1; }));
  fake_clock_.Advance(std::chrono::seconds(15));
  auto second = PostAsync("/v1/completions", Json{{"prompt", "Hello"}});
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 2; }));
  fake_clock_.Advance(std::chrono::seconds(15));
  // The first has waited 30 s and expires; the second (15 s) is judged at the same moment and
  // still waits.
  testing::HttpResult r = first.get();
  EXPECT_EQ(gateway_->queued(), 1);
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.Header("retry-after"), "5");
  const std::string message = Json::parse(r.body)["error"]["message"];
  EXPECT_THAT(message, HasSubstr("no replica became ready within 30.0 s (waited 30.0 s"));
  EXPECT_THAT(message, HasSubstr("replica 0 is failed: replica 0 is down"));
  fake_clock_.Advance(std::chrono::seconds(15));
  EXPECT_EQ(second.get().status, 503);
  EXPECT_TRUE(backend_.requests().empty());
  EXPECT_EQ(gateway_->queued(), 0);
  EXPECT_THAT(Get("/metrics").body,
              HasSubstr("glmctl_gateway_unavailable_total{model_name=\"tiny-chat\","
                        "reason=\"queue_timeout\"} 2\n"));
}

TEST_F(GatewayTest, FullQueueIs503AtOnce) {
  max_queued_ = 1;
  Start(nullptr);
  backend_.SetReady(0, false);
  Script("</think>first");
  auto first = PostAsync("/v1/chat/completions", ChatBody());
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1; }));
  testing::HttpResult full = Post("/v1/chat/completions", ChatBody());
  EXPECT_EQ(full.status, 503) << full.body;
  EXPECT_EQ(full.Header("retry-after"), "5");
  EXPECT_THAT(full.body, HasSubstr("queue is full: 1 requests already wait"));
  EXPECT_THAT(full.body, HasSubstr("replica 0 is failed"));
  backend_.SetReady(0, true);
  EXPECT_EQ(first.get().status, 200);
  EXPECT_EQ(backend_.requests().size(), 1u);
}

TEST_F(GatewayTest, ClientThatLeavesWhileQueuedIsRemovedAndNeverGenerates) {
  backend_.SetReady(0, false);
  const int fd = testing::ConnectLoopback(server_->port(), std::chrono::seconds(5));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::SendAll(
      fd, testing::RequestText("POST", "/v1/chat/completions", ChatSays("gone").dump(), {})));
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1; }));
  ::close(fd);
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 0; }));
  backend_.SetReady(0, true);
  Script("</think>ok");
  // A later request runs; the one that left never reached a replica.
  ASSERT_EQ(Post("/v1/chat/completions", ChatSays("stays")).status, 200);
  auto requests = backend_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].second.prompt_token_ids, ChatPrompt("stays"));
  EXPECT_EQ(gateway_->in_flight(), 0);
}

TEST_F(GatewayTest, StopAdmittingAnswersEveryQueuedRequest) {
  backend_.SetReady(0, false);
  auto a = PostAsync("/v1/chat/completions", ChatBody());
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1; }));
  auto b = PostAsync("/v1/completions", Json{{"prompt", "Hello"}});
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 2; }));
  gateway_->StopAdmitting();
  for (auto* pending : {&a, &b}) {
    testing::HttpResult r = pending->get();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.Header("retry-after"), "5");
    EXPECT_THAT(r.body, HasSubstr("shutting down"));
  }
  EXPECT_EQ(gateway_->queued(), 0);
  backend_.SetReady(0, true);
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody()).status, 503);
  EXPECT_TRUE(backend_.requests().empty());
}

TEST_F(GatewayTest, QueuedRequestsStartInArrivalOrderAndNewOnesDoNotOvertake) {
  queue_recheck_ = std::chrono::hours(1);  // only enqueues and notifications wake the queue
  Start(nullptr);
  backend_.SetReady(0, false);
  Script("</think>ok");
  auto one = PostAsync("/v1/chat/completions", ChatSays("one"));
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1; }));
  auto two = PostAsync("/v1/chat/completions", ChatSays("two"));
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 2; }));
  // The replica is ready but the queue has not looked yet: a new request must queue behind.
  backend_.SetReady(0, true, "", /*notify=*/false);
  testing::HttpResult three = Post("/v1/chat/completions", ChatSays("three"));
  EXPECT_EQ(three.status, 200) << three.body;
  EXPECT_EQ(one.get().status, 200);
  EXPECT_EQ(two.get().status, 200);
  auto requests = backend_.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].second.prompt_token_ids, ChatPrompt("one"));
  EXPECT_EQ(requests[1].second.prompt_token_ids, ChatPrompt("two"));
  EXPECT_EQ(requests[2].second.prompt_token_ids, ChatPrompt("three"));
}

TEST_F(GatewayTest, ReplicaFailureBeforeTheFirstTokenIsRetriedOnAnotherReplica) {
  backend_.AddReplica();
  backend_.SetReplicaScript(0, Fails(absl::FailedPreconditionError("replica 0 is not Running")));
  backend_.SetReplicaScript(1, Answers("</think>fine"));
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody());
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "fine");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], Ids("</think>fine").size());
  auto requests = backend_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].first, 0);
  EXPECT_EQ(requests[1].first, 1);
  EXPECT_EQ(requests[1].second.prompt_token_ids, requests[0].second.prompt_token_ids);
  EXPECT_EQ(gateway_->in_flight(), 0);
  EXPECT_THAT(Get("/metrics").body,
              HasSubstr("glmctl_gateway_request_retries_total{model_name=\"tiny-chat\"} 1\n"));
}

TEST_F(GatewayTest, StreamRetryWaitsInTheQueueAndTheClientSeesOneNormalStream) {
  backend_.AddReplica();
  backend_.SetReady(1, false, "draining");
  backend_.SetReplicaScript(0, Fails(absl::UnavailableError("replica 0 is draining")));
  backend_.SetReplicaScript(1, Answers("a</think>bc"));
  auto pending = PostAsync("/v1/chat/completions", ChatBody(true));
  // Replica 0 failed it; replica 1 is not ready yet: back in the queue.
  ASSERT_TRUE(WaitFor([&] { return gateway_->queued() == 1 && backend_.requests().size() == 1; }));
  backend_.SetReady(1, true);
  testing::HttpResult r = pending.get();
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> events = r.Events();
  ASSERT_GE(events.size(), 3u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string reasoning, content, finish;
  int roles = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json c = Json::parse(events[i]);
    ASSERT_FALSE(c.contains("error")) << events[i];
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("role")) ++roles;
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(roles, 1);
  EXPECT_EQ(reasoning, "a");
  EXPECT_EQ(content, "bc");
  EXPECT_EQ(finish, "stop");
  auto requests = backend_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].first, 1);
}

TEST_F(GatewayTest, NonStreamedTokensOfAFailedAttemptAreDiscardedOnRetry) {
  // Nothing of a non-streamed answer has reached the client before the end: a replica that
  // failed after some tokens is retried, and only the new attempt's text is answered.
  backend_.AddReplica();
  backend_.SetReplicaScript(
      0, Fails(absl::UnavailableError("replica 0: rank 1 died"), "</think>partial"));
  backend_.SetReplicaScript(1, Answers("</think>whole"));
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody());
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "whole");
  EXPECT_EQ(j["usage"]["completion_tokens"], Ids("</think>whole").size());
  EXPECT_EQ(backend_.requests().size(), 2u);
}

TEST_F(GatewayTest, StreamFailureAfterTheFirstTokenIsNotRetried) {
  backend_.AddReplica();
  backend_.SetReplicaScript(
      0, Fails(absl::UnavailableError("replica 0: rank 1 died"), "</think>partial"));
  backend_.SetReplicaScript(1, Answers("</think>never"));
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody(true));
  ASSERT_EQ(r.status, 200);
  std::vector<std::string> events = r.Events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  Json error = Json::parse(events[events.size() - 2]);
  EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr("rank 1 died"));
  EXPECT_EQ(StreamedContent(r), "partial");
  EXPECT_EQ(backend_.requests().size(), 1u);
  EXPECT_THAT(Get("/metrics").body,
              HasSubstr("glmctl_gateway_request_retries_total{model_name=\"tiny-chat\"} 0\n"));
}

TEST_F(GatewayTest, RetriesAreBoundedByTheNumberOfReplicas) {
  backend_.AddReplica();
  backend_.AddReplica();
  backend_.SetScript(Fails(absl::UnavailableError("draining")));
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody());
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_THAT(r.body, HasSubstr("draining"));
  auto requests = backend_.requests();
  ASSERT_EQ(requests.size(), 3u);  // each replica once
  std::set<int> replicas;
  for (const auto& [replica, params] : requests) replicas.insert(replica);
  EXPECT_EQ(replicas, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(gateway_->in_flight(), 0);
  EXPECT_EQ(gateway_->queued(), 0);
  EXPECT_THAT(Get("/metrics").body,
              HasSubstr("glmctl_gateway_request_retries_total{model_name=\"tiny-chat\"} 2\n"));
}

// The only replica was leaving service (draining for a restart) when the request reached it: the
// request waits in the queue and the replica takes it once it serves again.
TEST_F(GatewayTest, TheOnlyReplicaLeavingServiceTakesTheRequestWhenItIsBack) {
  backend_.SetReplicaScript(
      0, Fails(absl::FailedPreconditionError("its shard is SHARD_STATE_DRAINING, not Running")));
  auto pending = PostAsync("/v1/chat/completions", ChatBody());
  ASSERT_TRUE(WaitFor([&] { return backend_.requests().size() == 1 && gateway_->queued() == 1; }));
  backend_.SetReplicaScript(0, Answers("</think>back"));
  testing::HttpResult r = pending.get();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["message"]["content"], "back");
  auto requests = backend_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].first, 0);
}

TEST_F(GatewayTest, RetriesOnAReplicaLeavingServiceAreBounded) {
  backend_.SetScript(Fails(absl::FailedPreconditionError("its shard is SHARD_STATE_DRAINING")));
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody());
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_THAT(r.body, HasSubstr("DRAINING"));
  EXPECT_EQ(backend_.requests().size(), 4u);  // the attempt, then 3 retries
  EXPECT_EQ(gateway_->in_flight(), 0);
  EXPECT_EQ(gateway_->queued(), 0);
}

TEST_F(GatewayTest, RetryWithTheQueueOffFailsWhenNoOtherReplicaIsReady) {
  queue_timeout_ = std::chrono::milliseconds(0);
  Start(nullptr);
  backend_.AddReplica();
  backend_.SetReady(1, false);
  backend_.SetReplicaScript(0, Fails(absl::UnavailableError("replica 0 is draining")));
  testing::HttpResult r = Post("/v1/chat/completions", ChatBody());
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.Header("retry-after"), "5");
  EXPECT_THAT(r.body, HasSubstr("replica 0 failed the request before its first token"));
  EXPECT_THAT(r.body, HasSubstr("replica 1 is failed"));
  EXPECT_EQ(backend_.requests().size(), 1u);
}

}  // namespace
}  // namespace glm::gateway
