// cluster.yaml → ClusterSpec: the operator's description of one serving cluster.
//
// Schema (every key is optional unless marked *; unknown keys are errors). Sizes are integers
// (bytes) or strings with a unit: "96GiB", "512 MiB", "1.5TB" (KB/MB/GB/TB = 1000^n,
// KiB/MiB/GiB/TiB = 1024^n). Rates need a unit: bytes per second as B/s, KB/s, MB/s, GB/s, TB/s
// (1000^n) or KiB/s..TiB/s (1024^n); bits per second as Kb/s, Mb/s, Gb/s, Tb/s (or Gbit/s, ...,
// 1000^n bits): "273GB/s" (memory), "200Gb/s" (a 200G NIC = 25 GB/s). Relative file paths are
// relative to the YAML file's directory.
//
//   name*: spark-4x                       # cluster name
//   local: false                          # true: agents run on this machine (loopback addresses)
//                                         #   and `glmctl up` starts/stops them itself
//   controller:
//     listen: 0.0.0.0:47100               # gRPC address glmctl and agents use
//     gateway: 0.0.0.0:8000               # OpenAI-compatible HTTP gateway
//     tls: {ca*: ca.pem, cert*: c.pem, key*: c.key}   # mTLS between controller and agents
//                                         #   (make them: `glmctl certs --out DIR cluster.yaml`)
//     insecure: false                     # true: serve `listen` in plaintext beyond loopback
//                                         #   (glm-controller otherwise refuses to start without
//                                         #   tls on a non-loopback listen; it then logs a WARN)
//     api_key_file: keys.txt              # gateway API keys, one per line: `<key>`,
//                                         #   `<name>: <key>` or `<name>: sha256:<hex>`, optional
//                                         #   ` rate=<N>/s|m` (see controller/gateway/api_keys.h)
//     gateway_queue:                      # requests wait in the gateway for a ready replica
//       max_requests: 256                 #   (restarts, drains); beyond this many: 503 at once
//       timeout_s: 30                     #   at most this long, then 503; 0: no queue, 503 at once
//   model*:
//     path*: /models/GLM-5.2-FP8          # HF checkpoint dir (config.json, *.safetensors)
//     served_name: glm-5.2                # name clients ask for (default: last path element)
//     max_model_len*: 200000
//     kv_cache_dtype: fp8                 # fp8 (656 B/token-layer) | bf16 (1152)
//     backend: auto                       # auto | cpu | cuda. auto: cuda where the node's agent
//                                         #   has a usable GPU, else cpu; cuda: a node without
//                                         #   one fails its shard load instead of running on cpu
//     weight_dtype: auto                  # auto | bf16 | fp32: Linear weight storage. auto: fp8
//                                         #   checkpoints stay fp8 (128x128 block scales), others
//                                         #   bf16, on cuda; fp32 on the cpu backend
//     kv_cache_bytes: 40GiB               # per node; at most one of kv_cache_bytes and
//     kv_cache_memory_fraction: 0.9       #   kv_cache_memory_fraction (default fraction 0.9)
//     activation_reserve_bytes: 4GiB      # per node; default computed by the planner
//     max_num_seqs: 8
//     mtp_draft_tokens: 0                 # 0 disables MTP speculative decoding
//     canary:                             # checked on every replica before it is admitted (bring-up,
//       prompt: "Hello"                   #   restarts, self-healing). The prompt as text (the
//       prompt_ids: [1, 2, 3]             #   model's tokenizer on the controller host) or ids
//       expect: " world"                  # expected greedy output: text it starts with, or its
//       expect_ids: [5, 6]                #   exact first ids. Neither: finite logits, the same
//                                         #   output twice and on every replica
//       max_tokens: 8                     # default: len(expect_ids), else 8
//   parallel:
//     tensor: 4
//     pipeline: 1
//     replicas: 1                         # nodes = tensor * pipeline * replicas
//     layer_partition: [11, 10, ...]      # layers per PP stage (length = pipeline)
//     micro_batches: 2                    # PP steps the head keeps in flight, 1..pipeline
//                                         #   (default pipeline: every stage busy; 1: one
//                                         #   step at a time, the lowest latency per token)
//   nccl:
//     library: /opt/nccl/lib/libnccl.so.2 # where every node loads NCCL from
//     source: /srv/nccl/libnccl.so.2      # the pinned build on the controller's host (default:
//                                         #   `library` there). Its XXH3-128 defines the build;
//                                         #   without a copy there, the first node (YAML order)
//                                         #   whose `library` loads with expected_version defines
//                                         #   it. Nodes missing it (or holding another build)
//                                         #   fetch it in Stage from a node holding it.
//     expected_version: "2.30.4"
//     env: {NCCL_IB_HCA: "rocep1s0f1"}
//   fabric:
//     mtu: 9000                           # 576..9216
//     subnet: 192.168.100.0/24            # every node's fabric_ip must be inside
//     link_bandwidth: 200Gb/s             # per node link, for `glmctl plan`'s decode projection
//                                         #   (a rate, see above); default 200Gb/s (assumed)
//     hop_latency_us: 10                  # one message between two nodes, in microseconds
//                                         #   (Gloo over the fabric); default 10 (assumed)
//   node_defaults:                        # defaults for the per-node keys below (not name,
//     hca: rocep1s0f1                     #   agent, fabric_ip)
//   nodes*:
//     - name*: spark-1
//       agent*: 10.0.0.11:47101           # host:port of glm-agent
//       fabric_ip: 192.168.100.11
//       hca: rocep1s0f1
//       port: 1                           # HCA port
//       gid_index: auto                   # integer 0..255 or auto
//       netdev: enp1s0f1np1
//       memory_budget_bytes: 110GiB       # memory the engine may use on this node
//       gpu: 0                            # CUDA device ordinal of this node's shard (default 0);
//                                         #   agents sharing a multi-GPU host take one each (two
//                                         #   TP ranks on one GPU all-reduce over Gloo, not NCCL)
//       memory_bandwidth: 273GB/s         # the node's memory read bandwidth (spec sheet); without
//                                         #   it `glmctl plan` makes no decode projection
//       memory_bandwidth_efficiency: 0.5  # fraction of memory_bandwidth a decode step reaches;
//                                         #   default measured (controller/plan/decode_projection.h)
//   lifecycle:
//     restart_budget: 3                   # automatic restarts of one replica per window (the
//     restart_window_s: 600               #   controller re-forms a group whose agents are back);
//                                         #   beyond it the replica stays Failed. 0: none
//     drain_timeout_s: 30                 # `glmctl restart --rolling`'s bound on draining
//   page_cache:
//     policy: off                         # off | periodic | adaptive
//     interval_s: 30
//     min_available_bytes: 8GiB
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::cluster {

// 1-based position in the YAML file; 0 when unknown.
struct SourceLocation {
  int line = 0;
  int column = 0;
};

struct TlsFiles {
  std::string ca;    // as written (relative to the YAML's directory unless absolute)
  std::string cert;
  std::string key;
};

// controller.gateway_queue: the gateway's admission queue (requests waiting for a ready replica).
struct GatewayQueueSpec {
  int max_requests = 256;
  double timeout_s = 30.0;  // 0: no queue
};

struct ControllerSpec {
  std::string listen = "0.0.0.0:47100";
  std::string gateway = "0.0.0.0:8000";
  std::optional<TlsFiles> tls;
  bool insecure = false;     // plaintext control plane beyond loopback allowed (no tls)
  std::string api_key_file;  // empty: no API keys required
  GatewayQueueSpec gateway_queue;
};

enum class KvCacheDtype { kFp8, kBf16 };
std::string_view KvCacheDtypeName(KvCacheDtype dtype);

// model.backend / model.weight_dtype. Names are the engine's ("auto", "cpu", "cuda"; "auto",
// "bf16", "fp32"); kAuto leaves the choice to each node's agent.
enum class EngineBackend { kAuto, kCpu, kCuda };
std::string_view EngineBackendName(EngineBackend backend);
enum class WeightDtype { kAuto, kBf16, kFp32 };
std::string_view WeightDtypeName(WeightDtype dtype);

// model.canary: the request every replica must answer before it is admitted.
struct CanarySpec {
  bool present = false;
  std::string prompt;               // text; empty when prompt_ids are given
  std::vector<int32_t> prompt_ids;
  std::string expect;               // the greedy output's text starts with this
  std::vector<int32_t> expect_ids;  // the greedy output's first ids are these
  int max_tokens = 0;               // 0: len(expect_ids), else 8
};

struct ModelSpec {
  std::string path;          // as written
  std::string served_name;
  int64_t max_model_len = 0;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFp8;
  EngineBackend backend = EngineBackend::kAuto;
  WeightDtype weight_dtype = WeightDtype::kAuto;
  std::optional<int64_t> kv_cache_bytes;              // per node
  std::optional<double> kv_cache_memory_fraction;     // of the node's memory budget
  std::optional<int64_t> activation_reserve_bytes;    // per node
  int max_num_seqs = 8;
  int mtp_draft_tokens = 0;
  CanarySpec canary;
  SourceLocation location;                // of the `model` mapping
  SourceLocation max_model_len_location;
};

struct ParallelSpec {
  int tensor = 1;
  int pipeline = 1;
  int replicas = 1;
  std::vector<int> layer_partition;       // empty: the planner proposes one
  SourceLocation layer_partition_location;
  int micro_batches = 0;                  // 0: pipeline
};

struct NcclSpec {
  std::string library;                    // empty: the NCCL the agent finds
  std::string source;                     // on the controller's host; empty: `library` there
  std::string expected_version;           // "2.30.4"; empty: any
  std::map<std::string, std::string> env;
};

struct FabricSpec {
  std::optional<int> mtu;
  std::optional<double> link_bandwidth_bytes_per_s;  // fabric.link_bandwidth
  std::optional<double> hop_latency_us;              // fabric.hop_latency_us
  std::string subnet;                     // "192.168.100.0/24"; empty: not checked
  uint32_t subnet_base = 0;               // host byte order, masked
  int subnet_prefix = 0;
};

struct NodeSpec {
  std::string name;
  std::string agent;                      // "host:port"
  std::string agent_host;
  int agent_port = 0;
  std::string fabric_ip;                  // empty when not given
  std::string hca;
  int port = 1;                           // HCA port
  std::optional<int> gid_index;           // nullopt: auto
  std::string netdev;
  std::optional<int64_t> memory_budget_bytes;
  std::optional<double> memory_bandwidth_bytes_per_s;  // memory_bandwidth
  std::optional<double> memory_bandwidth_efficiency;   // (0, 1]
  int gpu = 0;                            // CUDA device ordinal (nodes[].gpu)
  SourceLocation location;                // of this node's mapping
};

enum class PageCachePolicy { kOff, kPeriodic, kAdaptive };
std::string_view PageCachePolicyName(PageCachePolicy policy);

struct PageCacheSpec {
  PageCachePolicy policy = PageCachePolicy::kOff;
  double interval_s = 30.0;
  std::optional<int64_t> min_available_bytes;
};

// lifecycle: how the controller restarts replicas.
struct LifecycleSpec {
  int restart_budget = 3;
  double restart_window_s = 600.0;
  double drain_timeout_s = 30.0;
};

struct ClusterSpec {
  std::string source;                     // file name used in messages
  std::string base_dir;                   // directory relative paths resolve against
  std::string name;
  bool local = false;
  ControllerSpec controller;
  ModelSpec model;
  ParallelSpec parallel;
  NcclSpec nccl;
  FabricSpec fabric;
  std::vector<NodeSpec> nodes;
  PageCacheSpec page_cache;
  LifecycleSpec lifecycle;
  SourceLocation nodes_location;

  // "cluster.yaml:12:5" (or just the source when `loc` is unknown), for messages.
  std::string Where(const SourceLocation& loc) const;
  // `path` resolved against base_dir unless absolute.
  std::string ResolvePath(const std::string& path) const;
  int world_size() const { return parallel.tensor * parallel.pipeline * parallel.replicas; }
};

// Parses YAML text. `source_name` (usually the path) prefixes every message; relative paths in
// the spec resolve against `base_dir` (default: the directory part of source_name). Returns
// InvalidArgument listing every problem found, one per line, each as
// "<source>:<line>:<column>: field `nodes[2].gid_index`: <what>; expected <fix>".
absl::StatusOr<ClusterSpec> ParseClusterSpec(std::string_view text, std::string_view source_name,
                                             std::optional<std::string> base_dir = std::nullopt);

// Reads and parses a cluster.yaml file.
absl::StatusOr<ClusterSpec> LoadClusterSpec(const std::string& path);

// Parses "96GiB", "512 MiB", "1.5TB", "1000" into bytes.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

// Parses a rate with its unit into bytes per second: "273GB/s" = 273e9, "200Gb/s" = 25e9,
// "4.8 TB/s", "100Gbit/s". A bare number is an error (bits or bytes would be a guess).
absl::StatusOr<double> ParseRate(std::string_view text);

}  // namespace glm::cluster
