#include "controller/gateway/gateway.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "controller/gateway/openai/ids.h"
#include "controller/gateway/openai/output_parser.h"
#include "controller/gateway/openai/requests.h"
#include "controller/gateway/openai/responses.h"
#include "controller/gateway/openai/stop_matcher.h"

namespace glm::gateway {
namespace {

using Json = nlohmann::ordered_json;
constexpr char kJsonType[] = "application/json";

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// An engine or transport error as the client sees it: 503 when the replica is unavailable,
// draining or not running (the client may retry), 400 for a request the engine refused, 500
// otherwise.
openai::ApiError FromStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return openai::BadRequest("", std::string(status.message()));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kFailedPrecondition:
      return openai::Unavailable(std::string(status.message()));
    default:
      return openai::InternalError(std::string(status.message()));
  }
}

// The text of one token as logprobs show it (special tokens kept).
std::string TokenText(const tokenizer::Tokenizer& tok, int32_t id) {
  return tok.Decode(std::vector<int32_t>{id}, /*skip_special_tokens=*/false);
}

// A replica that failed, is draining or is not running: the same request may succeed on another.
bool ReplicaFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kFailedPrecondition;
}

// The head refused the request because its replica is leaving service (draining or stopping: the
// agent answers FAILED_PRECONDITION before running anything). The replica comes back after its
// restart, so the request waits for it in the queue instead of excluding it.
bool ReplicaLeaving(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition;
}
// Retries after a replica leaving service refused the request, beyond one attempt per replica;
// the refusing replica is not picked for that request for kLeavingCooldown (the time the
// controller's replica state takes to show it draining), then again once it is ready.
constexpr int kMaxLeavingRetries = 3;
constexpr auto kLeavingCooldown = std::chrono::milliseconds(250);

double Seconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

// "replica 0 is failed: <reason>; replica 1 is pending" for the replicas that are not ready, or
// what to do when the cluster has none.
std::string NotReadyText(const std::vector<ReplicaInfo>& replicas) {
  std::vector<std::string> not_ready;
  for (const ReplicaInfo& info : replicas) {
    if (info.ready) continue;
    not_ready.push_back(absl::StrCat("replica ", info.index, " is ", info.state,
                                     info.reason.empty() ? "" : ": ", info.reason));
  }
  if (replicas.empty()) return "the cluster has none; run `glmctl up`";
  if (not_ready.empty()) return "every ready replica already failed this request";
  return absl::StrJoin(not_ready, "; ");
}

constexpr int kRetryAfterS = 5;  // Retry-After of the gateway's own 503s

}  // namespace

// One generation in flight: the HTTP exchange, the replica call and the text pipeline between
// them (detokenizer → stop strings → reasoning / tool-call parser → JSON). Callbacks come from
// the backend's threads one at a time; OnClose from an I/O thread; `mu` orders them.
struct Gateway::Request : std::enable_shared_from_this<Gateway::Request> {
  Gateway* gateway = nullptr;
  std::shared_ptr<http::Exchange> exchange;
  std::string route;  // "/v1/chat/completions" | "/v1/completions"
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  std::optional<int> logprobs;
  openai::ResponseMeta meta;
  GenerateParams params;
  std::string echo_text;  // completions with echo: the prompt's text, sent first
  std::set<int32_t> hidden_ids;  // stop ids: the engine emits them, the client sees no text
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  std::unique_ptr<openai::StopMatcher> stop;
  std::unique_ptr<openai::OutputParser> parser;  // chat only
  std::unique_ptr<RequestTimer> timer;        // from the first dispatch
  std::vector<std::string> stop_strings;     // to rebuild `stop` for a retry
  openai::ParserOptions parser_options;      // chat: to rebuild `parser` for a retry
  uint64_t seq = 0;                          // arrival order: the queue's order
  Clock::TimePoint arrived{};

  // Queue state, guarded by gateway->queue_mu_.
  bool queued = false;
  Clock::TimePoint queued_at{};
  Clock::TimePoint deadline{};
  // Retry state. Written only while the request is neither queued nor running (Start, Dispatch,
  // the retry in OnDone); queue_mu_ orders those writes before the dispatcher's reads.
  std::set<int> failed_replicas;             // replicas that failed it: never picked again
  int attempts = 0;                          // generations started
  int retried_attempt = 0;                   // under mu: the last attempt that ended in a retry
  int leaving_retries = 0;                   // retries after a replica leaving service refused it
  std::map<int, Clock::TimePoint> leaving_until;  // replicas that refused it so, not picked until
  int num_replicas = 0;                      // replicas in the cluster at the last pick
  absl::Status last_error;                   // why the last replica failed it
  bool started = false;                      // first dispatch done (timer, SSE head)

  std::mutex mu;
  std::shared_ptr<http::Stream> sse;     // stream only
  std::shared_ptr<GenerateCall> call;
  bool client_gone = false;
  bool stopped_by_string = false;
  bool done = false;
  bool delivered = false;  // generated text or logprobs went to the client (stream only)
  int replica = -1;
  int64_t reserved_tokens = 0;
  int completion_tokens = 0;
  std::string text;                          // completions: the whole text (non-stream)
  int64_t text_offset = 0;                   // completions: code points sent so far
  std::vector<openai::TokenLogprob> logprob_log;  // non-stream: every token's logprobs

