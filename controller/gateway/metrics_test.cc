#include "controller/gateway/metrics.h"

#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::gateway {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(FormatPrometheusValueTest, MatchesGoFormatting) {
  EXPECT_EQ(FormatPrometheusValue(0), "0");
  EXPECT_EQ(FormatPrometheusValue(1), "1");
  EXPECT_EQ(FormatPrometheusValue(-2), "-2");
  EXPECT_EQ(FormatPrometheusValue(1.5), "1.5");
  EXPECT_EQ(FormatPrometheusValue(0.001), "0.001");
  EXPECT_EQ(FormatPrometheusValue(0.0001), "0.0001");
  EXPECT_EQ(FormatPrometheusValue(0.00001), "1e-05");
  EXPECT_EQ(FormatPrometheusValue(2560), "2560");
  EXPECT_EQ(FormatPrometheusValue(100000), "100000");
  EXPECT_EQ(FormatPrometheusValue(1000000), "1e+06");
  EXPECT_EQ(FormatPrometheusValue(1234567), "1.234567e+06");
  EXPECT_EQ(FormatPrometheusValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatPrometheusValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatPrometheusValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(MetricsRegistryTest, RendersExactText) {
  MetricsRegistry registry;
  CounterFamily& requests =
      registry.AddCounter("requests_total", "Requests.\nSecond line \\ \"quoted\"", {"path"});
  requests.With({"/a\"b\\c\nd"}).Inc(2);
  requests.With({"/b"}).Inc();
  requests.With({"/b"}).Inc(-5);  // ignored: counters never go down
  registry.AddGauge("temperature", "Temperature.").Get().Set(1.5);
  HistogramFamily& latency =
      registry.AddHistogram("latency_seconds", "Latency.", {0.5, 1}, {"model", "kind"});
  Histogram& h = latency.With({"m", "k"});
  h.Observe(0.25);
  h.Observe(0.5);  // on the bound: counted in le="0.5"
  h.Observe(0.75);
  h.Observe(4);
  registry.AddCounter("empty_total", "No children yet.", {"x"});

  EXPECT_EQ(registry.Render(),
            "# HELP requests_total Requests.\\nSecond line \\\\ \"quoted\"\n"
            "# TYPE requests_total counter\n"
            "requests_total{path=\"/a\\\"b\\\\c\\nd\"} 2\n"
            "requests_total{path=\"/b\"} 1\n"
            "# HELP temperature Temperature.\n"
            "# TYPE temperature gauge\n"
            "temperature 1.5\n"
            "# HELP latency_seconds Latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{model=\"m\",kind=\"k\",le=\"0.5\"} 2\n"
            "latency_seconds_bucket{model=\"m\",kind=\"k\",le=\"1\"} 3\n"
            "latency_seconds_bucket{model=\"m\",kind=\"k\",le=\"+Inf\"} 4\n"
            "latency_seconds_sum{model=\"m\",kind=\"k\"} 5.5\n"
            "latency_seconds_count{model=\"m\",kind=\"k\"} 4\n"
            "# HELP empty_total No children yet.\n"
            "# TYPE empty_total counter\n");
}

TEST(MetricsRegistryTest, UnlabeledMetricsRenderAtZero) {
  MetricsRegistry registry;
  registry.AddCounter("c_total", "C.");
  registry.AddHistogram("h", "H.", {1});
  EXPECT_EQ(registry.Render(),
            "# HELP c_total C.\n# TYPE c_total counter\nc_total 0\n"
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\n"
            "h_sum 0\nh_count 0\n");
}

TEST(MetricsRegistryTest, CallbackGaugeEvaluatedAtRender) {
  MetricsRegistry registry;
  int calls = 0;
  Gauge& g = registry.AddGauge("queue_depth", "Depth.").Get();
  g.Set(7);
  g.SetCallback([&calls] { return static_cast<double>(++calls * 10); });
  EXPECT_THAT(registry.Render(), HasSubstr("queue_depth 10\n"));
  EXPECT_THAT(registry.Render(), HasSubstr("queue_depth 20\n"));
  g.SetCallback(nullptr);
  EXPECT_THAT(registry.Render(), HasSubstr("queue_depth 7\n"));
}

TEST(MetricsRegistryTest, RemoveHidesAndKeepsReferencesValid) {
  MetricsRegistry registry;
  GaugeFamily& family = registry.AddGauge("g", "G.", {"replica"});
  Gauge& zero = family.With({"0"});
  zero.Set(3);
  family.With({"1"}).Set(4);
  family.Remove({"0"});
  std::string text = registry.Render();
  EXPECT_THAT(text, Not(HasSubstr("g{replica=\"0\"}")));
  EXPECT_THAT(text, HasSubstr("g{replica=\"1\"} 4\n"));
  zero.Set(5);  // still valid memory, still hidden
  EXPECT_THAT(registry.Render(), Not(HasSubstr("g{replica=\"0\"}")));
  family.With({"0"}).Inc();  // shown again, from the value it has
  EXPECT_THAT(registry.Render(), HasSubstr("g{replica=\"0\"} 6\n"));
  family.Clear();
  EXPECT_EQ(registry.Render(), "# HELP g G.\n# TYPE g gauge\n");
}

TEST(MetricsRegistryDeathTest, SetupErrorsAbort) {
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddCounter("x_total", "X.");
        registry.AddGauge("x_total", "X again.");
      },
      "registered twice");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddGauge("bad-name", "X.");
      },
      "invalid metric name");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddGauge("g", "X.", {"a", "b"}).With({"only one"});
      },
      "1 label values given");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddHistogram("h", "X.", {1, 1});
      },
      "strictly increasing");
}

