#include "engine/model/model_runtime.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace glm::engine {
namespace {

std::string MiB(int64_t bytes) { return absl::StrFormat("%.1fMiB", bytes / 1048576.0); }

}  // namespace

std::string MemoryPlan::ToString() const {
  std::string s;
  if (measured) {
    absl::StrAppend(&s, "device_total=", MiB(device_total_bytes),
                    " free_before_load=", MiB(device_free_bytes_before),
                    " weights=", MiB(weights_bytes), " activations=", MiB(activation_bytes),
                    " backend_workspace=", MiB(backend_workspace_bytes),
                    " graph_reserve=", MiB(graph_reserve_bytes),
                    " indexer_reserve=", MiB(indexer_reserve_bytes), " ");
  }
  absl::StrAppend(&s, "kv=", MiB(kv_bytes), " slot_table=", MiB(slot_table_bytes),
                  " kv_blocks=", kv_num_blocks,
                  " block_size=", kv_block_size, " kv_bytes_per_block=", kv_bytes_per_block,
                  " max_tokens=", max_tokens, " sized_from=", source.empty() ? "-" : source);
  if (memory_fraction > 0) absl::StrAppend(&s, absl::StrFormat(" fraction=%.3f", memory_fraction));
  if (warmup_num_seqs > 0 || warmup_tokens > 0) {
    absl::StrAppend(&s, " warmup_decode_seqs=", warmup_num_seqs,
                    " warmup_prefill_tokens=", warmup_tokens);
  }
  return s;
}

}  // namespace glm::engine