  // New tokens from the replica.
  void OnTokens(const std::vector<int32_t>& ids, const std::vector<TokenLogprob>& lps) {
    std::shared_ptr<GenerateCall> cancel;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done || stopped_by_string || client_gone) return;
      timer->OnTokens();
      completion_tokens += static_cast<int>(ids.size());
      std::string piece;
      std::vector<openai::TokenLogprob> chunk_logprobs;
      const tokenizer::Tokenizer& tok = *gateway->model_.tokenizer;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (hidden_ids.count(ids[i]) == 0) piece += decoder->Step(ids[i]);
        if (logprobs && i < lps.size()) {
          openai::TokenLogprob lp;
          lp.token = TokenText(tok, ids[i]);
          lp.logprob = lps[i].logprob;
          for (const auto& [id, value] : lps[i].top) {
            lp.top.push_back({TokenText(tok, id), value});
          }
          chunk_logprobs.push_back(std::move(lp));
        }
      }
      openai::StopMatcher::Result visible = stop->Feed(piece);
      if (visible.stopped) {
        stopped_by_string = true;
        cancel = call;
      }
      Emit(visible.text, std::move(chunk_logprobs));
    }
    if (cancel) cancel->Cancel();  // outside mu: the backend may call back
  }

  // Sends (stream) or keeps (non-stream) visible text and its tokens' logprobs.
  void Emit(const std::string& visible, std::vector<openai::TokenLogprob> chunk_logprobs) {
    if (chat) {
      openai::OutputDelta delta = parser->Feed(visible);
      if (!stream) {
        for (auto& lp : chunk_logprobs) logprob_log.push_back(std::move(lp));
        return;
      }
      if (delta.empty() && chunk_logprobs.empty()) return;
      Json lp_json = logprobs ? openai::ChatLogprobsJson(chunk_logprobs) : Json();
      delivered = true;
      sse->Send(openai::SseData(openai::ChatChunkJson(meta, delta, std::nullopt, lp_json)));
      return;
    }
    if (!stream) {
      text += visible;
      for (auto& lp : chunk_logprobs) logprob_log.push_back(std::move(lp));
      return;
    }
    if (visible.empty() && chunk_logprobs.empty()) return;
    openai::CompletionChoice choice;
    choice.text = visible;
    if (logprobs) choice.logprobs = openai::CompletionLogprobsJson(chunk_logprobs, text_offset);
    text_offset += CodePoints(visible);
    delivered = true;
    sse->Send(openai::SseData(openai::CompletionChunkJson(meta, choice)));
  }

  static int64_t CodePoints(std::string_view s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  // Under mu: the replica failed the request before anything reached the client, and another
  // replica may still take it.
  bool MayRetry(const absl::Status& status) const {
    if (!ReplicaFailure(status) || delivered || stopped_by_string || client_gone ||
        !gateway->admitting_.load()) {
      return false;
    }
    return attempts < num_replicas ||
           (ReplicaLeaving(status) && leaving_retries < kMaxLeavingRetries);
  }

  // Under mu: back to the state before the first token, for a retry on another replica.
  void ResetPipeline() {
    decoder = std::make_unique<tokenizer::StreamDecoder>(*gateway->model_.tokenizer);
    stop = std::make_unique<openai::StopMatcher>(stop_strings);
    if (chat) parser = std::make_unique<openai::OutputParser>(parser_options);
    completion_tokens = 0;
    text.clear();
    logprob_log.clear();
  }

  // The replica finished (or failed, or was cancelled).
  void OnDone(const absl::Status& status, const std::string& engine_reason) {
    std::unique_lock<std::mutex> lock(mu);
    if (done) return;
    if (MayRetry(status)) {
      gateway->Release(replica, reserved_tokens);
      if (ReplicaLeaving(status)) {
        ++leaving_retries;
        leaving_until[replica] = gateway->clock_->Now() + kLeavingCooldown;
      } else {
        failed_replicas.insert(replica);
      }
      last_error = status;
      retried_attempt = attempts;
      call.reset();
      ResetPipeline();
      GLM_LOG_WARN("gateway retry request={} failed_replica={} attempt={} replicas={} error={}",
                   meta.id, replica, attempts, num_replicas, status.ToString());
      lock.unlock();
      gateway->metrics_->OnRetry();
      gateway->Requeue(shared_from_this());
      return;
    }
    done = true;
    gateway->Release(replica, reserved_tokens);
    // The text still held: the decoder's incomplete bytes, then the stop matcher's tail (a stop
    // string may complete only there).
    std::string tail;
    if (status.ok() && !stopped_by_string) {
      openai::StopMatcher::Result last = stop->Feed(decoder->Flush());
      tail = last.text;
      if (!last.stopped) tail += stop->Flush();
      stopped_by_string = stop->stopped();
    }
    std::string reason = stopped_by_string ? "stop" : engine_reason;
    if (reason.empty()) reason = status.ok() ? "stop" : "error";
    timer->Finish(status.ok() ? reason : "error",
                  static_cast<int64_t>(params.prompt_token_ids.size()), completion_tokens);
    if (client_gone) return;  // nobody to answer
    if (!status.ok()) {
      const openai::ApiError error = FromStatus(status);
      if (stream) {
        sse->Send(openai::SseError(error));
        sse->Send(openai::SseDone());
        sse->Finish();
        gateway->metrics_->OnHttp(route, 200);
      } else {
        gateway->ReplyError(exchange, route, error);
      }
      return;
    }
    const openai::Usage usage{static_cast<int64_t>(params.prompt_token_ids.size()),
                              completion_tokens};
    if (chat) {
      openai::OutputDelta delta = parser->Feed(tail);
      openai::OutputDelta end = parser->Finish();
      delta.reasoning += end.reasoning;
      delta.content += end.content;
      for (auto& c : end.tool_calls) delta.tool_calls.push_back(std::move(c));
      if (parser->saw_tool_calls() && reason == "stop") reason = "tool_calls";
      if (stream) {
        if (!delta.empty()) sse->Send(openai::SseData(openai::ChatChunkJson(meta, delta)));
        sse->Send(openai::SseData(
            openai::ChatChunkJson(meta, openai::OutputDelta{}, std::string_view(reason))));
        if (include_usage) sse->Send(openai::SseData(openai::ChatUsageChunkJson(meta, usage)));
        sse->Send(openai::SseDone());
        sse->Finish();
        gateway->metrics_->OnHttp(route, 200);
        return;
      }
      Json lp_json = logprobs ? openai::ChatLogprobsJson(logprob_log) : Json();
      openai::ChatChoice choice = openai::ChatChoiceFromParser(*parser, reason, lp_json);
      gateway->Reply(exchange, route, 200,
                     openai::DumpJson(openai::ChatCompletionJson(meta, {choice}, usage)));
      return;
    }
    if (stream) {
      openai::CompletionChoice choice;
      choice.text = tail;
      choice.finish_reason = reason;
      sse->Send(openai::SseData(openai::CompletionChunkJson(meta, choice)));
      if (include_usage) {
        sse->Send(openai::SseData(openai::CompletionUsageChunkJson(meta, usage)));
      }
      sse->Send(openai::SseDone());
      sse->Finish();
      gateway->metrics_->OnHttp(route, 200);
      return;
    }
    openai::CompletionChoice choice;
    choice.text = echo_text + text + tail;
    choice.finish_reason = reason;
    if (logprobs) {
      choice.logprobs =
          openai::CompletionLogprobsJson(logprob_log, CodePoints(echo_text));
    }
    gateway->Reply(exchange, route, 200,
                   openai::DumpJson(openai::CompletionJson(meta, {choice}, usage)));
  }

  // Ends a request that holds no replica (queue timeout, shutdown, no replica to retry on): the
  // error as a 503 with Retry-After, or as an SSE error frame once the stream has started.
  void Fail(const openai::ApiError& error, int retry_after_s) {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    done = true;
    if (timer) {
      timer->Finish("error", static_cast<int64_t>(params.prompt_token_ids.size()),
                    completion_tokens);
    }
    if (client_gone) return;
    if (!sse) return gateway->ReplyError(exchange, route, error, retry_after_s);
    sse->Send(openai::SseError(error));
    sse->Send(openai::SseDone());
    sse->Finish();
    gateway->metrics_->OnHttp(route, 200);
  }

  // The client went away: cancel the generation on the replica, or leave the queue.
  void OnClientGone() {
    std::shared_ptr<GenerateCall> cancel;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      client_gone = true;
      cancel = call;
    }
    if (cancel) cancel->Cancel();
    gateway->Unqueue(this);
  }
};