TEST(MetricsRegistryTest, ConcurrentUpdatesAreExact) {
  MetricsRegistry registry;
  CounterFamily& counter = registry.AddCounter("c_total", "C.", {"t"});
  Gauge& gauge = registry.AddGauge("g", "G.").Get();
  Histogram& histogram = registry.AddHistogram("h", "H.", {1, 2}).Get();
  constexpr int kThreads = 4;
  constexpr int kIterations = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& shared = counter.With({"shared"});
      for (int i = 0; i < kIterations; ++i) {
        shared.Inc();
        counter.With({"lookup"}).Inc(2);  // the locked lookup path
        gauge.Inc();
        histogram.Observe(static_cast<double>((i + t) % 3));  // 0, 1, 2
        if (i % 5000 == 0) (void)registry.Render();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter.With({"shared"}).value(), kThreads * kIterations);
  EXPECT_EQ(counter.With({"lookup"}).value(), 2.0 * kThreads * kIterations);
  EXPECT_EQ(gauge.value(), kThreads * kIterations);
  const Histogram::Snapshot s = histogram.snapshot();
  EXPECT_EQ(s.count, static_cast<uint64_t>(kThreads * kIterations));
  ASSERT_EQ(s.cumulative.size(), 3u);
  EXPECT_EQ(s.cumulative.back(), s.count);
  uint64_t expected_le1 = 0;
  double expected_sum = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kIterations; ++i) {
      const int v = (i + t) % 3;
      if (v <= 1) ++expected_le1;
      expected_sum += v;
    }
  }
  EXPECT_EQ(s.cumulative[0], expected_le1);  // le="1"
  EXPECT_EQ(s.cumulative[1], s.count);       // le="2": every value
  EXPECT_EQ(s.sum, expected_sum);
}

