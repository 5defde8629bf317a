// Plan → human table and JSON.
#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"
#include "controller/plan/plan.h"

namespace glm::controller {
namespace {

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30));
}

std::string Tokens(int64_t tokens) {
  if (tokens >= 1000000) return absl::StrFormat("%.2fM", tokens / 1e6);
  if (tokens >= 1000) return absl::StrFormat("%.1fK", tokens / 1e3);
  return absl::StrCat(tokens);
}

std::string Pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace

std::string PlanToText(const Plan& plan) {
  std::string out;
  absl::StrAppend(&out, "cluster ", plan.cluster_name, ": ", plan.served_name, ", ",
                  plan.world_size, " ranks = ", plan.replicas, " replica(s) × PP", plan.pipeline,
                  " × TP", plan.tensor, "\n");
  absl::StrAppend(&out, "checkpoint ", GiB(plan.total_weight_bytes), " (",
                  ToAbsl(WeightSourceName(plan.weight_source)), "); KV ",
                  ToAbsl(cluster::KvCacheDtypeName(plan.kv_cache_dtype)), ", ",
                  plan.model_kv_bytes_per_token, " B/token for all layers",
                  plan.mtp ? " incl. MTP" : "", "\n");
  // What "auto" weights become on the backend (the agent's choice, shard_host.cc).
  std::string_view auto_weights = " (cuda: fp8 stays fp8, else bf16; cpu: fp32)";
  if (plan.backend == cluster::EngineBackend::kCpu) auto_weights = " (fp32 on cpu)";
  if (plan.backend == cluster::EngineBackend::kCuda) auto_weights = " (fp8 stays fp8, else bf16)";
  absl::StrAppend(&out, "engine: backend ", ToAbsl(cluster::EngineBackendName(plan.backend)),
                  plan.backend == cluster::EngineBackend::kAuto ? " (cuda where usable, else cpu)"
                                                                : "",
                  ", weights ", ToAbsl(cluster::WeightDtypeName(plan.weight_dtype)),
                  plan.weight_dtype == cluster::WeightDtype::kAuto ? ToAbsl(auto_weights) : "",
                  "\n");
  absl::StrAppend(&out, "layer partition [", absl::StrJoin(plan.layer_partition, ", "), "]",
                  plan.partition_proposed ? " (proposed)" : " (from cluster.yaml)", "\n\n");
  const std::vector<std::pair<std::string, size_t>> columns = {
      {"stage", 6}, {"layers", 10}, {"extras", 18}, {"weights/node", 13},
      {"KV B/token", 11}, {"KV tokens", 10}, {"nodes", 0}};
  for (const auto& [name, width] : columns) out += Pad(name, width) + (width ? " " : "");
  out += "\n";
  for (const auto& s : plan.stages) {
    std::vector<std::string> extras;
    if (s.has_embedding) extras.push_back("embed");
    if (s.has_lm_head) extras.push_back("norm+head");
    if (s.has_mtp) extras.push_back("mtp");
    std::vector<std::string> cells = {absl::StrCat(s.pp_rank),
                                      absl::StrCat(s.first_layer, "-", s.last_layer),
                                      extras.empty() ? "-" : absl::StrJoin(extras, ","),
                                      GiB(s.weight_bytes),
                                      absl::StrCat(s.kv_bytes_per_token),
                                      Tokens(s.kv_capacity_tokens),
                                      absl::StrJoin(s.nodes, ",")};
    for (size_t i = 0; i < cells.size(); ++i) {
      out += Pad(cells[i], columns[i].second) + (columns[i].second ? " " : "");
    }
    out += "\n";
  }
  out += "\n";
  out += Pad("node", 14) + " " + Pad("rank", 5) + " " + Pad("replica", 8) + " " + Pad("pp", 3) +
         " " + Pad("tp", 3) + " " + Pad("budget", 10) + " " + Pad("usable", 10) + " " +
         Pad("weights", 10) + " " + Pad("reserve", 10) + " " + Pad("KV cache", 10) + " " +
         "KV tokens\n";
  for (const auto& n : plan.nodes) {
    out += Pad(n.name, 14) + " " + Pad(absl::StrCat(n.rank), 5) + " " +
           Pad(absl::StrCat(n.replica), 8) + " " + Pad(absl::StrCat(n.pp_rank), 3) + " " +
           Pad(absl::StrCat(n.tp_rank), 3) + " " + Pad(GiB(n.memory_budget_bytes), 10) + " " +
           Pad(GiB(n.usable_bytes), 10) + " " + Pad(GiB(n.weight_bytes), 10) + " " +
           Pad(GiB(n.reserve_bytes), 10) + " " + Pad(GiB(n.kv_cache_bytes), 10) + " " +
           Tokens(n.kv_capacity_tokens) + "\n";
  }
  out += "\n";
  absl::StrAppend(&out, "max_model_len ", plan.max_model_len, " × max_num_seqs ",
                  plan.max_num_seqs, " = ", plan.required_tokens, " tokens: ",
                  plan.fits ? "fits" : "does NOT fit", "\n");
  absl::StrAppend(&out, "largest context that fits: ", plan.max_context_tokens, " tokens\n");
  for (const auto& note : plan.notes) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

nlohmann::json PlanToJson(const Plan& plan) {
  nlohmann::json j;
  j["cluster"] = plan.cluster_name;
  j["served_name"] = plan.served_name;
  j["fits"] = plan.fits;
  j["max_context_tokens"] = plan.max_context_tokens;
  j["max_model_len"] = plan.max_model_len;
  j["max_num_seqs"] = plan.max_num_seqs;
  j["required_tokens"] = plan.required_tokens;
  j["max_position_embeddings"] = plan.max_position_embeddings;
  j["tensor"] = plan.tensor;
  j["pipeline"] = plan.pipeline;
  j["replicas"] = plan.replicas;
  j["world_size"] = plan.world_size;
  j["layer_partition"] = plan.layer_partition;
  j["partition_proposed"] = plan.partition_proposed;
  j["kv_cache_dtype"] = std::string(cluster::KvCacheDtypeName(plan.kv_cache_dtype));
  j["backend"] = std::string(cluster::EngineBackendName(plan.backend));
  j["weight_dtype"] = std::string(cluster::WeightDtypeName(plan.weight_dtype));
  j["mtp"] = plan.mtp;
  j["weight_source"] = std::string(WeightSourceName(plan.weight_source));
  j["total_weight_bytes"] = plan.total_weight_bytes;
  j["model_kv_bytes_per_token"] = plan.model_kv_bytes_per_token;
  j["stages"] = nlohmann::json::array();
  for (const auto& s : plan.stages) {
    j["stages"].push_back({{"pp_rank", s.pp_rank},
                           {"first_layer", s.first_layer},
                           {"last_layer", s.last_layer},
                           {"has_embedding", s.has_embedding},
                           {"has_lm_head", s.has_lm_head},
                           {"has_mtp", s.has_mtp},
                           {"num_full_indexer_layers", s.num_full_indexer_layers},
                           {"nodes", s.nodes},
                           {"weight_bytes", s.weight_bytes},
                           {"kv_bytes_per_token", s.kv_bytes_per_token},
                           {"kv_capacity_tokens", s.kv_capacity_tokens}});
  }
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : plan.nodes) {
    j["nodes"].push_back({{"name", n.name},
                          {"rank", n.rank},
                          {"replica", n.replica},
                          {"pp_rank", n.pp_rank},
                          {"tp_rank", n.tp_rank},
                          {"memory_budget_bytes", n.memory_budget_bytes},
                          {"usable_bytes", n.usable_bytes},
                          {"weight_bytes", n.weight_bytes},
                          {"reserve_bytes", n.reserve_bytes},
                          {"kv_cache_bytes", n.kv_cache_bytes},
                          {"kv_bytes_per_token", n.kv_bytes_per_token},
                          {"kv_capacity_tokens", n.kv_capacity_tokens}});
  }
  j["notes"] = plan.notes;
  return j;
}

}  // namespace glm::controller