Gateway::Gateway(GatewayOptions options, ModelFiles model, ReplicaBackend* backend,
                 std::shared_ptr<ApiKeys> api_keys, GatewayMetrics* metrics, Clock* clock)
    : options_(std::move(options)),
      model_(std::move(model)),
      backend_(backend),
      api_keys_(std::move(api_keys)),
      metrics_(metrics),
      clock_(clock),
      created_unix_(UnixNow()) {
  dispatcher_ = std::thread([this] { DispatchLoop(); });
  backend_->SetReadinessListener([this] {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_wake_ = true;
    }
    queue_cv_.notify_all();
  });
}

Gateway::~Gateway() {
  backend_->SetReadinessListener(nullptr);
  StopAdmitting();  // answers what still waits
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  dispatcher_.join();
}

void Gateway::Handle(std::shared_ptr<http::Exchange> exchange) {
  const http::Request& req = exchange->request;
  const std::string& path = req.target;
  struct Route {
    const char* path;
    const char* method;
    void (Gateway::*handler)(const std::shared_ptr<http::Exchange>&);
    bool needs_key;
  };
  static const Route kRoutes[] = {
      {"/v1/chat/completions", "POST", &Gateway::HandleChat, true},
      {"/v1/completions", "POST", &Gateway::HandleCompletion, true},
      {"/v1/models", "GET", &Gateway::HandleModels, true},
      {"/tokenize", "POST", &Gateway::HandleTokenize, true},
      {"/detokenize", "POST", &Gateway::HandleDetokenize, true},
      {"/health", "GET", &Gateway::HandleHealth, false},
      {"/metrics", "GET", &Gateway::HandleMetrics, false},
      {"/version", "GET", &Gateway::HandleVersion, false},
  };
  for (const Route& r : kRoutes) {
    if (path != r.path) continue;
    const bool needs_text = r.needs_key && path != "/v1/models";
    if (req.method != r.method && !(req.method == "HEAD" && std::string(r.method) == "GET")) {
      ReplyError(exchange, path,
                 openai::MakeError(405, absl::StrCat("method ", req.method, " is not allowed on ",
                                                     path, "; use ", r.method)));
      return;
    }
    if (r.needs_key && !Authorized(exchange)) return;
    if (needs_text && !model_.tokenizer) {
      ReplyError(exchange, path,
                 openai::InternalError(absl::StrCat("the gateway cannot tokenize: ",
                                                    model_.missing)));
      return;
    }
    (this->*r.handler)(exchange);
    return;
  }
  ReplyError(exchange, "other",
             openai::NotFound("", absl::StrCat("no route ", req.method, " ", path,
                                               "; the API is under /v1 (chat/completions, "
                                               "completions, models)")));
}

