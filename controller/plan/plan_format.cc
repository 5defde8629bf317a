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

std::string GB(double bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }
std::string Rate(double bytes_per_s) {
  if (bytes_per_s >= 1e12) return absl::StrFormat("%.2f TB/s", bytes_per_s / 1e12);
  return absl::StrFormat("%.1f GB/s", bytes_per_s / 1e9);
}
std::string Ms(double seconds) { return absl::StrFormat("%.2f ms", seconds * 1e3); }

// The decode projection with every input, so the arithmetic can be checked by hand.
void AppendDecode(const Plan& plan, std::string* out) {
  const DecodeProjection& d = plan.decode;
  if (!d.made) return;  // the note says what to set
  absl::StrAppend(out, "\ndecode projection, one sequence per replica (controller/plan/"
                       "decode_projection.h): routed experts read ",
                  d.num_experts_per_tok, " of ", d.n_routed_experts, " per MoE layer\n");
  const std::string link = absl::StrCat(Rate(d.link_bandwidth_bytes_per_s),
                                        d.link_bandwidth_assumed ? " (assumed; set fabric.link_bandwidth)" : "");
  const std::string latency = absl::StrCat(absl::StrFormat("%.1f µs", d.hop_latency_us),
                                           d.hop_latency_assumed ? " (assumed; set fabric.hop_latency_us)" : "");
  for (const auto& r : d.replicas) {
    if (plan.replicas > 1) absl::StrAppend(out, "replica ", r.replica, ":\n");
    absl::StrAppend(out, "  ", Pad("stage", 6), " ", Pad("node", 12), " ", Pad("bytes/token/rank", 17),
                    " ", Pad("bandwidth", 11), " ", Pad("efficiency", 19), " time\n");
    for (const auto& s : r.stages) {
      absl::StrAppend(
          out, "  ", Pad(absl::StrCat(s.pp_rank), 6), " ", Pad(s.node, 12), " ",
          Pad(GB(static_cast<double>(s.bytes_per_token)), 17), " ",
          Pad(Rate(s.memory_bandwidth_bytes_per_s), 11), " ",
          Pad(absl::StrFormat("%.3f%s", s.efficiency, s.efficiency_measured ? " (measured)" : ""), 19),
          " ", Ms(s.seconds), "\n");
    }
    absl::StrAppend(out, "  compute: Σ bytes / (bandwidth × efficiency) = ", Ms(r.compute_seconds),
                    "\n");
    if (r.allreduces_per_token > 0) {
      absl::StrAppend(out, "  all-reduce: ", r.allreduces_per_token, " per token (2 per layer) × ",
                      absl::StrFormat("%.1f µs", r.allreduce_seconds * 1e6), " (ring over TP",
                      plan.tensor, ": 2×", plan.tensor - 1, " × (latency ", latency, " + ",
                      d.activation_bytes_per_token, " B / ", plan.tensor, " at ", link, ")) = ",
                      Ms(r.allreduces_per_token * r.allreduce_seconds), "\n");
    }
    if (r.hops_per_token > 0) {
      absl::StrAppend(out, "  hops: ", r.hops_per_token, " per step (step broadcast",
                      plan.pipeline > 1
                          ? absl::StrCat(", ", plan.pipeline - 1, " activation hand-off(s) of ",
                                         d.activation_bytes_per_token, " B",
                                         d.shared_indexer_boundaries > 0
                                             ? absl::StrCat(" (+", d.topk_bytes_per_token,
                                                            " B of top-k at ",
                                                            d.shared_indexer_boundaries,
                                                            " shared-indexer boundary)")
                                             : std::string(),
                                         ", result")
                          : std::string(),
                      ") × latency ", latency, plan.pipeline > 1 ? absl::StrCat(", link ", link) : "",
                      " = ", Ms(r.hop_seconds), "\n");
    }
    absl::StrAppend(out, "  step ", Ms(r.step_seconds), ": ",
                    absl::StrFormat("%.1f tokens/s", r.tokens_per_s), " without MTP\n");
    if (plan.pipeline > 1) {
      const DecodeStageProjection& busiest = r.stages[r.busiest_stage];
      absl::StrAppend(out, "  micro-batches: ", r.micro_batches,
                      " steps in flight (parallel.micro_batches, default pipeline, at most max_num_seqs): ",
                      r.micro_batches, " sequences make ",
                      absl::StrFormat("%.1f tokens/s", r.pipelined_tokens_per_s),
                      " together; the busiest stage, ", r.busiest_stage, " on ", busiest.node,
                      ", is busy ", Ms(r.busiest_stage_seconds), " per step\n");
    }
    if (d.mtp_draft_tokens > 0) {
      const int k = d.mtp_draft_tokens;
      absl::StrAppend(
          out, "  MTP k = ", k, ", acceptance r = ", absl::StrFormat("%.3f", d.mtp_acceptance_rate),
          " of drafts = per position a ", absl::StrFormat("%.3f", d.mtp_acceptance),
          d.mtp_acceptance_assumed
              ? " (assumed a; `glmctl plan --mtp-acceptance R` takes the r that `glmctl status` "
                "measures)"
              : " (r from --mtp-acceptance)",
          ": tokens/step = 1 + k r = 1 + a + ... + a^", k, " = ",
          absl::StrFormat("%.2f", r.tokens_per_step), "\n");
      const DecodeStageProjection& last = r.stages.back();
      absl::StrAppend(out, "    step = verify ", Ms(r.verify_seconds), " + ", k, " × draft pass ",
                      Ms(r.mtp_pass_seconds), " (MTP layer + lm_head = ",
                      GB(static_cast<double>(last.mtp_bytes_per_pass)), "/rank, + messages) = ",
                      Ms(r.mtp_step_seconds), ": ",
                      absl::StrFormat("%.1f tokens/s", r.mtp_tokens_per_s), "\n");
      absl::StrAppend(out, "    low (verify reads the distinct experts of ", k + 1,
                      " uniformly routed tokens, ",
                      GB(static_cast<double>(last.verify_bytes_uniform)), "/rank on stage ",
                      last.pp_rank, "): verify ", Ms(r.verify_seconds_uniform), ": ",
                      absl::StrFormat("%.1f tokens/s", r.mtp_tokens_per_s_uniform), "\n");
    }
  }
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
  AppendDecode(plan, &out);
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
  const DecodeProjection& d = plan.decode;
  nlohmann::json decode = {{"made", d.made}};
  if (d.made) {
    decode["link_bandwidth_bytes_per_s"] = d.link_bandwidth_bytes_per_s;
    decode["link_bandwidth_assumed"] = d.link_bandwidth_assumed;
    decode["hop_latency_us"] = d.hop_latency_us;
    decode["hop_latency_assumed"] = d.hop_latency_assumed;
    decode["activation_bytes_per_token"] = d.activation_bytes_per_token;
    decode["topk_bytes_per_token"] = d.topk_bytes_per_token;
    decode["shared_indexer_boundaries"] = d.shared_indexer_boundaries;
    decode["num_experts_per_tok"] = d.num_experts_per_tok;
    decode["n_routed_experts"] = d.n_routed_experts;
    decode["mtp_draft_tokens"] = d.mtp_draft_tokens;
    decode["mtp_acceptance"] = d.mtp_acceptance;
    decode["mtp_acceptance_rate"] = d.mtp_acceptance_rate;
    decode["mtp_acceptance_assumed"] = d.mtp_acceptance_assumed;
    decode["replicas"] = nlohmann::json::array();
    for (const auto& r : d.replicas) {
      nlohmann::json stages = nlohmann::json::array();
      for (const auto& s : r.stages) {
        stages.push_back({{"pp_rank", s.pp_rank},
                          {"node", s.node},
                          {"bytes_per_token", s.bytes_per_token},
                          {"mtp_bytes_per_pass", s.mtp_bytes_per_pass},
                          {"verify_bytes_uniform", s.verify_bytes_uniform},
                          {"memory_bandwidth_bytes_per_s", s.memory_bandwidth_bytes_per_s},
                          {"efficiency", s.efficiency},
                          {"efficiency_measured", s.efficiency_measured},
                          {"seconds", s.seconds}});
      }
      nlohmann::json rj = {{"replica", r.replica},
                           {"stages", stages},
                           {"compute_seconds", r.compute_seconds},
                           {"allreduces_per_token", r.allreduces_per_token},
                           {"allreduce_seconds", r.allreduce_seconds},
                           {"hops_per_token", r.hops_per_token},
                           {"hop_seconds", r.hop_seconds},
                           {"step_seconds", r.step_seconds},
                           {"tokens_per_s", r.tokens_per_s},
                           {"micro_batches", r.micro_batches},
                           {"busiest_stage", r.busiest_stage},
                           {"busiest_stage_seconds", r.busiest_stage_seconds},
                           {"pipelined_tokens_per_s", r.pipelined_tokens_per_s}};
      if (d.mtp_draft_tokens > 0) {
        rj["mtp"] = {{"tokens_per_step", r.tokens_per_step},
                     {"verify_seconds", r.verify_seconds},
                     {"verify_seconds_uniform", r.verify_seconds_uniform},
                     {"draft_pass_seconds", r.mtp_pass_seconds},
                     {"step_seconds", r.mtp_step_seconds},
                     {"tokens_per_s", r.mtp_tokens_per_s},
                     {"tokens_per_s_uniform", r.mtp_tokens_per_s_uniform}};
      }
      decode["replicas"].push_back(std::move(rj));
    }
  } else {
    decode["not_made"] = d.not_made;
  }
  j["decode_projection"] = std::move(decode);
  j["notes"] = plan.notes;
  return j;
}

}  // namespace glm::controller
