#include "controller/gateway/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace glm::gateway {
namespace {

[[noreturn]] void SetupError(const std::string& message) {
  std::fprintf(stderr, "metrics setup error: %s\n", message.c_str());
  std::abort();
}

bool ValidName(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                       (allow_colon && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

void AppendEscaped(std::string* out, std::string_view text, bool escape_quote) {
  for (char c : text) {
    switch (c) {
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '"':
        if (escape_quote) {
          *out += "\\\"";
        } else {
          *out += c;
        }
        break;
      default: *out += c;
    }
  }
}

// `{a="x",b="y"}` (plus `extra_name="extra_value"` last when given); empty when no labels.
void AppendLabels(std::string* out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, std::string_view extra_name = {},
                  std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return;
  *out += '{';
  bool first = true;
  auto add = [&](std::string_view name, std::string_view value) {
    if (!first) *out += ',';
    first = false;
    *out += name;
    *out += "=\"";
    AppendEscaped(out, value, /*escape_quote=*/true);
    *out += '"';
  };
  for (size_t i = 0; i < names.size(); ++i) add(names[i], values[i]);
  if (!extra_name.empty()) add(extra_name, extra_value);
  *out += '}';
}

void AppendSample(std::string* out, std::string_view name, std::string_view suffix,
                  const std::vector<std::string>& label_names,
                  const std::vector<std::string>& label_values, double value,
                  std::string_view extra_name = {}, std::string_view extra_value = {}) {
  *out += name;
  *out += suffix;
  AppendLabels(out, label_names, label_values, extra_name, extra_value);
  *out += ' ';
  *out += FormatPrometheusValue(value);
  *out += '\n';
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

void RenderChild(std::string* out, const std::string& name, const std::vector<std::string>& names,
                 const std::vector<std::string>& values, const Counter& c) {
  AppendSample(out, name, "", names, values, c.value());
}

void RenderChild(std::string* out, const std::string& name, const std::vector<std::string>& names,
                 const std::vector<std::string>& values, const Gauge& g) {
  AppendSample(out, name, "", names, values, g.value());
}

void RenderChild(std::string* out, const std::string& name, const std::vector<std::string>& names,
                 const std::vector<std::string>& values, const Histogram& h) {
  const Histogram::Snapshot s = h.snapshot();
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    const std::string le =
        i < s.bounds.size() ? FormatPrometheusValue(s.bounds[i]) : std::string("+Inf");
    AppendSample(out, name, "_bucket", names, values, static_cast<double>(s.cumulative[i]), "le",
                 le);
  }
  AppendSample(out, name, "_sum", names, values, s.sum);
  AppendSample(out, name, "_count", names, values, static_cast<double>(s.count));
}

double Seconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
const std::vector<double>& TtftBuckets() {
  static const auto* b = new std::vector<double>{
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  return *b;
}
const std::vector<double>& ItlBuckets() {
  static const auto* b = new std::vector<double>{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                 0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                 7.5,  10.0,  20.0, 40.0,  80.0};
  return *b;
}
const std::vector<double>& LatencyBuckets() {
  static const auto* b = new std::vector<double>{0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,
                                                 5.0,  10.0, 15.0,  20.0,  30.0,  40.0,  50.0,
                                                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return *b;
}
// 1, 2, 5, 10, 20, 50, ... up to 1e6, or up to `max` when > 0 (vLLM's build_1_2_5_buckets).
std::vector<double> TokenBuckets(int64_t max) {
  std::vector<double> bounds;
  const int64_t limit = max > 0 ? max : 1'000'000;
  for (int64_t scale = 1;; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > limit) return bounds;
      bounds.push_back(static_cast<double>(m * scale));
    }
  }
}

}  // namespace

std::string FormatPrometheusValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Go's strconv.FormatFloat(v, 'g', -1, 64), which the Go client uses: shortest round-trip
  // digits, exponent form when the decimal exponent is < -4 or >= 6.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, end);
  const size_t e = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e + 1);
  if (value != 0 && (exponent < -4 || exponent >= 6)) return sci;
  auto [fend, fec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
  return std::string(buf, fend);
}

// ---- Counter, Gauge, Histogram ----------------------------------------------------------------

void Counter::Inc(double amount) {
  if (!(amount >= 0)) return;
  value_.fetch_add(amount, std::memory_order_relaxed);
}

void Gauge::Inc(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }

void Gauge::SetCallback(std::function<double()> callback) {
  std::lock_guard<std::mutex> lock(callback_mu_);
  has_callback_.store(static_cast<bool>(callback), std::memory_order_release);
  callback_ = std::move(callback);
}

double Gauge::value() const {
  if (has_callback_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(callback_mu_);
    if (callback_) return callback_();
  }
  return value_.load(std::memory_order_relaxed);
}

void Gauge::Reset() { value_.store(0.0, std::memory_order_relaxed); }

Histogram::Histogram(std::shared_ptr<const std::vector<double>> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_->size() + 1)) {}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_->begin(), bounds_->end(), value) - bounds_->begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = *bounds_;
  s.cumulative.resize(bounds_->size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;  // == the +Inf bucket by construction, even while observations race
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

void Histogram::Reset() {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
  sum_.store(0.0, std::memory_order_relaxed);
}

// ---- Family ----------------------------------------------------------------------------------

template <typename M>
Family<M>::Family(std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names, std::function<std::unique_ptr<M>()> make)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      make_(std::move(make)) {
  if (label_names_.empty()) Get();  // an unlabeled metric is always shown, starting at 0
}

template <typename M>
M& Family<M>::With(std::initializer_list<std::string_view> label_values) {
  std::vector<std::string> values;
  values.reserve(label_values.size());
  for (std::string_view v : label_values) values.emplace_back(v);
  return With(values);
}

template <typename M>
M& Family<M>::With(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names_.size()) {
    SetupError(name_ + ": " + std::to_string(label_values.size()) + " label values given, " +
               std::to_string(label_names_.size()) + " label names registered");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(label_values);
  if (it == children_.end()) {
    it = children_.emplace(label_values, Child{make_(), true}).first;
  }
  it->second.visible = true;
  return *it->second.metric;
}

template <typename M>
void Family<M>::Remove(const std::vector<std::string>& label_values) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(label_values);
  if (it == children_.end()) return;
  it->second.visible = false;
  it->second.metric->Reset();
}