bool Gateway::Authorized(const std::shared_ptr<http::Exchange>& exchange) {
  if (!api_keys_) return true;
  const std::string* auth = exchange->request.Header("authorization");
  if (auth != nullptr) {
    const ApiKeys::AuthResult result = api_keys_->Authenticate(*auth, clock_->Now());
    if (result.outcome != ApiKeys::AuthResult::Outcome::kDenied) {
      metrics_->OnKeyRequest(result.key_name);
    }
    if (result.outcome == ApiKeys::AuthResult::Outcome::kAllowed) return true;
    if (result.outcome == ApiKeys::AuthResult::Outcome::kRateLimited) {
      metrics_->OnKeyRateLimited(result.key_name);
      ReplyError(exchange, exchange->request.target,
                 openai::RateLimited(absl::StrCat("API key '", result.key_name,
                                                  "' is over its rate limit; retry after the "
                                                  "Retry-After delay")),
                 result.retry_after_s);
      return false;
    }
  }
  openai::ApiError error = openai::MakeError(
      401, auth == nullptr ? "missing API key: send the header 'Authorization: Bearer <key>'"
                           : "invalid API key");
  http::Response resp;
  resp.status = 401;
  resp.headers = {{"Content-Type", kJsonType}, {"WWW-Authenticate", "Bearer"}};
  resp.body = openai::ErrorBody(error);
  metrics_->OnHttp(exchange->request.target, 401);
  exchange->Respond(std::move(resp));
  return false;
}

bool Gateway::ModelMatches(const std::string& model,
                           const std::shared_ptr<http::Exchange>& exchange,
                           const std::string& route) {
  if (model.empty() || model == options_.served_name) return true;
  ReplyError(exchange, route,
             openai::NotFound("model", absl::StrCat("The model `", model,
                                                    "` does not exist. This gateway serves `",
                                                    options_.served_name, "`.")));
  return false;
}

void Gateway::Reply(const std::shared_ptr<http::Exchange>& exchange, const std::string& route,
                    int status, std::string body, const std::string& content_type) {
  http::Response resp;
  resp.status = status;
  resp.headers = {{"Content-Type", content_type}};
  resp.body = std::move(body);
  metrics_->OnHttp(route, status);
  exchange->Respond(std::move(resp));
}

void Gateway::ReplyError(const std::shared_ptr<http::Exchange>& exchange,
                         const std::string& route, const openai::ApiError& error,
                         int retry_after_s) {
  http::Response resp;
  resp.status = error.status;
  resp.headers = {{"Content-Type", kJsonType}};
  if (retry_after_s > 0) resp.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  resp.body = openai::ErrorBody(error);
  metrics_->OnHttp(route, error.status);
  exchange->Respond(std::move(resp));
}

absl::StatusOr<std::string> Gateway::RenderChat(const Json& messages, const Json& tools,
                                                const Json& kwargs, bool add_generation_prompt,
                                                bool continue_final_message) const {
  if (!model_.chat_template) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint at ", model_.dir,
        " has no chat template (chat_template.jinja or tokenizer_config.json chat_template); "
        "use /v1/completions with a rendered prompt"));
  }
  Json context = Json::object();
  // As transformers builds it: tools and documents always present (null when absent), the
  // special tokens and chat_template_kwargs at the top level.
  context["messages"] = messages;
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt && !continue_final_message;
  context["bos_token"] = model_.bos_token;
  context["eos_token"] = model_.eos_token;
  if (kwargs.is_object()) {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) context[it.key()] = it.value();
  }
  absl::StatusOr<std::string> rendered = model_.chat_template->Render(context);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the chat template refused the messages: ", rendered.status().message()));
  }
  if (continue_final_message) {
    // As transformers does: cut the rendering right after the final message's content, so the
    // model continues it instead of opening a new turn.
    const Json& last = messages.back();
    std::string content = last.contains("content") && last["content"].is_string()
                              ? last["content"].get<std::string>()
                              : "";
    const size_t end = content.find_last_not_of(" \t\r\n");
    content = end == std::string::npos ? "" : content.substr(0, end + 1);
    const size_t at = content.empty() ? std::string::npos : rendered->rfind(content);
    if (at == std::string::npos) {
      return absl::InvalidArgumentError(
          "continue_final_message: the final message's content does not appear in the "
          "rendered prompt; this template cannot continue it");
    }
    rendered->resize(at + content.size());
  }
  return rendered;
}

std::optional<openai::ApiError> Gateway::FitTokens(GenerateParams* params,
                                                   std::optional<int> max_tokens,
                                                   const char* prompt_param) const {
  const int64_t prompt_len = static_cast<int64_t>(params->prompt_token_ids.size());
  const int64_t limit = options_.max_model_len;
  if (prompt_len == 0) return openai::BadRequest(prompt_param, "the prompt is empty");
  if (prompt_len >= limit) {
    return openai::BadRequest(
        prompt_param,
        absl::StrCat("This model's maximum context length is ", limit,
                     " tokens. However, your request has ", prompt_len,
                     " input tokens. Please reduce the length of the input."));
  }
  const int64_t room = limit - prompt_len;
  const int64_t wanted = max_tokens ? *max_tokens : room;
  if (wanted > room) {
    return openai::BadRequest(
        "max_tokens",
        absl::StrCat("This model's maximum context length is ", limit,
                     " tokens. However, you requested ", prompt_len + wanted, " tokens (",
                     prompt_len, " in the input, ", wanted,
                     " in the completion). Please reduce the length of the input or of "
                     "max_tokens."));
  }
  params->max_tokens = static_cast<int>(wanted);
  return std::nullopt;
}

