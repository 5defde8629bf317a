// What the gateway needs from the cluster: the replicas it may route to and a token stream from
// one of them. The controller implements it over gRPC to each replica's head shard
// (controller/orchestrate/grpc_replica_backend.h); tests use testing/fake_replica_backend.h.
// Token ids in, token ids out: text, templates and parsing stay in the gateway.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace glm::gateway {

struct ReplicaInfo {
  int index = 0;
  // Ready to take requests: the replica is Ready and its head's progress heartbeat is recent.
  bool ready = false;
  std::string state;    // "ready", "degraded", "failed", "pending", "stalled"
  std::string reason;   // why it is not ready (names the node), else empty
  double kv_cache_usage = 0.0;  // 0..1, the head's KV blocks in use
  int requests_in_flight = 0;   // running + waiting on the head
  // Speculative decoding on the head (k = 0: off): counters since its engine started.
  struct SpecDecode {
    int draft_tokens_per_step = 0;  // model.mtp_draft_tokens
    int64_t drafts = 0;             // verify steps with drafts
    int64_t draft_tokens = 0;       // drafts verified
    int64_t accepted_tokens = 0;
    std::vector<int64_t> accepted_per_position;
  };
  SpecDecode spec;
};

struct GenerateParams {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  int max_tokens = 16;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_token_ids;  // finish on any of these (the token is emitted)
  int min_tokens = 0;
  bool ignore_eos = false;
  std::optional<int> logprobs;  // k in [0, 20]: the sampled token's logprob and k alternatives
  std::optional<int> mtp_draft_tokens;  // MTP drafts per step for this request; unset: the replica's
};

struct TokenLogprob {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// Callbacks of one generation, called in order from the backend's threads (never concurrently
// for one call). on_done runs exactly once and is the last call.
struct GenerateCallbacks {
  // New tokens; `logprobs` is empty or has one entry per token.
  std::function<void(const std::vector<int32_t>& token_ids,
                     const std::vector<TokenLogprob>& logprobs)>
      on_tokens;
  // OK with finish_reason "stop" | "length" | "abort", or the error that ended the request
  // (a failed or unreachable replica names it).
  std::function<void(const absl::Status& status, const std::string& finish_reason,
                     int prompt_tokens, int completion_tokens)>
      on_done;
};

// One generation in flight. Cancel is idempotent and safe from any thread; the engine aborts the
// request and on_done follows (finish_reason "abort", or a Cancelled status).
class GenerateCall {
 public:
  virtual ~GenerateCall() = default;
  virtual void Cancel() = 0;
};

class ReplicaBackend {
 public:
  virtual ~ReplicaBackend() = default;
  // Every replica of the cluster, in index order. Thread-safe.
  virtual std::vector<ReplicaInfo> Replicas() = 0;
  // Every node's state ("ready", "unreachable", ...) by name, for /metrics. Thread-safe.
  virtual std::map<std::string, std::string> NodeStates() { return {}; }
  // Starts a generation on `replica`'s head shard. Never blocks on the generation; the
  // callbacks report it (an unreachable replica reports through on_done too). Thread-safe.
  virtual std::shared_ptr<GenerateCall> Generate(int replica, const GenerateParams& params,
                                                 GenerateCallbacks callbacks) = 0;
  // Optional. `listener` runs whenever a replica's `ready` may have changed, so requests waiting
  // for a ready replica start at once instead of at the gateway's next periodic re-check. It runs
  // on a backend thread, outside the backend's locks, must be cheap and must not call back into
  // the backend. An empty function clears it; once this returns, the previous listener is not
  // running and never runs again. The default keeps none: callers must not depend on it.
  virtual void SetReadinessListener(std::function<void()> /*listener*/) {}
};

}  // namespace glm::gateway
