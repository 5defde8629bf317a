#include "controller/orchestrate/spec_adapter.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/manifest/file_hash.h"
#include "cluster/manifest/hash_cache.h"
#include "cluster/manifest/manifest.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "controller/plan/plan.h"

namespace glm::orchestrate {

ClusterTopology TopologyFromSpec(const cluster::ClusterSpec& spec, const std::string& path) {
  ClusterTopology t;
  t.cluster_name = spec.name;
  t.config_path = path;
  t.controller_listen = spec.controller.listen;
  t.gateway_listen = spec.controller.gateway;
  t.api_key_file =
      spec.controller.api_key_file.empty() ? "" : spec.ResolvePath(spec.controller.api_key_file);
  t.insecure = spec.controller.insecure;
  t.gateway_queue_max = spec.controller.gateway_queue.max_requests;
  t.gateway_queue_timeout_s = spec.controller.gateway_queue.timeout_s;
  t.local = spec.local;
  for (const auto& n : spec.nodes) {
    NodeEndpoint e;
    e.name = n.name;
    e.address = n.agent;
    e.fabric_ip = n.fabric_ip;
    e.hca = n.hca;
    e.hca_port = n.port;
    e.gid_index = n.gid_index;
    e.netdev = n.netdev;
    e.gpu = n.gpu;
    t.nodes.push_back(std::move(e));
  }
  t.fabric_mtu = spec.fabric.mtu.value_or(0);
  t.nccl_library = spec.nccl.library.empty() ? "" : spec.ResolvePath(spec.nccl.library);
  t.nccl_source = spec.nccl.source.empty() ? "" : spec.ResolvePath(spec.nccl.source);
  t.nccl_expected_version = spec.nccl.expected_version;
  if (spec.controller.tls) {
    t.tls.ca = spec.ResolvePath(spec.controller.tls->ca);
    t.tls.cert = spec.ResolvePath(spec.controller.tls->cert);
    t.tls.key = spec.ResolvePath(spec.controller.tls->key);
  }
  t.model_dir = spec.ResolvePath(spec.model.path);
  // Production clusters need a GPU on every node unless model.backend is cpu; the local demo
  // runs on the CPU backend (with backend cuda, a GPU-less node fails its load, naming the field).
  t.require_gpu = !spec.local && spec.model.backend != cluster::EngineBackend::kCpu;
  t.tensor = spec.parallel.tensor;
  t.pipeline = spec.parallel.pipeline;
  t.micro_batches = spec.parallel.micro_batches;
  t.mtp = spec.model.mtp_draft_tokens > 0;
  t.mtp_draft_tokens = spec.model.mtp_draft_tokens;
  t.page_cache.policy = std::string(cluster::PageCachePolicyName(spec.page_cache.policy));
  t.page_cache.interval_s = spec.page_cache.interval_s;
  t.page_cache.min_available_bytes = spec.page_cache.min_available_bytes.value_or(0);
  t.kv_dtype = spec.model.kv_cache_dtype == cluster::KvCacheDtype::kFp8 ? "fp8" : "fp32";
  t.backend = std::string(cluster::EngineBackendName(spec.model.backend));
  t.weight_dtype = std::string(cluster::WeightDtypeName(spec.model.weight_dtype));
  t.max_num_seqs = spec.model.max_num_seqs;
  t.max_model_len = static_cast<int>(spec.model.max_model_len);
  t.served_name = spec.model.served_name;  // the spec defaults it to the path's last element
  const cluster::CanarySpec& canary = spec.model.canary;
  t.canary.configured = canary.present;
  t.canary.prompt = canary.prompt;
  t.canary.prompt_ids = canary.prompt_ids;
  t.canary.expect = canary.expect;
  t.canary.expect_ids = canary.expect_ids;
  t.canary.max_tokens = canary.max_tokens;
  auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(s));
  };
  t.lifecycle.restart_budget = spec.lifecycle.restart_budget;
  t.lifecycle.restart_window = seconds(spec.lifecycle.restart_window_s);
  t.lifecycle.drain_timeout = seconds(spec.lifecycle.drain_timeout_s);
  return t;
}

absl::StatusOr<ClusterTopology> LoadTopology(const std::string& path) {
  absl::StatusOr<cluster::ClusterSpec> spec = cluster::LoadClusterSpec(path);
  if (!spec.ok()) return spec.status();
  ClusterTopology t = TopologyFromSpec(*spec, path);
  // Per-node requirements for preflight, when the plan can be made already (the Plan step
  // reports why when it cannot).
  if (absl::StatusOr<controller::Plan> plan = controller::PlanFromFiles(path); plan.ok()) {
    std::map<std::string, const controller::PlanNode*> by_name;
    for (const auto& n : plan->nodes) by_name[n.name] = &n;
    for (auto& node : t.nodes) {
      auto it = by_name.find(node.name);
      if (it == by_name.end()) continue;
      node.required_disk_bytes = it->second->weight_bytes;
      node.required_memory_bytes =
          it->second->weight_bytes + it->second->kv_cache_bytes + it->second->reserve_bytes;
      node.replica = it->second->replica;
      node.pp_rank = it->second->pp_rank;
      node.tp_rank = it->second->tp_rank;
      node.kv_cache_bytes = it->second->kv_cache_bytes;
    }
    t.mtp = plan->mtp;
    // The shard each node stages (Stage phase): its PP stage's layer range.
    for (const auto& stage : plan->stages) {
      for (const auto& name : stage.nodes) {
        for (auto& node : t.nodes) {
          if (node.name != name) continue;
          node.layer_begin = stage.first_layer;
          node.layer_end = stage.last_layer + 1;
          node.first_stage = stage.has_embedding;
          node.last_stage = stage.has_lm_head;
        }
      }
    }
  }
  return t;
}