void Gateway::FillSampling(const openai::SamplingOptions& s, GenerateParams* params) const {
  params->temperature = s.temperature;
  params->top_p = s.top_p;
  params->top_k = s.top_k;
  params->seed = s.seed;
  params->min_tokens = s.min_tokens;
  params->ignore_eos = s.ignore_eos;
  params->logprobs = s.logprobs;
  params->mtp_draft_tokens = s.mtp_draft_tokens;
  params->stop_token_ids = model_.stop_token_ids;
  for (int32_t id : s.stop_token_ids) params->stop_token_ids.push_back(id);
}

void Gateway::HandleChat(const std::shared_ptr<http::Exchange>& exchange) {
  const std::string route = "/v1/chat/completions";
  openai::Result<openai::ChatRequest> parsed = openai::ParseChatRequest(exchange->request.body);
  if (!parsed.ok()) return ReplyError(exchange, route, parsed.error());
  const openai::ChatRequest& req = parsed.value();
  if (!ModelMatches(req.model, exchange, route)) return;
  absl::StatusOr<std::string> prompt =
      RenderChat(req.messages, req.tools, req.chat_template_kwargs, req.add_generation_prompt,
                 req.continue_final_message);
  if (!prompt.ok()) {
    return ReplyError(exchange, route, openai::BadRequest("messages", std::string(prompt.status().message())));
  }
  auto r = std::make_shared<Request>();
  r->gateway = this;
  r->exchange = exchange;
  r->route = route;
  r->chat = true;
  r->params.prompt_token_ids = model_.tokenizer->Encode(*prompt, /*add_special_tokens=*/false);
  if (auto error = FitTokens(&r->params, req.sampling.max_tokens, "messages")) {
    return ReplyError(exchange, route, *error);
  }
  FillSampling(req.sampling, &r->params);
  openai::ParserOptions parser;
  parser.reasoning = true;
  // Generation starts inside the reasoning block when the prompt opened it (spec §3.2).
  std::string_view rendered = *prompt;
  while (!rendered.empty() && (rendered.back() == '\n' || rendered.back() == ' ')) {
    rendered.remove_suffix(1);
  }
  parser.starts_in_reasoning = rendered.size() >= 7 && rendered.substr(rendered.size() - 7) == "<think>";
  parser.tools = req.tools_enabled();
  parser.tools_schema = req.tools;
  parser.parallel_tool_calls = req.parallel_tool_calls;
  r->parser_options = parser;
  r->parser = std::make_unique<openai::OutputParser>(std::move(parser));
  r->stream = req.sampling.stream;
  r->include_usage = req.sampling.include_usage;
  r->logprobs = req.sampling.logprobs;
  r->meta = {openai::NewId("chatcmpl-"), UnixNow(), options_.served_name};
  r->stop_strings = req.sampling.stop;
  r->stop = std::make_unique<openai::StopMatcher>(req.sampling.stop);
  Start(std::move(r));
}

void Gateway::HandleCompletion(const std::shared_ptr<http::Exchange>& exchange) {
  const std::string route = "/v1/completions";
  openai::Result<openai::CompletionRequest> parsed =
      openai::ParseCompletionRequest(exchange->request.body);
  if (!parsed.ok()) return ReplyError(exchange, route, parsed.error());
  const openai::CompletionRequest& req = parsed.value();
  if (!ModelMatches(req.model, exchange, route)) return;
  auto r = std::make_shared<Request>();
  r->gateway = this;
  r->exchange = exchange;
  r->route = route;
  const tokenizer::Tokenizer& tok = *model_.tokenizer;
  if (const auto* text = std::get_if<std::string>(&req.prompt)) {
    r->params.prompt_token_ids = tok.Encode(*text, /*add_special_tokens=*/true);
    if (req.echo) r->echo_text = *text;
  } else {
    const auto& ids = std::get<std::vector<int32_t>>(req.prompt);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= tok.MaxIdPlusOne()) {
        return ReplyError(exchange, route,
                          openai::BadRequest(absl::StrCat("prompt[", i, "]"),
                                             absl::StrCat("token id ", ids[i],
                                                          " is outside the vocabulary (ids < ",
                                                          tok.MaxIdPlusOne(), ")")));
      }
    }
    r->params.prompt_token_ids = ids;
    if (req.echo) r->echo_text = tok.Decode(ids, /*skip_special_tokens=*/false);
  }
  if (auto error = FitTokens(&r->params, req.sampling.max_tokens, "prompt")) {
    return ReplyError(exchange, route, *error);
  }
  FillSampling(req.sampling, &r->params);
  r->stream = req.sampling.stream;
  r->include_usage = req.sampling.include_usage;
  r->logprobs = req.sampling.logprobs;
  r->meta = {openai::NewId("cmpl-"), UnixNow(), options_.served_name};
  r->stop_strings = req.sampling.stop;
  r->stop = std::make_unique<openai::StopMatcher>(req.sampling.stop);
  Start(std::move(r));
}