TEST(GatewayMetricsTest, RegistersVllmNames) {
  GatewayMetrics metrics("glm-5");
  const std::string text = metrics.Render();
  for (const char* name :
       {"vllm:num_requests_running gauge", "vllm:num_requests_waiting gauge",
        "vllm:kv_cache_usage_perc gauge", "vllm:prompt_tokens_total counter",
        "vllm:generation_tokens_total counter", "vllm:request_success_total counter",
        "vllm:num_preemptions_total counter", "vllm:time_to_first_token_seconds histogram",
        "vllm:inter_token_latency_seconds histogram", "vllm:e2e_request_latency_seconds histogram",
        "vllm:request_queue_time_seconds histogram", "vllm:request_prompt_tokens histogram",
        "vllm:request_generation_tokens histogram", "vllm:iteration_tokens_total histogram",
        "glmctl_node_state gauge", "glmctl_replica_state gauge",
        "glmctl_http_requests_total counter"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + name + "\n"));
  }
  EXPECT_THAT(text, HasSubstr("vllm:num_requests_running{model_name=\"glm-5\"} 0\n"));
  EXPECT_THAT(text,
              HasSubstr("vllm:request_success_total{model_name=\"glm-5\",finished_reason=\"abort\"} 0\n"));
  // vLLM's boundaries, first and last.
  EXPECT_THAT(text, HasSubstr("vllm:time_to_first_token_seconds_bucket{model_name=\"glm-5\",le=\"0.001\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_to_first_token_seconds_bucket{model_name=\"glm-5\",le=\"2560\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:inter_token_latency_seconds_bucket{model_name=\"glm-5\",le=\"80\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:e2e_request_latency_seconds_bucket{model_name=\"glm-5\",le=\"7680\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_prompt_tokens_bucket{model_name=\"glm-5\",le=\"1e+06\"} 0\n"));
}

TEST(GatewayMetricsTest, MaxModelLenCutsTokenBuckets) {
  GatewayMetrics metrics("m", 1000);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("vllm:request_prompt_tokens_bucket{model_name=\"m\",le=\"1000\"} 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("le=\"2000\"")));
}

TEST(GatewayMetricsTest, RequestTimerObservesOnTheInjectedClock) {
  FakeClock clock;
  GatewayMetrics metrics("glm-5");
  RequestTimer timer(&metrics, &clock);
  clock.Advance(std::chrono::milliseconds(500));
  timer.OnScheduled();
  clock.Advance(std::chrono::milliseconds(250));
  timer.OnTokens();  // TTFT 0.75 s
  clock.Advance(std::chrono::milliseconds(50));
  timer.OnTokens();  // ITL 0.05 s
  timer.Finish("stop", 10, 2);  // e2e 0.8 s, queue 0.5 s
  timer.Finish("stop", 10, 2);  // ignored

  const std::string text = metrics.Render();
  const std::string m = "{model_name=\"glm-5\"";
  EXPECT_THAT(text, HasSubstr("glmctl_requests_admitted_total" + m + "} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_to_first_token_seconds_bucket" + m + ",le=\"0.5\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_to_first_token_seconds_bucket" + m + ",le=\"0.75\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_to_first_token_seconds_sum" + m + "} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("vllm:inter_token_latency_seconds_bucket" + m + ",le=\"0.025\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:inter_token_latency_seconds_bucket" + m + ",le=\"0.05\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:e2e_request_latency_seconds_bucket" + m + ",le=\"0.5\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:e2e_request_latency_seconds_bucket" + m + ",le=\"0.8\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_queue_time_seconds_bucket" + m + ",le=\"0.3\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_queue_time_seconds_bucket" + m + ",le=\"0.5\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_queue_time_seconds_count" + m + "} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_success_total" + m + ",finished_reason=\"stop\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:prompt_tokens_total" + m + "} 10\n"));
  EXPECT_THAT(text, HasSubstr("vllm:generation_tokens_total" + m + "} 2\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_prompt_tokens_bucket" + m + ",le=\"5\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_prompt_tokens_bucket" + m + ",le=\"10\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_generation_tokens_bucket" + m + ",le=\"1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_generation_tokens_bucket" + m + ",le=\"2\"} 1\n"));
}

