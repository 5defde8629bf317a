// What the orchestrator needs to know about a cluster, distilled from cluster.yaml (ClusterSpec)
// and the plan. Kept independent of the spec/plan libraries' types so bring-up, health and their
// tests do not change when the YAML schema grows; spec_adapter.h converts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "proto/rpc/credentials.h"

namespace glm::orchestrate {

struct NodeEndpoint {
  std::string name;     // nodes[].name
  std::string address;  // nodes[].agent: host:port of the node's glm-agent
  // What this node's shard needs, from the plan (0 = not known): preflight checks them.
  int64_t required_disk_bytes = 0;    // the shard's weight bytes
  int64_t required_memory_bytes = 0;  // weights + KV cache + activation reserve
  // Fabric settings (nodes[] in cluster.yaml; empty without an RDMA fabric): preflight input.
  std::string fabric_ip;
  std::string hca;
  int hca_port = 1;
  std::optional<int> gid_index;  // nullopt: auto
  std::string netdev;
  int gpu = 0;  // nodes[].gpu: the CUDA device ordinal of the node's shard (LoadShardRequest.gpu)
  // The node's shard from the plan (the Stage phase stages its files): decoder layers
  // [layer_begin, layer_end); layer_end 0 = not known, stage every file of the model.
  int layer_begin = 0;
  int layer_end = 0;
  bool first_stage = true;  // holds the embedding
  bool last_stage = true;   // holds final norm and lm_head
  // Its place in the plan (the Load phase sends them): replica, PP stage, TP rank, and the KV
  // cache bytes the plan gives it (0 = not known: the engine's default).
  int replica = 0;
  int pp_rank = 0;
  int tp_rank = 0;
  int64_t kv_cache_bytes = 0;
};

// cluster.yaml page_cache: (the policy the agents run while loading their shards).
struct PageCacheSettings {
  std::string policy = "off";        // off | periodic | adaptive
  double interval_s = 30.0;
  int64_t min_available_bytes = 0;   // 0 = the agent's default
};

// model.canary (cluster.yaml): the request every replica answers before it is admitted.
// Text fields need the model's tokenizer on the controller host; ids do not.
struct CanarySettings {
  bool configured = false;            // model.canary is present
  std::string prompt;                 // text (empty: prompt_ids, else the default prompt)
  std::vector<int32_t> prompt_ids;
  std::string expect;                 // the output's text starts with this
  std::vector<int32_t> expect_ids;    // the output's first ids are these
  int max_tokens = 0;                 // 0: len(expect_ids), else 8
};

// lifecycle: (cluster.yaml): restarts of replicas.
struct LifecycleSettings {
  int restart_budget = 3;             // automatic restarts of one replica per window; 0: none
  Clock::Duration restart_window = std::chrono::minutes(10);
  Clock::Duration drain_timeout = std::chrono::seconds(30);
};

struct ClusterTopology {
  std::string cluster_name;
  std::string config_path;     // cluster.yaml this was read from
  std::string controller_listen;
  // The OpenAI-compatible gateway (controller.gateway, controller.api_key_file resolved; empty
  // key file: no key required) and the name clients ask for (model.served_name).
  std::string gateway_listen;
  std::string api_key_file;
  // controller.gateway_queue: requests waiting for a ready replica, at most gateway_queue_max,
  // each up to gateway_queue_timeout_s (0: no queue, 503 at once).
  int gateway_queue_max = 256;
  double gateway_queue_timeout_s = 30.0;
  std::string served_name;
  bool local = false;          // every node runs on this machine (glmctl starts the processes)
  std::vector<NodeEndpoint> nodes;
  // Node names of each replica, in replica order; filled by the plan step (empty before).
  std::vector<std::vector<std::string>> replicas;
  // The controller's identity: server credentials for glmctl, client credentials to the agents.
  rpc::TlsFiles tls;
  // controller.insecure: plaintext gRPC beyond loopback is allowed (glm-controller otherwise
  // refuses a non-loopback listen without tls).
  bool insecure = false;
  // Preflight inputs.
  std::string model_dir;
  bool require_gpu = false;
  int fabric_mtu = 0;                 // fabric.mtu; 0 = not configured
  std::string nccl_library;           // nccl.library resolved; empty = not configured
  std::string nccl_source;            // nccl.source resolved (controller host); empty = nccl_library
  std::string nccl_expected_version;  // nccl.expected_version
  // Load inputs: parallel.tensor / parallel.pipeline, MTP drafting on, page_cache:.
  int tensor = 1;
  int pipeline = 1;
  int micro_batches = 0;      // parallel.micro_batches: PP steps in flight (0 = pipeline)
  bool mtp = false;           // the last stage loads the MTP layer
  int mtp_draft_tokens = 0;   // model.mtp_draft_tokens: k for every rank's engine (0 = off)
  PageCacheSettings page_cache;
  // Engine settings the Load phase sends (model: in cluster.yaml). kv_dtype is the engine's
  // name for model.kv_cache_dtype: "fp8", or "fp32" for bf16 (the engine keeps no bf16 KV).
  std::string kv_dtype = "fp8";
  // model.backend ("auto" | "cpu" | "cuda") and model.weight_dtype ("auto" | "bf16" | "fp32"),
  // named as the engine names them; "auto" leaves the choice to each node's agent.
  std::string backend = "auto";
  std::string weight_dtype = "auto";
  int max_num_seqs = 0;
  int max_model_len = 0;
  CanarySettings canary;
  LifecycleSettings lifecycle;
  // Start: bound on forming a replica's groups, and on one group operation.
  Clock::Duration connect_timeout = std::chrono::seconds(60);
  Clock::Duration op_timeout = std::chrono::seconds(30);

  const NodeEndpoint* FindNode(const std::string& name) const {
    for (const auto& n : nodes)
      if (n.name == name) return &n;
    return nullptr;
  }
};

}  // namespace glm::orchestrate