template <typename M>
void Family<M>::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [values, child] : children_) {
    child.visible = false;
    child.metric->Reset();
  }
}

template <typename M>
void Family<M>::RenderTo(std::string* out) const {
  *out += "# HELP ";
  *out += name_;
  *out += ' ';
  AppendEscaped(out, help_, /*escape_quote=*/false);
  *out += "\n# TYPE ";
  *out += name_;
  *out += ' ';
  *out += TypeName(type_);
  *out += '\n';
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, child] : children_) {
    if (child.visible) RenderChild(out, name_, label_names_, values, *child.metric);
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- MetricsRegistry -------------------------------------------------------------------------

void MetricsRegistry::Claim(const std::string& name) {
  if (!ValidName(name, /*allow_colon=*/true)) SetupError("invalid metric name '" + name + "'");
  if (std::find(names_.begin(), names_.end(), name) != names_.end()) {
    SetupError("metric '" + name + "' registered twice");
  }
  names_.push_back(name);
}

namespace {
void CheckLabelNames(const std::string& metric, const std::vector<std::string>& label_names) {
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& l = label_names[i];
    if (!ValidName(l, /*allow_colon=*/false) || l == "le" || l.rfind("__", 0) == 0) {
      SetupError(metric + ": invalid label name '" + l + "'");
    }
    for (size_t j = 0; j < i; ++j) {
      if (label_names[j] == l) SetupError(metric + ": label '" + l + "' given twice");
    }
  }
}
}  // namespace

CounterFamily& MetricsRegistry::AddCounter(std::string name, std::string help,
                                           std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  Claim(name);
  CheckLabelNames(name, label_names);
  auto family = std::make_unique<CounterFamily>(std::move(name), std::move(help),
                                                MetricType::kCounter, std::move(label_names),
                                                [] { return std::make_unique<Counter>(); });
  CounterFamily* raw = family.get();
  counters_.push_back(std::move(family));
  renderers_.push_back([raw](std::string* out) { raw->RenderTo(out); });
  return *raw;
}

GaugeFamily& MetricsRegistry::AddGauge(std::string name, std::string help,
                                       std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  Claim(name);
  CheckLabelNames(name, label_names);
  auto family = std::make_unique<GaugeFamily>(std::move(name), std::move(help),
                                              MetricType::kGauge, std::move(label_names),
                                              [] { return std::make_unique<Gauge>(); });
  GaugeFamily* raw = family.get();
  gauges_.push_back(std::move(family));
  renderers_.push_back([raw](std::string* out) { raw->RenderTo(out); });
  return *raw;
}

