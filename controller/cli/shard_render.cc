#include "controller/cli/shard_render.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/human_bytes.h"

namespace glm::cli {
namespace {

// "Loaded", "Loading", ... from SHARD_STATE_*.
std::string ShardStateWord(glm::v1::ShardState s) {
  std::string name = glm::v1::ShardState_Name(s);
  const size_t prefix = strlen("SHARD_STATE_");
  if (name.size() <= prefix) return "-";
  std::string out;
  for (size_t i = prefix; i < name.size(); ++i) {
    char c = name[i];
    out.push_back(i == prefix ? c : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

bool HasShard(const glm::v1::NodeStatus& n) {
  return n.has_shard() && n.shard().state() != glm::v1::SHARD_STATE_UNSPECIFIED &&
         n.shard().state() != glm::v1::SHARD_STATE_NONE;
}

std::string PageCacheCell(const glm::v1::PageCacheStatus& p) {
  std::string cell = absl::StrCat(p.policy().empty() ? "off" : p.policy(), ": fadvise freed ",
                                  HumanBytes(p.fadvise_bytes_freed()), " (", p.fadvise_ranges(),
                                  " ranges), drop_caches ", p.drop_caches_count());
  if (p.drop_caches_count() > 0) {
    absl::StrAppend(&cell, " (", HumanBytes(p.drop_caches_bytes_freed()), ")");
  }
  if (p.drop_not_permitted()) absl::StrAppend(&cell, ", drop NOT PERMITTED");
  return cell;
}

}  // namespace

nlohmann::json ShardToJson(const glm::v1::NodeStatus& node) {
  if (!HasShard(node)) return nullptr;
  const glm::v1::ShardStatus& s = node.shard();
  const glm::v1::PageCacheStatus& p = s.page_cache();
  return {{"state", ShardStateWord(s.state())},
          {"model_dir", s.model_dir()},
          {"layers", {s.layer_begin(), (s.layer_end() - 1)}},
          {"pp_rank", s.pp_rank()},
          {"tp_rank", s.tp_rank()},
          {"tp_size", s.tp_size()},
          {"tp_replicated", s.tp_replicated()},
          {"tp_note", s.tp_note()},
          {"tp_transport", s.tp_transport()},
          {"bytes_loaded", s.bytes_loaded()},
          {"bytes_total", s.bytes_total()},
          {"tensors_loaded", s.tensors_loaded()},
          {"tensors_total", s.tensors_total()},
          {"load_time_ms", s.load_time_ms()},
          {"weight_memory_bytes", s.weight_memory_bytes()},
          {"kv_cache_bytes", s.kv_cache_bytes()},
          {"kv_capacity_tokens", s.kv_capacity_tokens()},
          {"backend", s.backend()},
          {"weight_dtype", s.weight_dtype()},
          {"kv_dtype", s.kv_dtype()},
          {"pp_size", s.pp_size()},
          {"head", s.head()},
          {"group_key", s.group_key()},
          {"steps", s.steps()},
          {"group_messages", s.group_messages()},
          {"kv_cache_usage", s.kv_cache_usage()},
          {"tokens_per_second", s.tokens_per_second()},
          {"requests_in_flight", s.requests_in_flight()},
          {"steps_in_flight", s.steps_in_flight()},
          {"max_steps_in_flight_observed", s.max_steps_in_flight_observed()},
          {"stage_busy_fraction", s.stage_busy_fraction()},
          {"last_error", s.last_error()},
          {"page_cache",
           {{"policy", p.policy()},
            {"fadvise_bytes_freed", p.fadvise_bytes_freed()},
            {"fadvise_ranges", p.fadvise_ranges()},
            {"drop_caches_count", p.drop_caches_count()},
            {"drop_caches_bytes_freed", p.drop_caches_bytes_freed()},
            {"drop_not_permitted", p.drop_not_permitted()},
            {"drop_not_permitted_message", p.drop_not_permitted_message()},
            {"last_drop_reason", p.last_drop_reason()}}}};
}

void PrintShardTable(std::ostream& out, const glm::v1::ClusterStatus& status) {
  std::vector<std::vector<std::string>> rows = {{"SHARD", "STATE", "LAYERS", "TP", "LOADED",
                                                 "LOAD TIME", "KV CACHE", "PAGE CACHE"}};
  std::vector<std::string> notes;
  int tp_copies = 0;
  for (const auto& n : status.nodes()) {
    if (!HasShard(n)) continue;
    const glm::v1::ShardStatus& s = n.shard();
    // "1/2 nccl", "1/2 gloo": the transport's first word; the reason goes to the notes.
    const std::string& transport = s.tp_transport();
    std::string tp = s.tp_size() > 1
                         ? absl::StrCat(s.tp_rank(), "/", s.tp_size(),
                                        s.tp_replicated() ? " full copy" : "",
                                        transport.empty() ? "" : " ",
                                        transport.substr(0, transport.find(' ')))
                         : "-";
    if (s.tp_size() > 1 && s.tp_rank() == 0 && transport.find(' ') != std::string::npos) {
      notes.push_back(absl::StrCat(n.name(), ": pp stage ", s.pp_rank(), " tp transport: ",
                                   transport));
    }
    rows.push_back({n.name(), ShardStateWord(s.state()),
                    absl::StrCat(s.layer_begin(), "-", (s.layer_end() - 1)), tp,
                    absl::StrCat(HumanBytes(s.bytes_loaded()), "/", HumanBytes(s.bytes_total()),
                                 " (", s.tensors_loaded(), "/", s.tensors_total(), " tensors)"),
                    absl::StrFormat("%.2fs", s.load_time_ms() / 1000.0),
                    s.kv_cache_bytes() > 0
                        ? absl::StrCat(HumanBytes(s.kv_cache_bytes()), " (",
                                       s.kv_capacity_tokens(), " tok)")
                        : "-",
                    PageCacheCell(s.page_cache())});
    if (s.tp_replicated()) tp_copies = std::max(tp_copies, s.tp_size());
    if (s.page_cache().drop_not_permitted()) {
      notes.push_back(absl::StrCat(n.name(), ": ", s.page_cache().drop_not_permitted_message()));
    }
    if (s.state() == glm::v1::SHARD_STATE_FAILED && !s.last_error().empty()) {
      notes.push_back(absl::StrCat(n.name(), " load failed: ", s.last_error()));
    }
  }
  if (rows.size() == 1) {
    out << "shards: none loaded yet\n";
    return;
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) {
      out << std::left << std::setw(static_cast<int>(i + 1 == r.size() ? 0 : width[i] + 2))
          << r[i];
    }
    out << "\n";
  }
  if (tp_copies > 1) {
    out << "  note: TP is not sharded yet: each of the " << tp_copies
        << " TP ranks of a stage holds the stage's full layers (" << tp_copies
        << " identical copies, " << tp_copies << "x the plan's weight memory)\n";
  }
  for (const auto& line : notes) out << "  " << line << "\n";
}

}  // namespace glm::cli
