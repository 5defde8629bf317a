#include "controller/gateway/gateway.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// An engine or transport error as the client sees it: 503 when the replica is unavailable (the
// client may retry), 400 for a request the engine refused, 500 otherwise.
openai::ApiError FromStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return openai::BadRequest("", std::string(status.message()));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      return openai::Unavailable(std::string(status.message()));
    default:
      return openai::InternalError(std::string(status.message()));
  }
}

// The text of one token as logprobs show it (special tokens kept).
std::string TokenText(const tokenizer::Tokenizer& tok, int32_t id) {
  return tok.Decode(std::vector<int32_t>{id}, /*skip_special_tokens=*/false);
}

}  // namespace

// One generation in flight: the HTTP exchange, the replica call and the text pipeline between
// them (detokenizer → stop strings → reasoning / tool-call parser → JSON). Callbacks come from
// the backend's threads one at a time; OnClose from an I/O thread; `mu` orders them.
struct Gateway::Request {
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
  std::unique_ptr<RequestTimer> timer;

  std::mutex mu;
  std::shared_ptr<http::Stream> sse;     // stream only
  std::shared_ptr<GenerateCall> call;
  bool client_gone = false;
  bool stopped_by_string = false;
  bool done = false;
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
    sse->Send(openai::SseData(openai::CompletionChunkJson(meta, choice)));
  }

  static int64_t CodePoints(std::string_view s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  // The replica finished (or failed, or was cancelled).
  void OnDone(const absl::Status& status, const std::string& engine_reason) {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
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

  // The client went away: cancel the generation on the replica.
  void OnClientGone() {
    std::shared_ptr<GenerateCall> cancel;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      client_gone = true;
      cancel = call;
    }
    if (cancel) cancel->Cancel();
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
      created_unix_(UnixNow()) {}

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
  if (auth != nullptr && api_keys_->Check(*auth)) return true;
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
  r->parser = std::make_unique<openai::OutputParser>(std::move(parser));
  r->stream = req.sampling.stream;
  r->include_usage = req.sampling.include_usage;
  r->logprobs = req.sampling.logprobs;
  r->meta = {openai::NewId("chatcmpl-"), UnixNow(), options_.served_name};
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
  r->stop = std::make_unique<openai::StopMatcher>(req.sampling.stop);
  Start(std::move(r));
}

void Gateway::Start(std::shared_ptr<Request> r) {
  if (!admitting_.load()) {
    return ReplyError(r->exchange, r->route,
                      openai::Unavailable("the gateway is shutting down; retry on another one"),
                      5);
  }
  if (in_flight_.load() >= options_.max_in_flight) {
    return ReplyError(r->exchange, r->route,
                      openai::RateLimited(absl::StrCat(
                          "the gateway has ", options_.max_in_flight,
                          " requests in flight, its limit; retry after the Retry-After delay")),
                      1);
  }
  const std::vector<ReplicaInfo> replicas = backend_->Replicas();
  std::vector<ReplicaLoad> loads;
  std::vector<std::string> not_ready;
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    for (const ReplicaInfo& info : replicas) {
      ReplicaLoad load;
      load.replica = info.index;
      load.ready = info.ready;
      load.outstanding_tokens = outstanding_tokens_[info.index];
      load.running_requests = info.requests_in_flight;
      loads.push_back(load);
      if (!info.ready) {
        not_ready.push_back(absl::StrCat("replica ", info.index, " is ", info.state,
                                         info.reason.empty() ? "" : ": ", info.reason));
      }
    }
  }
  const int replica = router_.Pick(r->params.prompt_token_ids, loads);
  if (replica < 0) {
    return ReplyError(
        r->exchange, r->route,
        openai::Unavailable(absl::StrCat(
            "no replica is ready to serve",
            not_ready.empty() ? " (the cluster has none; run `glmctl up`)"
                              : absl::StrCat(": ", absl::StrJoin(not_ready, "; ")))),
        5);
  }
  router_.Record(replica, r->params.prompt_token_ids);
  r->replica = replica;
  r->reserved_tokens =
      static_cast<int64_t>(r->params.prompt_token_ids.size()) + r->params.max_tokens;
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    outstanding_tokens_[replica] += r->reserved_tokens;
  }
  in_flight_.fetch_add(1);
  r->params.request_id = r->meta.id;
  for (int32_t id : r->params.stop_token_ids) r->hidden_ids.insert(id);
  r->decoder = std::make_unique<tokenizer::StreamDecoder>(*model_.tokenizer);
  r->timer = std::make_unique<RequestTimer>(metrics_, clock_);
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
  std::weak_ptr<Request> weak = r;
  r->exchange->OnClose([weak] {
    if (auto req = weak.lock()) req->OnClientGone();
  });
  GenerateCallbacks callbacks;
  callbacks.on_tokens = [r](const std::vector<int32_t>& ids,
                            const std::vector<TokenLogprob>& lps) { r->OnTokens(ids, lps); };
  callbacks.on_done = [r](const absl::Status& status, const std::string& reason, int, int) {
    r->OnDone(status, reason);
  };
  r->timer->OnScheduled();
  std::shared_ptr<GenerateCall> call = backend_->Generate(replica, r->params, std::move(callbacks));
  bool cancel_now = false;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    r->call = call;
    cancel_now = (r->client_gone || r->stopped_by_string) && !r->done;
  }
  if (cancel_now) call->Cancel();
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
  }
  metrics_->SetReplicaStates(replica_states);
  metrics_->SetNodeStates(backend_->NodeStates());
  // Requests the gateway has sent to replicas. It holds none back: a request waits, if at all,
  // in its replica's scheduler.
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