HistogramFamily& MetricsRegistry::AddHistogram(std::string name, std::string help,
                                               std::vector<double> bounds,
                                               std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  Claim(name);
  CheckLabelNames(name, label_names);
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      SetupError(name + ": histogram bounds must be finite and strictly increasing");
    }
  }
  auto shared = std::make_shared<const std::vector<double>>(std::move(bounds));
  auto family = std::make_unique<HistogramFamily>(
      std::move(name), std::move(help), MetricType::kHistogram, std::move(label_names),
      [shared] { return std::make_unique<Histogram>(shared); });
  HistogramFamily* raw = family.get();
  histograms_.push_back(std::move(family));
  renderers_.push_back([raw](std::string* out) { raw->RenderTo(out); });
  return *raw;
}

std::string MetricsRegistry::Render() const {
  std::vector<std::function<void(std::string*)>> renderers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    renderers = renderers_;
  }
  std::string out;
  for (const auto& render : renderers) render(&out);
  return out;
}

// ---- GatewayMetrics --------------------------------------------------------------------------

GatewayMetrics::GatewayMetrics(std::string model_name, int64_t max_model_len)
    : model_name_(std::move(model_name)) {
  const std::vector<std::string> m = {"model_name"};
  const std::vector<std::string> mv = {model_name_};
  const std::vector<double> token_buckets = TokenBuckets(max_model_len);

  // Gauges.
  running_ = &registry_.AddGauge("vllm:num_requests_running",
                                 "Number of requests in model execution batches.", m).With(mv);
  waiting_ = &registry_.AddGauge("vllm:num_requests_waiting",
                                 "Number of requests waiting to be processed.", m).With(mv);
  kv_usage_ = &registry_.AddGauge("vllm:kv_cache_usage_perc",
                                  "KV-cache usage. 1 means 100 percent usage.",
                                  {"model_name", "replica"});
  // Counters.
  prompt_tokens_ = &registry_.AddCounter("vllm:prompt_tokens_total",
                                         "Number of prefill tokens processed.", m).With(mv);
  generation_tokens_ = &registry_.AddCounter("vllm:generation_tokens_total",
                                             "Number of generation tokens processed.", m).With(mv);
  request_success_ = &registry_.AddCounter("vllm:request_success_total",
                                           "Count of successfully processed requests.",
                                           {"model_name", "finished_reason"});
  for (const char* reason : {"stop", "length", "abort"}) request_success_->With({model_name_, reason});
  preemptions_ = &registry_.AddCounter("vllm:num_preemptions_total",
                                       "Cumulative number of preemption from the engine.", m)
                      .With(mv);
  // Histograms.
  ttft_ = &registry_.AddHistogram("vllm:time_to_first_token_seconds",
                                  "Histogram of time to first token in seconds.", TtftBuckets(), m)
               .With(mv);
  itl_ = &registry_.AddHistogram("vllm:inter_token_latency_seconds",
                                 "Histogram of inter-token latency in seconds.", ItlBuckets(), m)
              .With(mv);
  e2e_ = &registry_.AddHistogram("vllm:e2e_request_latency_seconds",
                                 "Histogram of e2e request latency in seconds.", LatencyBuckets(),
                                 m).With(mv);
  queue_time_ = &registry_.AddHistogram("vllm:request_queue_time_seconds",
                                        "Histogram of time spent in WAITING phase for request.",
                                        LatencyBuckets(), m).With(mv);
  prompt_tokens_hist_ = &registry_.AddHistogram("vllm:request_prompt_tokens",
                                                "Number of prefill tokens processed.",
                                                token_buckets, m).With(mv);
  generation_tokens_hist_ = &registry_.AddHistogram("vllm:request_generation_tokens",
                                                    "Number of generation tokens processed.",
                                                    token_buckets, m).With(mv);
  iteration_tokens_ = &registry_.AddHistogram("vllm:iteration_tokens_total",
                                              "Histogram of number of tokens per engine_step.",
                                              token_buckets, m).With(mv);
  // Ours.
  requests_admitted_ = &registry_.AddCounter("glmctl_requests_admitted_total",
                                             "Requests admitted by the gateway.", m).With(mv);
  node_state_ = &registry_.AddGauge("glmctl_node_state",
                                    "1 for the node's current state.", {"node", "state"});
  replica_state_ = &registry_.AddGauge("glmctl_replica_state",
                                       "1 for the replica's current state.", {"replica", "state"});
  http_requests_ = &registry_.AddCounter("glmctl_http_requests_total",
                                         "HTTP responses by route and status code.",
                                         {"route", "code"});
  key_requests_ = &registry_.AddCounter("glmctl_gateway_requests_total",
                                        "Requests with a valid API key, by the key's name.",
                                        {"key"});
  key_rate_limited_ = &registry_.AddCounter("glmctl_gateway_rate_limited_total",
                                            "Requests answered 429 by their API key's rate "
                                            "limit, by the key's name.",
                                            {"key"});
  queued_ = &registry_.AddGauge("glmctl_gateway_requests_queued",
                                "Requests waiting in the gateway for a ready replica.", m)
                 .With(mv);
  gateway_queue_time_ =
      &registry_.AddHistogram("glmctl_gateway_queue_time_seconds",
                              "Time requests waited in the gateway for a ready replica.",
                              TtftBuckets(), m).With(mv);
  retries_ = &registry_.AddCounter("glmctl_gateway_request_retries_total",
                                   "Requests re-routed after their replica failed them before "
                                   "the first token.", m).With(mv);
  unavailable_ = &registry_.AddCounter("glmctl_gateway_unavailable_total",
                                       "503 answers of the gateway itself, by reason.",
                                       {"model_name", "reason"});
  for (const char* reason : {kUnavailableNoReplica, kUnavailableQueueFull,
                             kUnavailableQueueTimeout, kUnavailableShuttingDown}) {
    unavailable_->With({model_name_, reason});
  }
  const std::vector<std::string> mr = {"model_name", "replica"};
  spec_drafts_ = &registry_.AddCounter("vllm:spec_decode_num_drafts_total",
                                       "Number of spec decoding drafts.", mr);
  spec_draft_tokens_ = &registry_.AddCounter("vllm:spec_decode_num_draft_tokens_total",
                                             "Number of draft tokens.", mr);
  spec_accepted_tokens_ = &registry_.AddCounter("vllm:spec_decode_num_accepted_tokens_total",
                                                "Number of accepted tokens.", mr);
  spec_accepted_per_pos_ =
      &registry_.AddCounter("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                            "Accepted tokens per draft position.",
                            {"model_name", "replica", "position"});
}