absl::StatusOr<std::string> SourceManifestJson(const ClusterTopology& topology,
                                               cluster::HashCache* cache) {
  std::error_code ec;
  if (topology.model_dir.empty() || !std::filesystem::is_directory(topology.model_dir, ec)) {
    return std::string();  // not on this machine: each agent verifies its own copy.
  }
  const int misses_before = cache != nullptr ? cache->misses() : 0;
  absl::StatusOr<cluster::Manifest> manifest = cluster::BuildManifest(topology.model_dir, cache);
  if (cache != nullptr) {
    if (absl::Status s = cache->Save(); !s.ok()) {
      GLM_LOG_WARN("hash cache not saved ({}); the next up hashes again", glm::ToStd(s.message()));
    }
    GLM_LOG_INFO("source manifest dir={} files_hashed={}", topology.model_dir,
                 cache->misses() - misses_before);
  }
  if (!manifest.ok()) return manifest.status();
  return manifest->ToJson().dump();
}

absl::StatusOr<std::optional<NcclSourceFile>> ControllerNcclSource(
    const ClusterTopology& topology, cluster::HashCache* cache) {
  if (topology.nccl_library.empty()) return std::optional<NcclSourceFile>();
  const std::string path = topology.nccl_source.empty() ? topology.nccl_library
                                                        : topology.nccl_source;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (!topology.nccl_source.empty()) {
      return absl::NotFoundError(absl::StrCat("nccl.source ", path,
                                              " does not exist on the controller's host"));
    }
    return std::optional<NcclSourceFile>();  // the nodes' copies decide
  }
  absl::StatusOr<cluster::FileHash> h =
      cache != nullptr ? cache->Hash(path) : cluster::HashFile(path);
  if (!h.ok()) return h.status();
  if (cache != nullptr) cache->Save().IgnoreError();
  return std::optional<NcclSourceFile>(NcclSourceFile{path, h->xxh3_128, h->size});
}

std::string ControllerStateDir(const ClusterTopology& topology, const std::string& flag) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (!flag.empty()) {
    candidates.push_back(flag);
  } else {
    std::error_code ec;
    candidates.push_back(fs::absolute(topology.config_path, ec).parent_path() / ".glmctl" /
                         topology.cluster_name);
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
      candidates.push_back(fs::path(xdg) / "glmctl" / topology.cluster_name);
    }
    if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
      candidates.push_back(fs::path(home) / ".cache" / "glmctl" / topology.cluster_name);
    }
  }
  for (const fs::path& dir : candidates) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (fs::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) == 0) return dir.string();
  }
  return "";
}

absl::StatusOr<PlanStep::Outcome> PlanReplicas(const std::string& config_path,
                                               const ClusterTopology& topology) {
  absl::StatusOr<controller::Plan> plan = controller::PlanFromFiles(config_path);
  if (!plan.ok()) return plan.status();
  PlanStep::Outcome out;
  out.replicas.resize(plan->replicas);
  for (const auto& n : plan->nodes) {  // rank order
    if (n.replica < 0 || n.replica >= plan->replicas) {
      return absl::InternalError(absl::StrCat("plan puts node '", n.name, "' in replica ",
                                              n.replica, " of ", plan->replicas));
    }
    out.replicas[n.replica].push_back(n.name);
  }
  if (plan->nodes.size() != topology.nodes.size()) {
    return absl::InternalError(absl::StrCat("plan has ", plan->nodes.size(), " nodes, ",
                                            config_path, " lists ", topology.nodes.size()));
  }
  std::vector<std::string> stages;
  for (const auto& s : plan->stages) {
    stages.push_back(absl::StrCat("pp", s.pp_rank, " layers ", s.first_layer, "-", s.last_layer));
  }
  out.summary = absl::StrCat(
      "plan: TP", plan->tensor, " x PP", plan->pipeline, " x ", plan->replicas, " replica(s); ",
      absl::StrJoin(stages, ", "), "; max context ", plan->max_context_tokens, " tokens",
      plan->fits ? "" : " (max_model_len x max_num_seqs does NOT fit: see glmctl plan)");
  return out;
}

absl::StatusOr<std::string> PlanText(const std::string& config_path, bool json) {
  absl::StatusOr<controller::Plan> plan = controller::PlanFromFiles(config_path);
  if (!plan.ok()) return plan.status();
  return json ? controller::PlanToJson(*plan).dump(2) : controller::PlanToText(*plan);
}

rpc::TlsFiles NodeTlsFiles(const ClusterTopology& topology, const std::string& node) {
  rpc::TlsFiles files;
  if (!topology.tls.enabled()) return files;
  std::filesystem::path dir = std::filesystem::path(topology.tls.ca).parent_path();
  files.ca = topology.tls.ca;
  files.cert = (dir / (node + ".pem")).string();
  files.key = (dir / (node + ".key")).string();
  return files;
}

}  // namespace glm::orchestrate
