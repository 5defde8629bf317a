// The gateway's routes over a real HTTP server on loopback and a scripted replica backend: the
// OpenAI shapes (JSON and SSE), the GLM parsers in the loop, errors and their statuses, API keys,
// health, metrics, and a disconnecting client cancelling its generation.
#include "controller/gateway/gateway.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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
    gateway_ = std::make_unique<Gateway>(options, *model, &backend_, std::move(keys), &metrics_,
                                         Clock::Real());
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

}  // namespace
}  // namespace glm::gateway