void GatewayMetrics::OnRequestAdmitted() { requests_admitted_->Inc(); }
void GatewayMetrics::OnFirstToken(double seconds) { ttft_->Observe(seconds); }
void GatewayMetrics::OnToken(double inter_token_seconds) { itl_->Observe(inter_token_seconds); }

void GatewayMetrics::OnFinished(std::string_view finished_reason, int64_t prompt_tokens,
                                int64_t completion_tokens, double e2e_seconds,
                                double queue_seconds) {
  request_success_->With({model_name_, finished_reason}).Inc();
  prompt_tokens_->Inc(static_cast<double>(prompt_tokens));
  generation_tokens_->Inc(static_cast<double>(completion_tokens));
  prompt_tokens_hist_->Observe(static_cast<double>(prompt_tokens));
  generation_tokens_hist_->Observe(static_cast<double>(completion_tokens));
  e2e_->Observe(e2e_seconds);
  queue_time_->Observe(queue_seconds);
}

void GatewayMetrics::OnPreemption(int64_t count) { preemptions_->Inc(static_cast<double>(count)); }
void GatewayMetrics::OnIteration(int64_t num_tokens) {
  iteration_tokens_->Observe(static_cast<double>(num_tokens));
}
void GatewayMetrics::SetRunning(int64_t num_requests) {
  running_->Set(static_cast<double>(num_requests));
}
void GatewayMetrics::SetWaiting(int64_t num_requests) {
  waiting_->Set(static_cast<double>(num_requests));
}
void GatewayMetrics::SetKvUsage(int replica, double fraction) {
  kv_usage_->With({model_name_, std::to_string(replica)}).Set(fraction);
}
void GatewayMetrics::RemoveReplica(int replica) {
  const std::string r = std::to_string(replica);
  kv_usage_->Remove({model_name_, r});
  std::lock_guard<std::mutex> lock(states_mu_);
  auto it = spec_positions_.find(replica);
  if (it == spec_positions_.end()) return;
  for (CounterFamily* f : {spec_drafts_, spec_draft_tokens_, spec_accepted_tokens_}) {
    f->Remove({model_name_, r});
  }
  for (size_t p = 0; p < it->second; ++p) {
    spec_accepted_per_pos_->Remove({model_name_, r, std::to_string(p)});
  }
  spec_positions_.erase(it);
}

