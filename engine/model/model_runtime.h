// What a loaded model reports about its device at run time: the memory plan made at
// load (weights / activations / KV) and the decode CUDA-graph counters. Plain values; a Model
// returns them by value (engine/model/forward_batch.h).
#pragma once

#include <cstdint>
#include <string>

namespace glm::engine {

// The memory plan of a model on one device, fixed at load. Byte counts are measured from the
// device's free memory (cudaMemGetInfo) around each phase, except the reserves, which are
// computed. `measured` is false on backends that report no device memory (cpu): then only the
// KV fields are set.
struct MemoryPlan {
  bool measured = false;
  int64_t device_total_bytes = 0;
  int64_t device_free_bytes_before = 0;  // when the model started loading (backend created)
  int64_t weights_bytes = 0;             // loading the parameters
  int64_t activation_bytes = 0;          // workspace + op scratch after the warm-up steps
  int64_t backend_workspace_bytes = 0;   // fixed at backend creation (cuBLASLt workspace)
  int64_t graph_reserve_bytes = 0;       // held back for decode graphs and their tables
  int64_t indexer_reserve_bytes = 0;     // indexer score scratch at the longest context
  int64_t kv_bytes = 0;                  // paged KV storage allocated
  int64_t slot_table_bytes = 0;          // the key-slot arena reserved at load (slot_arena.h)
  int64_t kv_bytes_per_block = 0;
  int kv_num_blocks = 0;
  int kv_block_size = 0;
  int64_t max_tokens = 0;                // kv_num_blocks * kv_block_size
  double memory_fraction = 0;            // the budget used, 0 when sized from bytes / blocks
  int warmup_num_seqs = 0;               // decode batch of the warm-up (0: no warm-up ran)
  int warmup_tokens = 0;                 // prefill tokens of the warm-up
  std::string source;                    // "kv_num_blocks", "kv_cache_bytes" or "memory_fraction"

  // One line: key=value pairs in MiB (the INFO line at load, glm-run --report-memory).
  std::string ToString() const;
};

// Decode steps run through engine/model/decode_graphs.h (device backends): how many were run
// eagerly (graphs off, or the warm-up run before a capture), captured, replayed, and how many
// captured graphs were dropped because memory they use moved (scratch growth, a larger table).
struct DecodeGraphStats {
  int64_t decode_steps = 0;
  int64_t eager_steps = 0;
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t invalidations = 0;
  int64_t num_graphs = 0;  // live graphs
};

}  // namespace glm::engine
