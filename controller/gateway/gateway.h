// The OpenAI-compatible API of glm-controller (../shared/specs/serving.md §4): the routes, each
// request's path from an HTTP body to token ids on a replica and back to JSON or SSE.
//
//   GET  /v1/models                     the served model
//   POST /v1/chat/completions           chat template → tokens → replica → parsers → JSON / SSE
//   POST /v1/completions                prompt text or ids → replica → text
//   POST /tokenize, /detokenize         vLLM's shapes
//   GET  /health                        200 when a replica is ready (progress heartbeat recent)
//   GET  /metrics                       Prometheus text, vLLM's metric names
//   GET  /version
//
// Handle runs on the HTTP server's I/O threads and never blocks: generation events arrive on the
// backend's threads and are written to the exchange from there. A client that disconnects from
// a stream cancels its request on the replica.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"
#include "controller/gateway/api_keys.h"
#include "controller/gateway/http/http_server.h"
#include "controller/gateway/metrics.h"
#include "controller/gateway/model_files.h"
#include "controller/gateway/openai/errors.h"
#include "controller/gateway/openai/requests.h"
#include "controller/gateway/replica_backend.h"
#include "controller/gateway/router.h"

namespace glm::gateway {

struct GatewayOptions {
  std::string served_name;     // model id in /v1/models and responses
  int max_model_len = 0;       // prompt + completion tokens per request
  std::string version;         // /version
  // Admission: requests in flight across the gateway beyond this answer 429 with Retry-After.
  int max_in_flight = 1024;
};

class Gateway {
 public:
  // `backend` outlives the gateway; `api_keys` may be null (no key required). `metrics` and
  // `clock` too outlive it.
  Gateway(GatewayOptions options, ModelFiles model, ReplicaBackend* backend,
          std::shared_ptr<ApiKeys> api_keys, GatewayMetrics* metrics, Clock* clock);

  // The HTTP handler (http::Handler).
  void Handle(std::shared_ptr<http::Exchange> exchange);

  // From now on new generation requests answer 503 (graceful shutdown); streams in flight go on.
  void StopAdmitting() { admitting_.store(false); }
  int in_flight() const { return in_flight_.load(); }

  // True when a replica is ready; `why` says why not.
  bool Healthy(std::string* why);

 private:
  struct Request;  // one generation in flight (gateway.cc)
  friend struct Request;

  void HandleChat(const std::shared_ptr<http::Exchange>& exchange);
  void HandleCompletion(const std::shared_ptr<http::Exchange>& exchange);
  void HandleTokenize(const std::shared_ptr<http::Exchange>& exchange);
  void HandleDetokenize(const std::shared_ptr<http::Exchange>& exchange);
  void HandleModels(const std::shared_ptr<http::Exchange>& exchange);
  void HandleHealth(const std::shared_ptr<http::Exchange>& exchange);
  void HandleMetrics(const std::shared_ptr<http::Exchange>& exchange);
  void HandleVersion(const std::shared_ptr<http::Exchange>& exchange);
  // Starts `request` on a replica chosen by the router, or answers 503 / 429.
  void Start(std::shared_ptr<Request> request);
  // A generation ended: its replica's reservation and the in-flight count go back.
  void Release(int replica, int64_t tokens);
  // The checks that may answer the request themselves: false when they did.
  bool Authorized(const std::shared_ptr<http::Exchange>& exchange);
  bool ModelMatches(const std::string& model, const std::shared_ptr<http::Exchange>& exchange,
                    const std::string& route);
  // The checkpoint's chat template over the request's messages (transformers' context).
  absl::StatusOr<std::string> RenderChat(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools,
                                         const nlohmann::ordered_json& kwargs,
                                         bool add_generation_prompt,
                                         bool continue_final_message) const;
  // Sets params->max_tokens within max_model_len, or the 400 that says why it cannot.
  std::optional<openai::ApiError> FitTokens(GenerateParams* params, std::optional<int> max_tokens,
                                            const char* prompt_param) const;
  void FillSampling(const openai::SamplingOptions& sampling, GenerateParams* params) const;
  void Reply(const std::shared_ptr<http::Exchange>& exchange, const std::string& route,
             int status, std::string body,
             const std::string& content_type = "application/json");
  // The OpenAI error envelope; Retry-After when retry_after_s > 0.
  void ReplyError(const std::shared_ptr<http::Exchange>& exchange, const std::string& route,
                  const openai::ApiError& error, int retry_after_s = 0);

  const GatewayOptions options_;
  const ModelFiles model_;
  ReplicaBackend* const backend_;
  const std::shared_ptr<ApiKeys> api_keys_;
  GatewayMetrics* const metrics_;
  Clock* const clock_;
  Router router_;
  const int64_t created_unix_;
  std::atomic<bool> admitting_{true};
  std::atomic<int> in_flight_{0};
  std::mutex load_mu_;
  std::map<int, int64_t> outstanding_tokens_;  // per replica: prompt + max_tokens in flight
};

}  // namespace glm::gateway