void Gateway::Start(std::shared_ptr<Request> r) {
  const std::string shutting_down = "the gateway is shutting down; retry on another one";
  if (!admitting_.load()) {
    metrics_->OnUnavailable(GatewayMetrics::kUnavailableShuttingDown);
    return ReplyError(r->exchange, r->route, openai::Unavailable(shutting_down), kRetryAfterS);
  }
  if (in_flight_.load() >= options_.max_in_flight) {
    return ReplyError(r->exchange, r->route,
                      openai::RateLimited(absl::StrCat(
                          "the gateway has ", options_.max_in_flight,
                          " requests in flight, its limit; retry after the Retry-After delay")),
                      1);
  }
  r->seq = next_seq_.fetch_add(1);
  r->arrived = clock_->Now();
  // One slot for the whole life of the request: queued (leave the queue) or running (cancel).
  std::weak_ptr<Request> weak = r;
  r->exchange->OnClose([weak] {
    if (auto req = weak.lock()) req->OnClientGone();
  });
  const std::vector<ReplicaInfo> replicas = backend_->Replicas();
  r->num_replicas = static_cast<int>(replicas.size());
  const bool queue_on = options_.queue_timeout.count() > 0;
  enum class Outcome { kStart, kQueued, kQueueFull, kNoReplica, kShuttingDown };
  Outcome outcome;
  int replica = -1;
  size_t waiting = 0;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    waiting = queue_.size();
    if (!admitting_.load()) {
      outcome = Outcome::kShuttingDown;
    } else if (((queue_.empty() && dispatching_ == 0) || !queue_on) &&
               (replica = Pick(*r, replicas)) >= 0) {
      // Nobody waits ahead of it (FIFO): straight to the replica.
      Reserve(*r, replica);
      outcome = Outcome::kStart;
    } else if (!queue_on) {
      outcome = Outcome::kNoReplica;
    } else if (waiting >= static_cast<size_t>(std::max(options_.max_queued, 0))) {
      outcome = Outcome::kQueueFull;
    } else {
      r->queued = true;
      r->queued_at = r->arrived;
      r->deadline = r->arrived + options_.queue_timeout;
      queue_.push_back(r);  // newest arrival: the back
      queue_wake_ = true;
      metrics_->SetQueued(static_cast<int64_t>(queue_.size()));
      outcome = Outcome::kQueued;
    }
  }
  switch (outcome) {
    case Outcome::kStart:
      return Dispatch(r, replica);
    case Outcome::kQueued:
      queue_cv_.notify_all();
      return;
    case Outcome::kShuttingDown:
      metrics_->OnUnavailable(GatewayMetrics::kUnavailableShuttingDown);
      return ReplyError(r->exchange, r->route, openai::Unavailable(shutting_down), kRetryAfterS);
    case Outcome::kNoReplica:
      metrics_->OnUnavailable(GatewayMetrics::kUnavailableNoReplica);
      return ReplyError(
          r->exchange, r->route,
          openai::Unavailable(absl::StrCat(
              "no replica is ready to serve",
              replicas.empty() ? " (the cluster has none; run `glmctl up`)"
                               : absl::StrCat(": ", NotReadyText(replicas)))),
          kRetryAfterS);
    case Outcome::kQueueFull:
      metrics_->OnUnavailable(GatewayMetrics::kUnavailableQueueFull);
      return ReplyError(
          r->exchange, r->route,
          openai::Unavailable(absl::StrCat(
              "no replica is ready to serve (", NotReadyText(replicas),
              ") and the gateway's queue is full: ", waiting,
              " requests already wait for one (controller.gateway_queue.max_requests); retry "
              "after the Retry-After delay")),
          kRetryAfterS);
  }
}

int Gateway::Pick(const Request& r, const std::vector<ReplicaInfo>& replicas) {
  std::vector<ReplicaLoad> loads;
  const Clock::TimePoint now = clock_->Now();
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    for (const ReplicaInfo& info : replicas) {
      ReplicaLoad load;
      load.replica = info.index;
      const auto leaving = r.leaving_until.find(info.index);
      load.ready = info.ready && r.failed_replicas.count(info.index) == 0 &&
                   (leaving == r.leaving_until.end() || now >= leaving->second);
      load.outstanding_tokens = outstanding_tokens_[info.index];
      load.running_requests = info.requests_in_flight;
      loads.push_back(load);
    }
  }
  return router_.Pick(r.params.prompt_token_ids, loads);
}

void Gateway::Reserve(Request& r, int replica) {
  router_.Record(replica, r.params.prompt_token_ids);
  r.reserved_tokens =
      static_cast<int64_t>(r.params.prompt_token_ids.size()) + r.params.max_tokens;
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    outstanding_tokens_[replica] += r.reserved_tokens;
  }
  in_flight_.fetch_add(1);
}

void Gateway::Dispatch(const std::shared_ptr<Request>& r, int replica) {
  int attempt = 0;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    if (r->client_gone || r->done) {
      Release(replica, r->reserved_tokens);  // nobody to serve any more
      if (!r->done && r->timer) {
        r->timer->Finish("abort", static_cast<int64_t>(r->params.prompt_token_ids.size()), 0);
      }
      r->done = true;
      return;
    }
    r->replica = replica;
    attempt = ++r->attempts;
  }
  if (!r->started) {
    r->started = true;
    r->params.request_id = r->meta.id;
    for (int32_t id : r->params.stop_token_ids) r->hidden_ids.insert(id);
    r->decoder = std::make_unique<tokenizer::StreamDecoder>(*model_.tokenizer);
    // Counts from arrival: vLLM's queue time and TTFT include the wait in the gateway's queue.
    r->timer = std::make_unique<RequestTimer>(metrics_, clock_, r->arrived);
    if (r->stream) {
      r->sse = r->exchange->StartStream(200, {});
      if (r->chat) {
        r->sse->Send(openai::SseData(openai::ChatRoleChunkJson(r->meta)));
      } else if (!r->echo_text.empty()) {
        openai::CompletionChoice echo;
        echo.text = r->echo_text;
        r->text_offset = Request::CodePoints(r->echo_text);
        r->sse->Send(openai::SseData(openai::CompletionChunkJson(r->meta, echo)));
      }
    }
    r->timer->OnScheduled();
  }
  GenerateCallbacks callbacks;
  callbacks.on_tokens = [r](const std::vector<int32_t>& ids,
                            const std::vector<TokenLogprob>& lps) { r->OnTokens(ids, lps); };
  callbacks.on_done = [r](const absl::Status& status, const std::string& reason, int, int) {
    r->OnDone(status, reason);
  };
  std::shared_ptr<GenerateCall> call = backend_->Generate(replica, r->params, std::move(callbacks));
  bool cancel_now = false;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    // An attempt that failed at once may have been retried already: keep no stale call.
    if (r->attempts == attempt && r->retried_attempt != attempt && !r->done) r->call = call;
    cancel_now = (r->client_gone || r->stopped_by_string) && !r->done;
  }
  if (cancel_now) call->Cancel();
}

