// Prometheus metrics of the gateway: a small registry rendering text format 0.0.4, and
// GatewayMetrics, which registers vLLM's metric names (../shared/specs/serving.md §4) so vLLM
// dashboards work unchanged.
//
// Registry model: a family has a name, HELP text, a type and fixed label names; its children are
// keyed by label values. Updating a child is lock-free (atomics); finding a child takes the
// family's mutex, so hot call sites look a child up once and keep the reference. Children are
// never freed before the registry: Remove() only hides a child (and zeroes it), so a kept
// reference stays valid and With() on the same values shows it again.
//
// Setup errors (bad metric or label name, duplicate family, wrong number of label values,
// unsorted histogram bounds) are programming errors: they abort with a message.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"

namespace glm::gateway {

// A monotonically increasing value. Thread-safe, lock-free.
class Counter {
 public:
  // `amount` must be >= 0; negative amounts are ignored (a counter never goes down).
  void Inc(double amount = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }
  void Reset() { value_.store(0.0, std::memory_order_relaxed); }
  // A total counted elsewhere (a replica's engine since it started): exported as is. It starts
  // again from 0 when that engine restarts, which Prometheus' rate() reads as a counter reset.
  void SetTotal(double total) { value_.store(total, std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down, or a callback evaluated at each Render(). Thread-safe; Set/Inc/
// Dec are lock-free.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Inc(double amount = 1.0);
  void Dec(double amount = 1.0) { Inc(-amount); }
  // Once set, value() (and the rendered sample) is `callback()`, evaluated on the scraping thread.
  // The callback must be thread-safe and must not call into the registry. Empty: back to Set().
  void SetCallback(std::function<double()> callback);
  double value() const;
  void Reset();

 private:
  std::atomic<double> value_{0.0};
  std::atomic<bool> has_callback_{false};
  mutable std::mutex callback_mu_;
  std::function<double()> callback_;  // guarded by callback_mu_
};

// Counts observations into fixed buckets (`value <= bound`), plus +Inf, sum and count.
// Thread-safe, lock-free. Render() shows cumulative buckets.
class Histogram {
 public:
  // `bounds`: strictly increasing, finite; shared by all children of a family.
  explicit Histogram(std::shared_ptr<const std::vector<double>> bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;       // upper bounds, without +Inf
    std::vector<uint64_t> cumulative; // bounds.size() + 1 entries; the last one is +Inf == count
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;
  void Reset();

 private:
  std::shared_ptr<const std::vector<double>> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket (not cumulative), +Inf last
  std::atomic<double> sum_{0.0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// A named metric with fixed label names; children keyed by label values. Thread-safe.
template <typename M>
class Family {
 public:
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::function<std::unique_ptr<M>()> make);
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The child for `label_values` (one per label name, in order), created at zero on first use.
  // The reference is valid for the registry's lifetime. Takes the family mutex: cache it on hot
  // paths. Aborts when the number of values differs from the number of label names.
  M& With(std::initializer_list<std::string_view> label_values);
  M& With(const std::vector<std::string>& label_values);
  // For a family without labels.
  M& Get() { return With(std::vector<std::string>{}); }

  // Hides the child from Render() and zeroes it (a kept reference stays valid); no-op if absent.
  void Remove(const std::vector<std::string>& label_values);
  // Hides and zeroes every child.
  void Clear();

  const std::string& name() const { return name_; }
  // Appends this family's HELP, TYPE and samples (visible children, sorted by label values).
  void RenderTo(std::string* out) const;

 private:
  struct Child {
    std::unique_ptr<M> metric;
    bool visible = true;  // guarded by mu_
  };

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<M>()> make_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, Child> children_;  // guarded by mu_
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// Owns families; renders them in registration order. Registration is meant for setup; Render()
// and updates may run concurrently with everything.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // `name` matches [a-zA-Z_:][a-zA-Z0-9_:]*; label names [a-zA-Z_][a-zA-Z0-9_]* and not "le".
  // A counter's name is used as given (vLLM's end in `_total`).
  CounterFamily& AddCounter(std::string name, std::string help,
                            std::vector<std::string> label_names = {});
  GaugeFamily& AddGauge(std::string name, std::string help,
                        std::vector<std::string> label_names = {});
  HistogramFamily& AddHistogram(std::string name, std::string help, std::vector<double> bounds,
                                std::vector<std::string> label_names = {});

  // Prometheus text exposition format 0.0.4 (Content-Type: text/plain; version=0.0.4).
  std::string Render() const;

 private:
  void Claim(const std::string& name);

  mutable std::mutex mu_;
  std::vector<std::string> names_;                       // guarded by mu_
  std::vector<std::function<void(std::string*)>> renderers_;  // guarded by mu_
  std::vector<std::unique_ptr<CounterFamily>> counters_;      // guarded by mu_
  std::vector<std::unique_ptr<GaugeFamily>> gauges_;          // guarded by mu_
  std::vector<std::unique_ptr<HistogramFamily>> histograms_;  // guarded by mu_
};

// Formats a sample value or bucket bound as Prometheus expects: shortest round-trip decimal,
// "+Inf", "-Inf", "NaN".
std::string FormatPrometheusValue(double value);

// The gateway's metrics under vLLM's names. Every `vllm:` series carries `model_name`; per-replica
// ones add `replica`. The `glmctl_` series carry only the labels named below. All methods are
// thread-safe and cheap (one-line call sites on the request path).
class GatewayMetrics {
 public:
  // `max_model_len` > 0 cuts the token-count histograms' buckets at it, as vLLM does; 0 keeps
  // the full 1-2-5 series up to 1e6.
  explicit GatewayMetrics(std::string model_name, int64_t max_model_len = 0);

  MetricsRegistry& registry() { return registry_; }
  std::string Render() const { return registry_.Render(); }

  // Request path (latencies in seconds).
  void OnRequestAdmitted();                      // glmctl_requests_admitted_total
  void OnFirstToken(double seconds);             // vllm:time_to_first_token_seconds
  void OnToken(double inter_token_seconds);      // vllm:inter_token_latency_seconds
  // vllm:request_success_total{finished_reason} (every finished request, aborts included, as in
  // vLLM), prompt/generation token counters and histograms, e2e and queue-time histograms.
  void OnFinished(std::string_view finished_reason, int64_t prompt_tokens,
                  int64_t completion_tokens, double e2e_seconds, double queue_seconds);
  void OnPreemption(int64_t count = 1);          // vllm:num_preemptions_total
  void OnIteration(int64_t num_tokens);          // vllm:iteration_tokens_total

  // State, set from the controller's view of the replicas.
  void SetRunning(int64_t num_requests);         // vllm:num_requests_running
  void SetWaiting(int64_t num_requests);         // vllm:num_requests_waiting
  void SetKvUsage(int replica, double fraction); // vllm:kv_cache_usage_perc{replica}, 0..1
  void RemoveReplica(int replica);               // drops the replica's kv usage and spec series
  // Speculative decoding on the replica's head, totals since its engine started:
  // vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total
  // {model_name,replica} and _num_accepted_tokens_per_pos_total{model_name,replica,position}.
  void SetSpecDecode(int replica, int64_t drafts, int64_t draft_tokens, int64_t accepted_tokens,
                     const std::vector<int64_t>& accepted_per_position);
  // glmctl_node_state{node,state} / glmctl_replica_state{replica,state}: one series per entry,
  // value 1 for its current state; entries not in the map disappear.
  void SetNodeStates(const std::map<std::string, std::string>& state_by_node);
  void SetReplicaStates(const std::map<int, std::string>& state_by_replica);

  // glmctl_http_requests_total{route,code}. `route` is the matched route ("/v1/chat/completions",
  // "other" for 404s), never the raw request path: every distinct value is a new series.
  void OnHttp(std::string_view route, int code);
  // glmctl_gateway_requests_total{key}: requests that presented a valid API key, by the key's
  // name from the key file (never the key). glmctl_gateway_rate_limited_total{key}: those of
  // them answered 429 by the key's rate limit.
  void OnKeyRequest(std::string_view key_name);
  void OnKeyRateLimited(std::string_view key_name);

  // The gateway's admission queue (requests waiting for a ready replica; engine-side waiting is
  // vllm:num_requests_waiting). All carry `model_name`.
  void SetQueued(int64_t num_requests);     // glmctl_gateway_requests_queued
  void OnQueueLeft(double seconds);         // glmctl_gateway_queue_time_seconds (started or not)
  void OnRetry();                           // glmctl_gateway_request_retries_total
  // glmctl_gateway_unavailable_total{reason}: 503s the gateway answered itself. `reason` is one
  // of kUnavailable* below (a fixed set: each value is a series).
  void OnUnavailable(std::string_view reason);
  static constexpr char kUnavailableNoReplica[] = "no_replica";       // queue off, none ready
  static constexpr char kUnavailableQueueFull[] = "queue_full";
  static constexpr char kUnavailableQueueTimeout[] = "queue_timeout";
  static constexpr char kUnavailableShuttingDown[] = "shutting_down";

 private:
  const std::string model_name_;
  MetricsRegistry registry_;
  std::mutex states_mu_;  // serializes SetNodeStates / SetReplicaStates / the spec series
  std::map<std::string, std::string> node_states_;  // guarded by states_mu_: the series shown
  std::map<int, std::string> replica_states_;       // guarded by states_mu_

  Counter* requests_admitted_;
  Counter* prompt_tokens_;
  Counter* generation_tokens_;
  Counter* preemptions_;
  CounterFamily* request_success_;
  Gauge* running_;
  Gauge* waiting_;
  GaugeFamily* kv_usage_;
  GaugeFamily* node_state_;
  GaugeFamily* replica_state_;
  CounterFamily* http_requests_;
  CounterFamily* key_requests_;
  CounterFamily* key_rate_limited_;
  Histogram* ttft_;
  Histogram* itl_;
  Histogram* e2e_;
  Histogram* queue_time_;
  Histogram* prompt_tokens_hist_;
  Histogram* generation_tokens_hist_;
  Histogram* iteration_tokens_;
  Gauge* queued_;
  Histogram* gateway_queue_time_;
  Counter* retries_;
  CounterFamily* unavailable_;
  CounterFamily* spec_drafts_;
  CounterFamily* spec_draft_tokens_;
  CounterFamily* spec_accepted_tokens_;
  CounterFamily* spec_accepted_per_pos_;
  std::map<int, size_t> spec_positions_;  // guarded by states_mu_: positions shown per replica
};

// One request's timing on the injected clock, reported to GatewayMetrics; so the gateway never
// computes durations itself. Created at admission. Not thread-safe (one request, one owner).
class RequestTimer {
 public:
  // Counts the admission (OnRequestAdmitted) and starts the clock.
  RequestTimer(GatewayMetrics* metrics, Clock* clock);
  // The same for a request that arrived at `admitted` (it waited in the gateway's queue since):
  // queue time and TTFT count from then.
  RequestTimer(GatewayMetrics* metrics, Clock* clock, Clock::TimePoint admitted);

  // The request left the queue (sent to a replica). Optional: the first token implies it.
  void OnScheduled();
  // New tokens arrived (one engine step's worth, however many): the first call observes TTFT,
  // later calls one inter-token latency each (time since the previous call), as vLLM does per
  // iteration.
  void OnTokens();
  // Observes e2e and queue time and the token counts. Later calls are ignored.
  void Finish(std::string_view finished_reason, int64_t prompt_tokens, int64_t completion_tokens);

 private:
  GatewayMetrics* metrics_;
  Clock* clock_;
  Clock::TimePoint admitted_;
  Clock::TimePoint scheduled_{};
  Clock::TimePoint last_token_{};
  bool scheduled_set_ = false;
  bool got_token_ = false;
  bool finished_ = false;
};

}  // namespace glm::gateway
