// Decode steps on a device backend as CUDA graphs: persistent device tables for the
// step's [B] int inputs, and a cache of captured graphs keyed by (batch size, key-count bucket).
// The key slots of the cached positions are not copied here: they live in the model's SlotArena
// (slot_arena.h), whose address Upload is told; a different address drops every graph.
//
// Why a step can be replayed: everything a decode step launches is a function of the batch size
// B and of host values that are fixed within a key bucket:
// - the [B] int tables (tokens, positions, new KV slots, row offsets, key counts) live at fixed
//   device addresses (Upload, one host->device copy issued before the graph runs, outside the
//   captured region), and so do the key slots (the arena, updated before the graph runs);
// - the ops get KeyTable::max_num_keys = KeyBucket(true max), a power of two, and read the true
//   per-row key counts from the device tables (IndexerTopK sizes its score scratch and grid from
//   max_num_keys and skips keys past each row's count; Attention over DSA indices depends on
//   index_topk only), so results are bitwise those of the exact value;
// - the model's Workspace carves the same addresses for the same B, and the backend's scratch
//   does not move while scratch_epoch() is unchanged.
// B is not padded to a bucket: padding would change the GEMMs' M (cuBLASLt may pick another
// algorithm, so the real rows would no longer be bitwise those of an eager step) and would need
// a KV slot no sequence owns for the padding rows' writes. One graph per distinct B <= kMaxBatch.
//
// Run(): the first step of a key runs eagerly (growing workspace and scratch to the step's size;
// its output is the step's result), then the same step is captured (nothing runs). Later steps of
// the key replay. A graph whose scratch epoch is stale, or any graph after the key-slot arena
// moved (it grew), is dropped and recaptured. Not thread-safe (the model's step thread); stats()
// may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/model/model_runtime.h"

namespace glm::engine {

class DecodeGraphs {
 public:
  static constexpr int kMaxBatch = 64;

  // Device pointers into the persistent table buffer, and the arena's key slots.
  struct Tables {
    const int32_t* tokens = nullptr;        // [B]
    const int32_t* positions = nullptr;     // [B]
    const int32_t* new_slots = nullptr;     // [B]
    const int32_t* row_offset = nullptr;    // [B]
    const int32_t* row_num_keys = nullptr;  // [B]
    const int32_t* key_slots = nullptr;     // the arena (row_offset indexes it)
  };

  explicit DecodeGraphs(Backend* backend) : backend_(backend) {}

  // max_num_keys rounded up to a power of two, at least 64.
  static int32_t KeyBucket(int32_t max_num_keys);

  // Copies the step's tables (each [B] with B <= kMaxBatch) into the persistent buffer with one
  // host->device copy. key_slots: the backend address of the key-slot table (SlotArena::slots(),
  // already up to date); when it differs from the previous call's, every graph is dropped.
  Tables Upload(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                const std::vector<int32_t>& new_slots, const std::vector<int32_t>& row_offset,
                const std::vector<int32_t>& row_num_keys, const int32_t* key_slots);

  // Runs `body` (the enqueueing of one decode step; must be deterministic in B and key_bucket)
  // eagerly when !use_graphs, else replays or captures as described above. Errors: the
  // backend's status after a failed eager run or capture.
  absl::Status Run(int batch, int32_t key_bucket, bool use_graphs,
                   const std::function<void()>& body);

  DecodeGraphStats stats() const;
  // Drops every graph (memory they reference is about to move).
  void Clear();

 private:
  struct Entry {
    std::unique_ptr<BackendGraph> graph;
    int64_t epoch = 0;  // Epoch() at capture
  };
  // The backend's scratch epoch (scratch growth, kernel policy): a graph captured under an older
  // one is recaptured.
  int64_t Epoch() const;
  Backend* backend_;
  std::unique_ptr<Buffer> tables_;  // [5 * kMaxBatch] int32
  std::vector<int32_t> staging_;    // host image of tables_
  const int32_t* key_slots_ = nullptr;  // the key-slot table the graphs were captured with
  std::map<std::pair<int, int32_t>, Entry> graphs_;
  std::atomic<int64_t> decode_steps_{0}, eager_steps_{0}, captures_{0}, replays_{0},
      invalidations_{0}, num_graphs_{0};
};

}  // namespace glm::engine