void Gateway::Requeue(const std::shared_ptr<Request>& r) {
  const Clock::TimePoint now = clock_->Now();
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (!admitting_.load()) {  // StopAdmitting has flushed the queue already
      lock.unlock();
      metrics_->OnUnavailable(GatewayMetrics::kUnavailableShuttingDown);
      return r->Fail(openai::Unavailable("the gateway is shutting down; retry on another one"),
                     kRetryAfterS);
    }
    r->queued = true;
    r->queued_at = now;
    // With the queue off (timeout 0) the dispatcher still tries the other replicas once.
    r->deadline = now + options_.queue_timeout;
    // Retries skip the max_queued bound (the request was admitted already) and keep their
    // arrival order: they go ahead of requests that arrived after them.
    auto at = std::upper_bound(
        queue_.begin(), queue_.end(), r->seq,
        [](uint64_t seq, const std::shared_ptr<Request>& q) { return seq < q->seq; });
    queue_.insert(at, r);
    queue_wake_ = true;
    metrics_->SetQueued(static_cast<int64_t>(queue_.size()));
  }
  queue_cv_.notify_all();
}

void Gateway::Unqueue(Request* r) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!r->queued) return;
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [r](const std::shared_ptr<Request>& q) { return q.get() == r; });
    if (it == queue_.end()) return;
    r->queued = false;
    metrics_->OnQueueLeft(Seconds(clock_->Now() - r->queued_at));
    queue_.erase(it);
    metrics_->SetQueued(static_cast<int64_t>(queue_.size()));
  }
  std::lock_guard<std::mutex> lock(r->mu);
  if (r->done) return;
  r->done = true;
  if (r->timer) {
    r->timer->Finish("abort", static_cast<int64_t>(r->params.prompt_token_ids.size()), 0);
  }
}

void Gateway::DispatchLoop() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (!stopping_) {
    if (queue_.empty()) {
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      continue;
    }
    queue_cv_.wait_for(lock, options_.queue_recheck, [this] { return stopping_ || queue_wake_; });
    if (stopping_) break;
    queue_wake_ = false;
    lock.unlock();
    PumpQueue();
    lock.lock();
  }
}

void Gateway::PumpQueue() {
  const std::vector<ReplicaInfo> replicas = backend_->Replicas();
  const Clock::TimePoint now = clock_->Now();
  std::vector<std::pair<std::shared_ptr<Request>, int>> start;
  std::vector<std::pair<std::shared_ptr<Request>, double>> expired;  // with the seconds waited
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    // In arrival order: an earlier request gets a ready replica first.
    for (auto it = queue_.begin(); it != queue_.end();) {
      Request& r = **it;
      r.num_replicas = static_cast<int>(replicas.size());
      const int replica = Pick(r, replicas);
      if (replica >= 0) {
        Reserve(r, replica);
        start.emplace_back(*it, replica);
      } else if (now >= r.deadline) {
        expired.emplace_back(*it, Seconds(now - r.queued_at));
      } else {
        ++it;
        continue;
      }
      r.queued = false;
      metrics_->OnQueueLeft(Seconds(now - r.queued_at));
      it = queue_.erase(it);
    }
    metrics_->SetQueued(static_cast<int64_t>(queue_.size()));
    dispatching_ += start.size();
  }
  for (const auto& [r, replica] : start) {
    Dispatch(r, replica);
    std::lock_guard<std::mutex> lock(queue_mu_);
    --dispatching_;
  }
  if (expired.empty()) return;
  const std::string not_ready = NotReadyText(replicas);
  for (const auto& [r, waited] : expired) {
    std::string message;
    if (!r->last_error.ok()) {
      message = absl::StrCat("replica ", r->replica, " failed the request before its first token (",
                             r->last_error.message(), ") and no other replica is ready");
    } else {
      message = "no replica became ready";
    }
    if (options_.queue_timeout.count() > 0) {
      absl::StrAppend(&message, absl::StrFormat(" within %.1f s (waited %.1f s in the gateway's "
                                                "queue; controller.gateway_queue.timeout_s)",
                                                Seconds(options_.queue_timeout), waited));
    }
    absl::StrAppend(&message, ": ", not_ready, "; retry after the Retry-After delay");
    metrics_->OnUnavailable(GatewayMetrics::kUnavailableQueueTimeout);
    r->Fail(openai::Unavailable(message), kRetryAfterS);
  }
}

void Gateway::StopAdmitting() {
  std::deque<std::shared_ptr<Request>> flushed;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    admitting_.store(false);
    flushed.swap(queue_);
    const Clock::TimePoint now = clock_->Now();
    for (const auto& r : flushed) {
      r->queued = false;
      metrics_->OnQueueLeft(Seconds(now - r->queued_at));
    }
    metrics_->SetQueued(0);
  }
  for (const auto& r : flushed) {
    metrics_->OnUnavailable(GatewayMetrics::kUnavailableShuttingDown);
    r->Fail(openai::Unavailable("the gateway is shutting down; retry on another one"),
            kRetryAfterS);
  }
}