TEST(GatewayMetricsTest, FinishWithoutTokensCountsQueueAsWholeRequest) {
  FakeClock clock;
  GatewayMetrics metrics("m");
  RequestTimer timer(&metrics, &clock);
  clock.Advance(std::chrono::seconds(2));
  timer.Finish("abort", 5, 0);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("vllm:request_queue_time_seconds_sum{model_name=\"m\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("vllm:time_to_first_token_seconds_count{model_name=\"m\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:request_success_total{model_name=\"m\",finished_reason=\"abort\"} 1\n"));
}

TEST(GatewayMetricsTest, StateGaugesShowOnlyCurrentState) {
  GatewayMetrics metrics("m");
  metrics.SetNodeStates({{"n1", "Ready"}, {"n2", "Loading"}});
  metrics.SetReplicaStates({{0, "Serving"}, {1, "Down"}});
  metrics.SetNodeStates({{"n1", "Degraded"}});
  metrics.SetReplicaStates({{0, "Serving"}, {1, "Serving"}});
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("glmctl_node_state{node=\"n1\",state=\"Degraded\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("state=\"Ready\"")));
  EXPECT_THAT(text, Not(HasSubstr("node=\"n2\"")));
  EXPECT_THAT(text, HasSubstr("glmctl_replica_state{replica=\"0\",state=\"Serving\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("glmctl_replica_state{replica=\"1\",state=\"Serving\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("state=\"Down\"")));
}

// Speculative decoding totals come from each replica's engine and are shown as they are, with a
// series per draft position; a replica that goes away takes its series along.
TEST(GatewayMetricsTest, SpecDecodeTotalsPerReplicaAndPosition) {
  GatewayMetrics metrics("m");
  metrics.SetSpecDecode(0, 10, 30, 21, {9, 7, 5});
  metrics.SetSpecDecode(1, 4, 8, 2, {2, 0});
  std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_drafts_total{model_name=\"m\",replica=\"0\"} 10\n"));
  EXPECT_THAT(text,
              HasSubstr("vllm:spec_decode_num_draft_tokens_total{model_name=\"m\",replica=\"0\"} 30\n"));
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\","
                              "replica=\"0\"} 21\n"));
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\","
                              "replica=\"0\",position=\"2\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE vllm:spec_decode_num_drafts_total counter\n"));
  // The engine restarted with fewer positions: the stale position disappears, totals restart.
  metrics.SetSpecDecode(0, 1, 2, 1, {1, 0});
  metrics.RemoveReplica(1);
  text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("vllm:spec_decode_num_drafts_total{model_name=\"m\",replica=\"0\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("position=\"2\"")));
  EXPECT_THAT(text, Not(HasSubstr("replica=\"1\"")));
}

TEST(GatewayMetricsTest, GaugesCountersAndHttp) {
  GatewayMetrics metrics("m");
  metrics.SetRunning(3);
  metrics.SetWaiting(4);
  metrics.SetKvUsage(0, 0.25);
  metrics.SetKvUsage(1, 0.5);
  metrics.RemoveReplica(1);
  metrics.OnPreemption();
  metrics.OnIteration(48);
  metrics.OnHttp("/v1/chat/completions", 200);
  metrics.OnHttp("/v1/chat/completions", 200);
  metrics.OnHttp("/v1/models", 401);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("vllm:num_requests_running{model_name=\"m\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("vllm:num_requests_waiting{model_name=\"m\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("vllm:kv_cache_usage_perc{model_name=\"m\",replica=\"0\"} 0.25\n"));
  EXPECT_THAT(text, Not(HasSubstr("replica=\"1\"")));
  EXPECT_THAT(text, HasSubstr("vllm:num_preemptions_total{model_name=\"m\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("vllm:iteration_tokens_total_bucket{model_name=\"m\",le=\"20\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("vllm:iteration_tokens_total_bucket{model_name=\"m\",le=\"50\"} 1\n"));
  EXPECT_THAT(text,
              HasSubstr("glmctl_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("glmctl_http_requests_total{route=\"/v1/models\",code=\"401\"} 1\n"));
}

}  // namespace
}  // namespace glm::gateway
