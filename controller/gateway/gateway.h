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
//
// Admission queue: with no replica ready, a generation request waits in a FIFO queue (at most
// max_queued, each up to queue_timeout) until one is; a new request never overtakes waiting ones.
// One dispatcher thread starts waiting requests: woken by the backend's readiness listener when it
// has one, and re-checking every queue_recheck otherwise. Queue full → 503 at once; timeout → 503
// with Retry-After naming each replica's state and the time waited; a client that disconnects
// while waiting leaves the queue. StopAdmitting answers every waiting request 503.
//
// Safe retry: a generation that ends UNAVAILABLE or FAILED_PRECONDITION (replica failed, draining,
// not running) before anything generated reached the client (nothing beyond the SSE role/echo
// chunk; a non-streamed answer is not sent before the end) goes back through the queue to
// another ready replica, never one that failed it, at most one attempt per replica. A replica
// leaving service (FAILED_PRECONDITION: draining, stopping) is skipped for 250 ms and may take
// the request once it is ready again, so a restart of the only replica holds requests in the
// queue instead of failing them (up to 3 such retries). Once text went out, the error reaches
// the client as it is.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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
  // The admission queue (controller.gateway_queue): requests waiting for a ready replica beyond
  // max_queued answer 503 at once; each waits up to queue_timeout. queue_timeout 0: no queue, a
  // request with no ready replica answers 503 at once.
  int max_queued = 256;
  std::chrono::milliseconds queue_timeout{30000};
  // How often waiting requests re-check replica readiness (besides the backend's notifications).
  std::chrono::milliseconds queue_recheck{25};
};

class Gateway {
 public:
  // `backend` outlives the gateway; `api_keys` may be null (no key required). `metrics` and
  // `clock` too outlive it.
  Gateway(GatewayOptions options, ModelFiles model, ReplicaBackend* backend,
          std::shared_ptr<ApiKeys> api_keys, GatewayMetrics* metrics, Clock* clock);
  // Answers the requests still queued (503) and stops the dispatcher thread.
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // The HTTP handler (http::Handler).
  void Handle(std::shared_ptr<http::Exchange> exchange);

  // From now on new generation requests answer 503 (graceful shutdown), and so does every request
  // waiting in the queue, at once; streams in flight go on. Thread-safe.
  void StopAdmitting();
  int in_flight() const { return in_flight_.load(); }
  // Requests waiting in the admission queue.
  int queued();

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
  // Starts `request` on a replica chosen by the router, queues it, or answers 503 / 429.
  void Start(std::shared_ptr<Request> request);
  // The router's pick among the ready replicas that have not failed `request`; -1: none.
  int Pick(const Request& request, const std::vector<ReplicaInfo>& replicas);
  // Holds `replica` for `request` (router memory, outstanding tokens, in-flight count).
  void Reserve(Request& request, int replica);
  // Sends a reserved request to its replica (the SSE head on its first attempt).
  void Dispatch(const std::shared_ptr<Request>& request, int replica);
  // A request whose replica failed it before its first token: back into the queue, in arrival
  // order, for another replica.
  void Requeue(const std::shared_ptr<Request>& request);
  // A client left while its request waited: out of the queue.
  void Unqueue(Request* request);
  // The dispatcher thread: starts waiting requests as replicas become ready, expires the others.
  void DispatchLoop();
  void PumpQueue();
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
  std::atomic<uint64_t> next_seq_{0};          // arrival order
  // The admission queue. Lock order: queue_mu_ before load_mu_; never held while calling the
  // backend or answering a client.
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Request>> queue_;  // guarded by queue_mu_; ascending arrival order
  bool queue_wake_ = false;                     // guarded by queue_mu_: pump now
  // Guarded by queue_mu_: requests the dispatcher took from the queue and has not yet handed to
  // the backend. A new request goes straight to a replica only when this is 0 and the queue empty.
  size_t dispatching_ = 0;
  bool stopping_ = false;                       // guarded by queue_mu_: the dispatcher exits
  std::thread dispatcher_;                      // last: starts once the rest is built
};

}  // namespace glm::gateway
