#include "cluster/spec/cluster_spec.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Lines 1..7; tests append top-level sections starting at line 8.
constexpr char kMinimal[] =
    "name: t\n"                   // 1
    "model:\n"                    // 2
    "  path: m\n"                 // 3
    "  max_model_len: 1024\n"     // 4
    "nodes:\n"                    // 5
    "  - name: a\n"               // 6
    "    agent: 127.0.0.1:1\n";   // 7

// Four TP nodes on a fabric, lines 1..19.
constexpr char kFour[] =
    "name: four\n"                        // 1
    "model:\n"                            // 2
    "  path: m\n"                         // 3
    "  max_model_len: 1024\n"             // 4
    "parallel:\n"                         // 5
    "  tensor: 4\n"                       // 6
    "fabric:\n"                           // 7
    "  mtu: 9000\n"                       // 8
    "  subnet: 10.1.0.0/24\n"             // 9
    "nodes:\n"                            // 10
    "  - name: n0\n"                      // 11
    "    agent: 10.0.0.1:47101\n"         // 12
    "    fabric_ip: 10.1.0.1\n"           // 13
    "  - {name: n1, agent: 10.0.0.2:47101, fabric_ip: 10.1.0.2}\n"  // 14
    "  - {name: n2, agent: 10.0.0.3:47101, fabric_ip: 10.1.0.3}\n"  // 15
    "  - name: n3\n"                      // 16
    "    agent: 10.0.0.4:47101\n"         // 17
    "    fabric_ip: 10.1.0.4\n"           // 18
    "    gid_index: 3\n";                 // 19

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(ClusterSpec, MinimalDefaults) {
  auto spec = ParseClusterSpec(kMinimal, "dir/min.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "t");
  EXPECT_EQ(spec->base_dir, "dir");
  EXPECT_EQ(spec->ResolvePath("m"), "dir/m");
  EXPECT_EQ(spec->ResolvePath("/abs/m"), "/abs/m");
  EXPECT_EQ(spec->model.served_name, "m");
  EXPECT_EQ(spec->model.kv_cache_dtype, KvCacheDtype::kFp8);
  EXPECT_EQ(spec->model.backend, EngineBackend::kAuto);
  EXPECT_EQ(spec->model.weight_dtype, WeightDtype::kAuto);
  EXPECT_EQ(spec->model.max_model_len, 1024);
  EXPECT_EQ(spec->model.max_model_len_location.line, 4);
  EXPECT_EQ(spec->world_size(), 1);
  ASSERT_EQ(spec->nodes.size(), 1u);
  EXPECT_EQ(spec->nodes[0].agent_host, "127.0.0.1");
  EXPECT_EQ(spec->nodes[0].agent_port, 1);
  EXPECT_FALSE(spec->nodes[0].gid_index.has_value());
  EXPECT_EQ(spec->nodes[0].location.line, 6);
  EXPECT_EQ(spec->page_cache.policy, PageCachePolicy::kOff);
  EXPECT_EQ(spec->controller.gateway_queue.max_requests, 256);
  EXPECT_DOUBLE_EQ(spec->controller.gateway_queue.timeout_s, 30.0);
}

TEST(ClusterSpec, ControllerInsecureOptOut) {
  auto spec = ParseClusterSpec(std::string(kFour) + "controller:\n  insecure: true\n", "c.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->controller.insecure);
  auto bad = ParseClusterSpec(std::string(kFour) + "controller:\n  insecure: maybe\n", "c.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("controller.insecure"));
}

TEST(ClusterSpec, FullSchema) {
  std::string text = std::string(kFour) +
                     "local: false\n"
                     "controller:\n"
                     "  listen: 0.0.0.0:0\n"
                     "  gateway: '[::1]:8000'\n"
                     "  tls: {ca: ca.pem, cert: c.pem, key: c.key}\n"
                     "  api_key_file: keys\n"
                     "  gateway_queue: {max_requests: 8, timeout_s: 2.5}\n"
                     "nccl:\n"
                     "  library: /opt/nccl/libnccl.so.2\n"
                     "  source: /srv/nccl/libnccl.so.2\n"
                     "  expected_version: \"2.30.4\"\n"
                     "  env: {NCCL_IB_HCA: rocep1s0f1, NCCL_DEBUG: WARN, NCCL_IB_GID_INDEX: 3}\n"
                     "page_cache: {policy: adaptive, interval_s: 5, min_available_bytes: 8GiB}\n"
                     "node_defaults: {hca: mlx5_0, port: 1, netdev: eth1, memory_budget_bytes: 110GiB}\n";
  text = Replace(text, "  max_model_len: 1024\n",
                 "  max_model_len: 200000\n  kv_cache_dtype: bf16\n  kv_cache_bytes: 20 GiB\n"
                 "  max_num_seqs: 4\n  mtp_draft_tokens: 2\n  served_name: glm\n");
  text = Replace(text, "    gid_index: 3\n", "    gid_index: 3\n    memory_budget_bytes: 100000\n");
  auto spec = ParseClusterSpec(text, "full.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->controller.listen, "0.0.0.0:0");
  ASSERT_TRUE(spec->controller.tls.has_value());
  EXPECT_EQ(spec->controller.tls->key, "c.key");
  EXPECT_EQ(spec->controller.gateway_queue.max_requests, 8);
  EXPECT_DOUBLE_EQ(spec->controller.gateway_queue.timeout_s, 2.5);
  EXPECT_FALSE(spec->controller.insecure);  // the default
  EXPECT_EQ(spec->model.kv_cache_dtype, KvCacheDtype::kBf16);
  EXPECT_EQ(spec->model.kv_cache_bytes, int64_t{20} << 30);
  EXPECT_EQ(spec->model.served_name, "glm");
  EXPECT_EQ(spec->model.mtp_draft_tokens, 2);
  EXPECT_EQ(spec->nccl.env.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_EQ(spec->nccl.expected_version, "2.30.4");
  EXPECT_EQ(spec->nccl.source, "/srv/nccl/libnccl.so.2");
  EXPECT_EQ(spec->fabric.mtu, 9000);
  EXPECT_EQ(spec->page_cache.policy, PageCachePolicy::kAdaptive);
  EXPECT_EQ(spec->page_cache.min_available_bytes, int64_t{8} << 30);
  ASSERT_EQ(spec->nodes.size(), 4u);
  EXPECT_EQ(spec->nodes[0].hca, "mlx5_0");
  EXPECT_EQ(spec->nodes[0].memory_budget_bytes, int64_t{110} << 30);
  EXPECT_EQ(spec->nodes[3].memory_budget_bytes, 100000);
  EXPECT_EQ(spec->nodes[3].gid_index, 3);
  EXPECT_EQ(spec->nodes[1].name, "n1");
  EXPECT_EQ(spec->nodes[1].location.line, 19);  // 14 + 5 inserted model lines
}

TEST(ClusterSpec, MicroBatches) {
  auto spec = ParseClusterSpec(kFour, "four.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.micro_batches, 0);  // unset: the pipeline's depth
  spec = ParseClusterSpec(
      Replace(kFour, "  tensor: 4\n", "  tensor: 2\n  pipeline: 2\n  micro_batches: 1\n"),
      "pp.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.micro_batches, 1);
}

TEST(ClusterSpec, BackendAndWeightDtypeValues) {
  const std::vector<std::pair<std::string, EngineBackend>> backends = {
      {"auto", EngineBackend::kAuto}, {"cpu", EngineBackend::kCpu}, {"cuda", EngineBackend::kCuda}};
  for (const auto& [name, want] : backends) {
    SCOPED_TRACE(name);
    auto spec = ParseClusterSpec(
        Replace(kMinimal, "  path: m\n", "  path: m\n  backend: " + name + "\n"), "b.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->model.backend, want);
    EXPECT_EQ(EngineBackendName(spec->model.backend), name);
  }
  const std::vector<std::pair<std::string, WeightDtype>> dtypes = {
      {"auto", WeightDtype::kAuto}, {"bf16", WeightDtype::kBf16}, {"fp32", WeightDtype::kFp32}};
  for (const auto& [name, want] : dtypes) {
    SCOPED_TRACE(name);
    auto spec = ParseClusterSpec(
        Replace(kMinimal, "  path: m\n", "  path: m\n  weight_dtype: " + name + "\n"), "w.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->model.weight_dtype, want);
    EXPECT_EQ(WeightDtypeName(spec->model.weight_dtype), name);
  }
}

TEST(ClusterSpec, PolicyOffStaysAString) {
  // YAML 1.1 readers turn a bare `off` into false; the policy must still read as "off".
  auto spec = ParseClusterSpec(std::string(kMinimal) + "page_cache: {policy: off}\n", "p.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->page_cache.policy, PageCachePolicy::kOff);
  spec = ParseClusterSpec(std::string(kMinimal) + "page_cache: {policy: periodic, interval_s: 2.5}\n",
                          "p.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->page_cache.policy, PageCachePolicy::kPeriodic);
  EXPECT_DOUBLE_EQ(spec->page_cache.interval_s, 2.5);
}

TEST(ClusterSpec, GatewayQueueTimeoutZeroTurnsTheQueueOff) {
  auto spec = ParseClusterSpec(
      std::string(kMinimal) + "controller:\n  gateway_queue:\n    timeout_s: 0\n", "q.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->controller.gateway_queue.timeout_s, 0.0);
  EXPECT_EQ(spec->controller.gateway_queue.max_requests, 256);
}

TEST(ClusterSpec, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("96GiB"), int64_t{96} << 30);
  EXPECT_EQ(*ParseByteSize("96 GiB"), int64_t{96} << 30);
  EXPECT_EQ(*ParseByteSize("1.5TB"), 1500000000000);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("1000"), 1000);
  EXPECT_EQ(*ParseByteSize("4KB"), 4000);
  EXPECT_FALSE(ParseByteSize("96G").ok());
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_FALSE(ParseByteSize("1.2.3GiB").ok());
  EXPECT_FALSE(ParseByteSize("1.5").ok());
  EXPECT_FALSE(ParseByteSize("99999999999TiB").ok());
  EXPECT_FALSE(ParseByteSize("-5GiB").ok());
}

TEST(ClusterSpec, Rates) {
  EXPECT_DOUBLE_EQ(*ParseRate("273GB/s"), 273e9);
  EXPECT_DOUBLE_EQ(*ParseRate("4.8 TB/s"), 4.8e12);
  EXPECT_DOUBLE_EQ(*ParseRate("200Gb/s"), 25e9);  // bits: a 200G NIC moves 25 GB/s
  EXPECT_DOUBLE_EQ(*ParseRate("100Gbit/s"), 12.5e9);
  EXPECT_DOUBLE_EQ(*ParseRate("1GiB/s"), 1073741824.0);
  EXPECT_FALSE(ParseRate("273").ok());      // bits or bytes would be a guess
  EXPECT_FALSE(ParseRate("273GB").ok());    // a size, not a rate
  EXPECT_FALSE(ParseRate("273 gb/s").ok());
  EXPECT_FALSE(ParseRate("GB/s").ok());
  EXPECT_FALSE(ParseRate("-5GB/s").ok());
  EXPECT_FALSE(ParseRate("1.2.3GB/s").ok());
}

TEST(ClusterSpec, NodeGpuOrdinal) {
  // Two agents on one host, one GPU each; a node without `gpu` runs on device 0.
  std::string text = Replace(kFour, "    gid_index: 3\n", "    gid_index: 3\n    gpu: 1\n");
  text = Replace(text, "fabric_ip: 10.1.0.3}", "fabric_ip: 10.1.0.3, gpu: 7}");
  auto spec = ParseClusterSpec(text, "gpus.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->nodes[0].gpu, 0);
  EXPECT_EQ(spec->nodes[2].gpu, 7);
  EXPECT_EQ(spec->nodes[3].gpu, 1);
}

TEST(ClusterSpec, BandwidthFields) {
  std::string text = std::string(kFour) +
                     "node_defaults: {memory_bandwidth: 273GB/s, memory_bandwidth_efficiency: 0.4}\n";
  text = Replace(text, "  subnet: 10.1.0.0/24\n",
                 "  subnet: 10.1.0.0/24\n  link_bandwidth: 200Gb/s\n  hop_latency_us: 7.5\n");
  text = Replace(text, "    gid_index: 3\n", "    gid_index: 3\n    memory_bandwidth: 4.8TB/s\n");
  auto spec = ParseClusterSpec(text, "bw.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(*spec->fabric.link_bandwidth_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(*spec->fabric.hop_latency_us, 7.5);
  EXPECT_DOUBLE_EQ(*spec->nodes[0].memory_bandwidth_bytes_per_s, 273e9);
  EXPECT_DOUBLE_EQ(*spec->nodes[0].memory_bandwidth_efficiency, 0.4);
  EXPECT_DOUBLE_EQ(*spec->nodes[3].memory_bandwidth_bytes_per_s, 4.8e12);  // own value wins
  EXPECT_DOUBLE_EQ(*spec->nodes[3].memory_bandwidth_efficiency, 0.4);
  // Absent: no value (the planner then makes no decode projection / uses its defaults).
  auto plain = ParseClusterSpec(kFour, "four.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->nodes[0].memory_bandwidth_bytes_per_s.has_value());
  EXPECT_FALSE(plain->nodes[0].memory_bandwidth_efficiency.has_value());
  EXPECT_FALSE(plain->fabric.link_bandwidth_bytes_per_s.has_value());
  EXPECT_FALSE(plain->fabric.hop_latency_us.has_value());
}

TEST(ClusterSpec, ReportsEveryErrorOnItsOwnLine) {
  std::string text = std::string(kMinimal) + "parallel: {tensor: 0, pipeline: x}\n";
  auto spec = ParseClusterSpec(text, "c.yaml");
  ASSERT_FALSE(spec.ok());
  std::string msg(spec.status().message());
  EXPECT_THAT(msg, HasSubstr("c.yaml:8:20: field `parallel.tensor`"));
  EXPECT_THAT(msg, HasSubstr("\nc.yaml:8:33: field `parallel.pipeline`"));
}

TEST(ClusterSpec, DuplicatesReportedAlongsideOtherErrors) {
  std::string text = Replace(kFour, "name: n2", "name: n1") + "nmae: x\n";
  auto spec = ParseClusterSpec(text, "c.yaml");
  ASSERT_FALSE(spec.ok());
  std::string msg(spec.status().message());
  EXPECT_THAT(msg, HasSubstr("c.yaml:15:12: field `nodes[2].name`"));
  EXPECT_THAT(msg, HasSubstr("c.yaml:20:1: field `nmae`"));
}

TEST(ClusterSpec, LoadResolvesAgainstFileDir) {
  auto dir = std::filesystem::temp_directory_path() /
             ("cluster_spec_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "c.yaml");
    out << kMinimal;
  }
  auto spec = LoadClusterSpec((dir / "c.yaml").string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ResolvePath("../x"), (dir.parent_path() / "x").string());
  auto missing = LoadClusterSpec((dir / "nope.yaml").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

struct BadYaml {
  const char* name;
  std::string text;
  int line;
  int column;         // 0: not checked
  const char* field;  // "" for messages about the whole document
  const char* detail;
};

std::vector<BadYaml> BadCases() {
  const std::string min = kMinimal;
  const std::string four = kFour;
  return {
      {"unknown_top_key", min + "nmae: x\n", 8, 1, "nmae", "did you mean `name`?"},
      {"unknown_model_key", Replace(min, "  path: m\n", "  path: m\n  max_modle_len: 5\n"), 4, 3,
       "model.max_modle_len", "did you mean `max_model_len`?"},
      {"key_in_wrong_section", Replace(min, "    agent: 127.0.0.1:1\n",
                                       "    agent: 127.0.0.1:1\n    mtu: 9000\n"),
       8, 5, "nodes[0].mtu", "belongs under `fabric`"},
      {"missing_name", min.substr(std::string("name: t\n").size()), 1, 1, "name", "is missing"},
      {"missing_model_path", Replace(min, "  path: m\n", ""), 3, 3, "model.path", "is missing"},
      {"negative_max_model_len", Replace(min, "1024", "-5"), 4, 18, "model.max_model_len",
       "got -5"},
      {"text_max_model_len", Replace(min, "1024", "long"), 4, 18, "model.max_model_len",
       "an integer"},
      {"bad_kv_dtype", Replace(min, "  path: m\n", "  path: m\n  kv_cache_dtype: fp16\n"), 4, 19,
       "model.kv_cache_dtype", "one of: fp8, bf16"},
      {"bad_backend", Replace(min, "  path: m\n", "  path: m\n  backend: gpu\n"), 4, 12,
       "model.backend", "got \"gpu\"; expected one of: auto, cpu, cuda"},
      {"backend_list", Replace(min, "  path: m\n", "  path: m\n  backend: [cuda]\n"), 4, 12,
       "model.backend", "got a list; expected one of: auto, cpu, cuda"},
      {"bandwidth_without_unit",
       Replace(min, "    agent: 127.0.0.1:1\n", "    agent: 127.0.0.1:1\n    memory_bandwidth: 273\n"),
       8, 23, "nodes[0].memory_bandwidth", "a rate with its unit, e.g. 273GB/s"},
      {"bandwidth_size_unit",
       Replace(min, "    agent: 127.0.0.1:1\n", "    agent: 127.0.0.1:1\n    memory_bandwidth: 273GB\n"),
       8, 23, "nodes[0].memory_bandwidth", "is not a rate unit"},
      {"bandwidth_zero", min + "node_defaults: {memory_bandwidth: 0GB/s}\n", 8, 35,
       "node_defaults.memory_bandwidth", "a rate above zero"},
      {"efficiency_above_one", min + "node_defaults: {memory_bandwidth_efficiency: 1.5}\n", 8, 46,
       "node_defaults.memory_bandwidth_efficiency", "a number in (0, 1]"},
      {"link_bandwidth_lowercase", min + "fabric: {link_bandwidth: 200gb/s}\n", 8, 26,
       "fabric.link_bandwidth", "Gb/s = gigabits per second"},
      {"hop_latency_negative", min + "fabric: {hop_latency_us: -3}\n", 8, 26,
       "fabric.hop_latency_us", "a number in [0, 100000]"},
      {"bad_weight_dtype", Replace(min, "  path: m\n", "  path: m\n  weight_dtype: fp8\n"), 4, 17,
       "model.weight_dtype", "got \"fp8\"; expected one of: auto, bf16, fp32 (auto keeps an fp8"},
      {"weight_dtype_typo", Replace(min, "  path: m\n", "  path: m\n  weight_dtpye: bf16\n"), 4, 3,
       "model.weight_dtpye", "did you mean `weight_dtype`?"},
      {"backend_in_wrong_section", min + "parallel:\n  backend: cuda\n", 9, 3, "parallel.backend",
       "belongs under `model`"},
      {"both_kv_sizes", Replace(min, "  path: m\n",
                                "  path: m\n  kv_cache_bytes: 1GiB\n  kv_cache_memory_fraction: 0.5\n"),
       5, 3, "model.kv_cache_memory_fraction", "at most one of"},
      {"canary_not_a_map", Replace(min, "  path: m\n", "  path: m\n  canary: hello\n"), 4, 11,
       "model.canary", "a mapping with keys: prompt, prompt_ids"},
      {"canary_negative_id", Replace(min, "  path: m\n", "  path: m\n  canary: {prompt_ids: [1, -2]}\n"),
       4, 28, "model.canary.prompt_ids[1]", "a token id >= 0"},
      {"canary_empty_ids", Replace(min, "  path: m\n", "  path: m\n  canary: {expect_ids: []}\n"),
       4, 24, "model.canary.expect_ids", "is an empty list; expected a non-empty list"},
      {"canary_text_and_ids",
       Replace(min, "  path: m\n", "  path: m\n  canary: {prompt: hi, prompt_ids: [1]}\n"), 4, 24,
       "model.canary.prompt_ids", "one of prompt (text) and prompt_ids (token ids)"},
      {"canary_max_tokens_short",
       Replace(min, "  path: m\n", "  path: m\n  canary: {expect_ids: [1, 2], max_tokens: 1}\n"),
       4, 44, "model.canary.max_tokens", "at least len(expect_ids)"},
      {"canary_key_typo", Replace(min, "  path: m\n", "  path: m\n  canary: {expect_idz: [1]}\n"),
       4, 12, "model.canary.expect_idz", "did you mean `expect_ids`?"},
      {"lifecycle_negative_budget", min + "lifecycle: {restart_budget: -1}\n", 8, 29,
       "lifecycle.restart_budget", "got -1"},
      {"lifecycle_zero_window", min + "lifecycle: {restart_window_s: 0}\n", 8, 31,
       "lifecycle.restart_window_s", "(0, 604800]"},
      {"kv_fraction_range", Replace(min, "  path: m\n", "  path: m\n  kv_cache_memory_fraction: 1.5\n"),
       4, 29, "model.kv_cache_memory_fraction", "(0, 1]"},
      {"kv_bytes_unit", Replace(min, "  path: m\n", "  path: m\n  kv_cache_bytes: 96XB\n"), 4, 19,
       "model.kv_cache_bytes", "not one of B, KB"},
      {"max_num_seqs_zero", Replace(min, "  path: m\n", "  path: m\n  max_num_seqs: 0\n"), 4, 17,
       "model.max_num_seqs", "got 0"},
      {"mtp_too_many", Replace(min, "  path: m\n", "  path: m\n  mtp_draft_tokens: 99\n"), 4, 21,
       "model.mtp_draft_tokens", "0..16"},
      {"model_scalar", Replace(min, "model:\n  path: m\n  max_model_len: 1024\n", "model: m\n"), 2, 8,
       "model", "got \"m\""},
      {"tensor_zero", min + "parallel:\n  tensor: 0\n", 9, 11, "parallel.tensor", "1..1024"},
      {"tensor_text", min + "parallel:\n  tensor: four\n", 9, 11, "parallel.tensor", "\"four\""},
      {"partition_len", min + "parallel:\n  layer_partition: [3, 3]\n", 9, 20,
       "parallel.layer_partition", "parallel.pipeline is 1"},
      {"partition_zero", min + "parallel:\n  pipeline: 2\n  layer_partition: [3, 0]\n", 10, 24,
       "parallel.layer_partition[1]", ">= 1"},
      {"partition_scalar", min + "parallel:\n  layer_partition: 11\n", 9, 20,
       "parallel.layer_partition", "a list of layer counts"},
      {"micro_batches_past_pipeline", min + "parallel:\n  pipeline: 2\n  micro_batches: 3\n", 10,
       18, "parallel.micro_batches", "1..2"},
      {"node_count", Replace(four, "  tensor: 4\n", "  tensor: 2\n"), 11, 3, "nodes",
       "= 2 × 1 × 1 = 2"},
      {"duplicate_name", Replace(four, "name: n2", "name: n1"), 15, 12, "nodes[2].name",
       "also used by nodes[1] (line 14)"},
      {"duplicate_agent", Replace(four, "10.0.0.4:47101", "10.0.0.1:47101"), 17, 12,
       "nodes[3].agent", "also used by nodes[0] (line 11)"},
      {"duplicate_fabric_ip", Replace(four, "10.1.0.3", "10.1.0.2"), 15, 50, "nodes[2].fabric_ip",
       "also used by nodes[1]"},
      {"fabric_ip_outside_subnet", Replace(four, "10.1.0.4", "10.2.0.4"), 18, 16,
       "nodes[3].fabric_ip", "outside fabric.subnet 10.1.0.0/24"},
      {"fabric_ip_invalid", Replace(four, "10.1.0.4", "10.1.0.256"), 18, 16, "nodes[3].fabric_ip",
       "an IPv4 address"},
      {"mtu_low", Replace(four, "mtu: 9000", "mtu: 100"), 8, 8, "fabric.mtu", "576..9216"},
      {"mtu_high", Replace(four, "mtu: 9000", "mtu: 10000"), 8, 8, "fabric.mtu", "576..9216"},
      {"subnet_prefix", Replace(four, "10.1.0.0/24", "10.1.0.0/33"), 9, 11, "fabric.subnet",
       "IPv4 CIDR"},
      {"agent_no_port", Replace(min, "127.0.0.1:1", "127.0.0.1"), 7, 12, "nodes[0].agent",
       "has no `:port`"},
      {"agent_port_range", Replace(min, "127.0.0.1:1", "127.0.0.1:70000"), 7, 12, "nodes[0].agent",
       "out of range"},
      {"agent_port_zero", Replace(min, "127.0.0.1:1", "127.0.0.1:0"), 7, 12, "nodes[0].agent",
       "out of range"},
      {"agent_bad_host", Replace(min, "127.0.0.1:1", "\"bad host:1\""), 7, 12, "nodes[0].agent",
       "not an IPv4 address or host name"},
      {"agent_bad_ip", Replace(min, "127.0.0.1:1", "10.0.0.300:1"), 7, 12, "nodes[0].agent",
       "not an IPv4 address"},
      {"gid_word", Replace(four, "gid_index: 3", "gid_index: automatic"), 19, 16,
       "nodes[3].gid_index", "or `auto`"},
      {"gid_range", Replace(four, "gid_index: 3", "gid_index: 300"), 19, 16, "nodes[3].gid_index",
       "0..255"},
      {"gpu_negative", Replace(four, "gid_index: 3", "gpu: -1"), 19, 10, "nodes[3].gpu",
       "0..1023"},
      {"gpu_word", Replace(four, "gid_index: 3", "gpu: first"), 19, 10, "nodes[3].gpu",
       "\"first\""},
      {"gpu_in_node_defaults", min + "node_defaults: {gpu: 1}\n", 8, 17, "node_defaults.gpu",
       "belongs under `nodes[]`"},
      {"local_not_loopback", Replace(four, "name: four\n", "name: four\nlocal: true\n"), 13, 12,
       "nodes[0].agent", "not a loopback address"},
      {"local_not_bool", min + "local: maybe\n", 8, 8, "local", "true or false"},
      {"tls_missing_key", min + "controller:\n  tls: {ca: a, cert: b}\n", 9, 8,
       "controller.tls.key", "is missing"},
      {"listen_bad", min + "controller:\n  listen: localhost\n", 9, 11, "controller.listen",
       "has no `:port`"},
      {"gateway_queue_negative_max", min + "controller:\n  gateway_queue: {max_requests: -1}\n",
       9, 33, "controller.gateway_queue.max_requests", "got -1; expected an integer in 1..1048576"},
      {"gateway_queue_max_text", min + "controller:\n  gateway_queue: {max_requests: many}\n", 9,
       33, "controller.gateway_queue.max_requests", "got \"many\""},
      {"gateway_queue_negative_timeout",
       min + "controller:\n  gateway_queue:\n    timeout_s: -5\n", 10, 16,
       "controller.gateway_queue.timeout_s", "got -5; expected a number in [0, 3600]"},
      {"gateway_queue_timeout_text",
       min + "controller:\n  gateway_queue:\n    timeout_s: soon\n", 10, 16,
       "controller.gateway_queue.timeout_s", "got \"soon\""},
      {"gateway_queue_scalar", min + "controller:\n  gateway_queue: 5\n", 9, 18,
       "controller.gateway_queue", "a mapping with keys: max_requests, timeout_s"},
      {"gateway_queue_typo", min + "controller:\n  gateway_queue: {max_request: 3}\n", 9, 19,
       "controller.gateway_queue.max_request", "did you mean `max_requests`?"},
      {"nccl_version", min + "nccl:\n  expected_version: \"2.30\"\n", 9, 21, "nccl.expected_version",
       "MAJOR.MINOR.PATCH"},
      {"nccl_env_list", min + "nccl:\n  env: [A, B]\n", 9, 8, "nccl.env", "a mapping"},
      {"nccl_env_name", min + "nccl:\n  env: {\"1BAD\": x}\n", 9, 9, "nccl.env",
       "not a variable name"},
      {"page_cache_policy", min + "page_cache:\n  policy: sometimes\n", 9, 11, "page_cache.policy",
       "off, periodic, adaptive"},
      {"page_cache_interval", min + "page_cache:\n  policy: periodic\n  interval_s: 0\n", 10, 15,
       "page_cache.interval_s", "(0, 86400]"},
      {"nodes_empty", Replace(min, "nodes:\n  - name: a\n    agent: 127.0.0.1:1\n", "nodes: []\n"), 5,
       8, "nodes", "non-empty list"},
      {"nodes_map", Replace(min, "  - name: a\n    agent: 127.0.0.1:1\n", "  a: 127.0.0.1:1\n"), 6,
       3, "nodes", "got a mapping"},
      {"nodes_missing", min.substr(0, min.find("nodes:")), 1, 1, "nodes", "is missing"},
      {"node_missing_agent", Replace(min, "    agent: 127.0.0.1:1\n", "    hca: x\n"), 6, 5,
       "nodes[0].agent", "is missing"},
      {"duplicate_key", Replace(min, "  path: m\n", "  path: m\n  path: n\n"), 4, 3, "model.path",
       "given twice (first at line 3)"},
      {"memory_budget_text", Replace(min, "    agent: 127.0.0.1:1\n",
                                     "    agent: 127.0.0.1:1\n    memory_budget_bytes: lots\n"),
       8, 26, "nodes[0].memory_budget_bytes", "not a size"},
      {"node_name_chars", Replace(min, "name: a", "name: \"a b\""), 6, 11, "nodes[0].name",
       "letters, digits"},
      {"hca_port_zero", Replace(min, "    agent: 127.0.0.1:1\n",
                                "    agent: 127.0.0.1:1\n    port: 0\n"),
       8, 11, "nodes[0].port", "1..255"},
      {"node_defaults_unknown", min + "node_defaults:\n  gid_idx: 3\n", 9, 3,
       "node_defaults.gid_idx", "did you mean `gid_index`?"},
      {"yaml_syntax", min + "parallel: [1, 2\n", 9, 1, "", "YAML syntax error"},
      {"top_level_list", "- a\n- b\n", 1, 1, "(top level)", "a mapping"},
  };
}

class ClusterSpecBad : public ::testing::TestWithParam<BadYaml> {};

TEST_P(ClusterSpecBad, NamesLineColumnAndField) {
  const BadYaml& c = GetParam();
  auto spec = ParseClusterSpec(c.text, "bad.yaml");
  ASSERT_FALSE(spec.ok()) << c.text;
  std::string msg(spec.status().message());
  std::string where = c.column > 0 ? "bad.yaml:" + std::to_string(c.line) + ":" +
                                         std::to_string(c.column) + ": "
                                   : "bad.yaml:" + std::to_string(c.line) + ":";
  EXPECT_THAT(msg, StartsWith(where)) << c.text;
  if (*c.field != '\0') {
    EXPECT_THAT(msg, HasSubstr("field `" + std::string(c.field) + "`"));
  }
  EXPECT_THAT(msg, HasSubstr(c.detail));
  EXPECT_THAT(msg, HasSubstr("expected"));
}

INSTANTIATE_TEST_SUITE_P(Table, ClusterSpecBad, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadYaml>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(ClusterSpec, CanaryAndLifecycle) {
  auto spec = ParseClusterSpec(
      Replace(kMinimal, "  path: m\n",
              "  path: m\n  canary:\n    prompt: Hello\n    expect_ids: [5, 6]\n") +
          "lifecycle:\n  restart_budget: 0\n  restart_window_s: 60\n  drain_timeout_s: 5\n",
      "c.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model.canary.present);
  EXPECT_EQ(spec->model.canary.prompt, "Hello");
  EXPECT_THAT(spec->model.canary.expect_ids, ::testing::ElementsAre(5, 6));
  EXPECT_EQ(spec->lifecycle.restart_budget, 0);
  EXPECT_DOUBLE_EQ(spec->lifecycle.restart_window_s, 60.0);
  EXPECT_DOUBLE_EQ(spec->lifecycle.drain_timeout_s, 5.0);
  auto plain = ParseClusterSpec(kMinimal, "m.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->model.canary.present);
  EXPECT_EQ(plain->lifecycle.restart_budget, 3);
}

TEST(ClusterSpec, TableHasAtLeastThirtyCases) { EXPECT_GE(BadCases().size(), 30u); }

TEST(ClusterSpec, EmptyFile) {
  auto spec = ParseClusterSpec("", "e.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("e.yaml: the file is empty"));
}

TEST(ClusterSpec, DeepNestingRejected) {
  std::string deep = "name: " + std::string(200, '[') + std::string(200, ']') + "\n";
  auto spec = ParseClusterSpec(deep, "d.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("nest deeper"));
}

}  // namespace
}  // namespace glm::cluster