void GatewayMetrics::SetSpecDecode(int replica, int64_t drafts, int64_t draft_tokens,
                                   int64_t accepted_tokens,
                                   const std::vector<int64_t>& accepted_per_position) {
  const std::string r = std::to_string(replica);
  std::lock_guard<std::mutex> lock(states_mu_);
  spec_drafts_->With({model_name_, r}).SetTotal(static_cast<double>(drafts));
  spec_draft_tokens_->With({model_name_, r}).SetTotal(static_cast<double>(draft_tokens));
  spec_accepted_tokens_->With({model_name_, r}).SetTotal(static_cast<double>(accepted_tokens));
  size_t& shown = spec_positions_[replica];
  for (size_t p = 0; p < accepted_per_position.size(); ++p) {
    spec_accepted_per_pos_->With({model_name_, r, std::to_string(p)})
        .SetTotal(static_cast<double>(accepted_per_position[p]));
  }
  for (size_t p = accepted_per_position.size(); p < shown; ++p) {
    spec_accepted_per_pos_->Remove({model_name_, r, std::to_string(p)});
  }
  shown = accepted_per_position.size();
}

void GatewayMetrics::SetNodeStates(const std::map<std::string, std::string>& state_by_node) {
  std::lock_guard<std::mutex> lock(states_mu_);
  // Set the new series before hiding stale ones, so a concurrent scrape never sees a node
  // without a state.
  for (const auto& [node, state] : state_by_node) node_state_->With({node, state}).Set(1);
  for (const auto& [node, state] : node_states_) {
    auto it = state_by_node.find(node);
    if (it == state_by_node.end() || it->second != state) node_state_->Remove({node, state});
  }
  node_states_ = state_by_node;
}

void GatewayMetrics::SetReplicaStates(const std::map<int, std::string>& state_by_replica) {
  std::lock_guard<std::mutex> lock(states_mu_);
  for (const auto& [replica, state] : state_by_replica) {
    replica_state_->With({std::to_string(replica), state}).Set(1);
  }
  for (const auto& [replica, state] : replica_states_) {
    auto it = state_by_replica.find(replica);
    if (it == state_by_replica.end() || it->second != state) {
      replica_state_->Remove({std::to_string(replica), state});
    }
  }
  replica_states_ = state_by_replica;
}

void GatewayMetrics::OnHttp(std::string_view route, int code) {
  http_requests_->With({route, std::to_string(code)}).Inc();
}

void GatewayMetrics::OnKeyRequest(std::string_view key_name) {
  key_requests_->With({key_name}).Inc();
}
void GatewayMetrics::OnKeyRateLimited(std::string_view key_name) {
  key_rate_limited_->With({key_name}).Inc();
}

void GatewayMetrics::SetQueued(int64_t num_requests) {
  queued_->Set(static_cast<double>(num_requests));
}
void GatewayMetrics::OnQueueLeft(double seconds) { gateway_queue_time_->Observe(seconds); }
void GatewayMetrics::OnRetry() { retries_->Inc(); }
void GatewayMetrics::OnUnavailable(std::string_view reason) {
  unavailable_->With({model_name_, reason}).Inc();
}

// ---- RequestTimer ----------------------------------------------------------------------------

RequestTimer::RequestTimer(GatewayMetrics* metrics, Clock* clock)
    : RequestTimer(metrics, clock, clock->Now()) {}

RequestTimer::RequestTimer(GatewayMetrics* metrics, Clock* clock, Clock::TimePoint admitted)
    : metrics_(metrics), clock_(clock), admitted_(admitted) {
  metrics_->OnRequestAdmitted();
}

void RequestTimer::OnScheduled() {
  if (scheduled_set_) return;
  scheduled_ = clock_->Now();
  scheduled_set_ = true;
}

void RequestTimer::OnTokens() {
  const Clock::TimePoint now = clock_->Now();
  if (!got_token_) {
    if (!scheduled_set_) {
      scheduled_ = now;
      scheduled_set_ = true;
    }
    metrics_->OnFirstToken(Seconds(now - admitted_));
    got_token_ = true;
  } else {
    metrics_->OnToken(Seconds(now - last_token_));
  }
  last_token_ = now;
}

void RequestTimer::Finish(std::string_view finished_reason, int64_t prompt_tokens,
                          int64_t completion_tokens) {
  if (finished_) return;
  finished_ = true;
  const Clock::TimePoint now = clock_->Now();
  const Clock::TimePoint scheduled = scheduled_set_ ? scheduled_ : now;
  metrics_->OnFinished(finished_reason, prompt_tokens, completion_tokens, Seconds(now - admitted_),
                       Seconds(scheduled - admitted_));
}

}  // namespace glm::gateway