int Gateway::queued() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return static_cast<int>(queue_.size());
}

void Gateway::Release(int replica, int64_t tokens) {
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    outstanding_tokens_[replica] -= tokens;
  }
  in_flight_.fetch_sub(1);
}

void Gateway::HandleTokenize(const std::shared_ptr<http::Exchange>& exchange) {
  const std::string route = "/tokenize";
  openai::Result<openai::TokenizeRequest> parsed =
      openai::ParseTokenizeRequest(exchange->request.body);
  if (!parsed.ok()) return ReplyError(exchange, route, parsed.error());
  const openai::TokenizeRequest& req = parsed.value();
  if (!ModelMatches(req.model, exchange, route)) return;
  std::vector<int32_t> tokens;
  if (req.is_chat()) {
    absl::StatusOr<std::string> prompt =
        RenderChat(req.messages, req.tools, req.chat_template_kwargs, req.add_generation_prompt,
                   req.continue_final_message);
    if (!prompt.ok()) {
      return ReplyError(exchange, route,
                        openai::BadRequest("messages", std::string(prompt.status().message())));
    }
    tokens = model_.tokenizer->Encode(*prompt, req.add_special_tokens);
  } else {
    tokens = model_.tokenizer->Encode(*req.prompt, req.add_special_tokens);
  }
  std::vector<std::string> strs;
  if (req.return_token_strs) {
    for (int32_t id : tokens) strs.push_back(model_.tokenizer->IdToToken(id).value_or(""));
  }
  Reply(exchange, route, 200,
        openai::DumpJson(openai::TokenizeJson(tokens, options_.max_model_len,
                                              req.return_token_strs ? &strs : nullptr)));
}

void Gateway::HandleDetokenize(const std::shared_ptr<http::Exchange>& exchange) {
  const std::string route = "/detokenize";
  openai::Result<openai::DetokenizeRequest> parsed =
      openai::ParseDetokenizeRequest(exchange->request.body);
  if (!parsed.ok()) return ReplyError(exchange, route, parsed.error());
  const openai::DetokenizeRequest& req = parsed.value();
  if (!ModelMatches(req.model, exchange, route)) return;
  const tokenizer::Tokenizer& tok = *model_.tokenizer;
  for (size_t i = 0; i < req.tokens.size(); ++i) {
    if (req.tokens[i] < 0 || req.tokens[i] >= tok.MaxIdPlusOne()) {
      return ReplyError(exchange, route,
                        openai::BadRequest(absl::StrCat("tokens[", i, "]"),
                                           absl::StrCat("token id ", req.tokens[i],
                                                        " is outside the vocabulary (0 <= id < ",
                                                        tok.MaxIdPlusOne(), ")")));
    }
  }
  Reply(exchange, route, 200,
        openai::DumpJson(openai::DetokenizeJson(tok.Decode(req.tokens, false))));
}

void Gateway::HandleModels(const std::shared_ptr<http::Exchange>& exchange) {
  openai::ModelCard card;
  card.id = options_.served_name;
  card.created = created_unix_;
  card.root = model_.dir;
  card.max_model_len = options_.max_model_len;
  Reply(exchange, "/v1/models", 200, openai::DumpJson(openai::ModelListJson({card})));
}

bool Gateway::Healthy(std::string* why) {
  std::vector<std::string> reasons;
  for (const ReplicaInfo& info : backend_->Replicas()) {
    if (info.ready) return true;
    reasons.push_back(absl::StrCat("replica ", info.index, " is ", info.state,
                                   info.reason.empty() ? "" : ": ", info.reason));
  }
  if (why != nullptr) {
    *why = reasons.empty() ? "the cluster has no replica; run `glmctl up`"
                           : absl::StrJoin(reasons, "; ");
  }
  return false;
}

void Gateway::HandleHealth(const std::shared_ptr<http::Exchange>& exchange) {
  std::string why;
  if (Healthy(&why)) return Reply(exchange, "/health", 200, "", "text/plain");
  ReplyError(exchange, "/health", openai::Unavailable(why), 5);
}

void Gateway::HandleMetrics(const std::shared_ptr<http::Exchange>& exchange) {
  std::map<int, std::string> replica_states;
  for (const ReplicaInfo& info : backend_->Replicas()) {
    replica_states[info.index] = info.state;
    metrics_->SetKvUsage(info.index, info.kv_cache_usage);
    if (info.spec.draft_tokens_per_step > 0) {
      metrics_->SetSpecDecode(info.index, info.spec.drafts, info.spec.draft_tokens,
                              info.spec.accepted_tokens, info.spec.accepted_per_position);
    }
  }
  metrics_->SetReplicaStates(replica_states);
  metrics_->SetNodeStates(backend_->NodeStates());
  // Requests the gateway has sent to replicas. Engine-side waiting is not known here (0); the
  // gateway's own queue is glmctl_gateway_requests_queued.
  metrics_->SetRunning(in_flight_.load());
  metrics_->SetWaiting(0);
  Reply(exchange, "/metrics", 200, metrics_->Render(), "text/plain; version=0.0.4");
}

void Gateway::HandleVersion(const std::shared_ptr<http::Exchange>& exchange) {
  Json body = Json::object();
  body["version"] = options_.version;
  Reply(exchange, "/version", 200, openai::DumpJson(body));
}

}  // namespace glm::gateway
