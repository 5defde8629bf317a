// `glmctl status` for engine shards: per node the shard's state, layers, TP position (and
// whether it is a full, unsharded copy), bytes loaded, load time, KV cache, and what the page
// cache manager did during the load (bytes freed by fadvise, drop_caches count, "not permitted").
#pragma once

#include <ostream>

#include "glm/v1/controller.pb.h"
#include "nlohmann/json.hpp"

namespace glm::cli {

// {"state", "layers": [first, last] (inclusive, for people; the wire is half-open), "pp_rank", "tp_rank", "tp_size", "tp_replicated",
//  "tp_note", "tp_transport", "bytes_loaded", "bytes_total", "tensors_loaded", "tensors_total",
//  "load_time_ms",
//  "weight_memory_bytes", "kv_cache_bytes", "kv_capacity_tokens", "backend", "last_error",
//  "page_cache": {"policy", "fadvise_bytes_freed", "fadvise_ranges", "drop_caches_count",
//  "drop_caches_bytes_freed", "drop_not_permitted", "drop_not_permitted_message",
//  "last_drop_reason"}}, or null when the node reported no shard.
nlohmann::json ShardToJson(const glm::v1::NodeStatus& node);

// One row per node with a shard (TP: "rank/size" and the transport, nccl or gloo), then notes
// (why a stage's TP group is not on NCCL, TP copies, drop_caches not permitted, load errors).
// Prints "shards: none loaded yet" when no node has one.
void PrintShardTable(std::ostream& out, const glm::v1::ClusterStatus& status);

}  // namespace glm::cli
