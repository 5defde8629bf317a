// The KV key-slot table of a step, kept in backend memory and updated incrementally.
//
// The ops read the cached keys of a query row t as slots[row_offset[t] + p], p < row_num_keys[t]
// (KeyTable, engine/backend/backend.h). The slot of position p of a sequence is a function of its
// block table only: block_table[p / block_size] * block_size + p % block_size. Rebuilding and
// uploading that list for every cached position of every sequence each step costs O(context)
// host work per step (1-8 M ints at batch 8-64 x 128K). Instead this arena keeps, per live
// seq_id, a region of one persistent buffer holding the slots of positions [0, len) of that
// sequence, and a host copy of the block ids they were computed from:
//
// - Map(seq_id, block_table, num_positions) compares the block ids that cover the region's valid
//   positions with the recorded ones (O(blocks), no per-position work) and queues only the
//   positions from the first changed block (or from the old length) up to num_positions. A
//   decode step therefore uploads one slot per sequence; a new sequence, a seq_id reused with
//   other blocks, or a block table changed mid-sequence (preemption, re-admission) rewrites the
//   region from the first block that differs. It returns the region's offset (row_offset).
// - Regions are sized with headroom (num_positions + max(num_positions / 8, 256), rounded up to
//   256 slots); a sequence that outgrows its region moves to a larger one (a device-to-device
//   copy of the valid prefix, then the old range is freed). Ranges come from a best-fit free list
//   with coalescing.
// - The buffer starts at Options::initial_capacity. When no free range fits, the regions mapped
//   neither in this step nor in the one before (sequences out of the running batch: waiting,
//   preempted, or finished without a Release) are freed first (a later Map of their seq_id
//   rewrites them, as after an eviction by age), and only if that does not make room the buffer
//   grows (a new buffer at least twice as large, a device-to-device copy, offsets unchanged).
//   Regions of the running batch are never freed to make room (they would be rewritten every
//   step). Growth changes slots(): a consumer that recorded the address (a captured CUDA graph)
//   must drop it; DecodeGraphs compares the address on every Upload. A failed growth fails the
//   step (ResourceExhausted) and, on the CUDA backend, is recorded as its sticky error.
// - Sequences that stop appearing are freed: BeginStep() releases regions not mapped for
//   `evict_after_steps` steps (a later Map of that seq_id simply rewrites it), so the arena stays
//   bounded by the working set; Release() frees one at once (Model::ReleaseSequence, called by
//   the scheduler when a sequence finishes or is preempted).
// - A seq_id mapped twice in one step (two slices of one sequence in a batch) gets a temporary
//   region for the second slice, freed at the next BeginStep, so the first slice's region is not
//   overwritten under it.
// - Flush() enqueues the queued writes on the backend's stream before the step's ops read them,
//   one host->device copy per contiguous run (runs adjacent in the buffer are merged): a decode
//   step makes one small copy per sequence. (A single scatter launch would do fewer copies, but
//   the Backend interface has no int scatter, and ScatterRows is a KV write that a backend may
//   transform, e.g. the fake-quantizing test backend of kv_fp8_model_test.)
//
// Contract: one step at a time (the model's step thread); not thread-safe. Errors: a buffer that
// would exceed 2^31 - 1 slots (int32 offsets) is InvalidArgument. The backend's sticky error
// covers failed copies. stats() is a plain value read on the step thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace glm::engine {

struct SlotArenaStats {
  int64_t steps = 0;                 // BeginStep calls
  int64_t slots_uploaded_last_step = 0;  // slot values written by the last step's Flush
  int64_t copies_last_step = 0;      // host->device copies the last step's Flush issued
  int64_t slots_uploaded_total = 0;
  int64_t region_rewrites = 0;       // Map calls that found changed blocks (or a new seq_id)
  int64_t region_moves = 0;          // regions moved to a larger range
  int64_t region_extends = 0;        // regions grown in place (the range after them was free)
  int64_t buffer_grows = 0;          // buffer reallocations (slots() changed)
  int64_t evictions = 0;             // regions freed for age
  int64_t reclaims = 0;              // idle regions freed to make room instead of growing
  int64_t live_regions = 0;
  int64_t capacity_slots = 0;        // size of the buffer, int32 slots
  int64_t used_slots = 0;            // slots held by regions (their capacities)
};

class SlotArena {
 public:
  struct Options {
    int block_size = 16;
    int evict_after_steps = 64;  // a region not mapped for this many steps is freed
    // Slots of the first allocation (at the first Map; later growth doubles). The model passes
    // 1.25 x the KV cache's positions: room for every position when sequences are long. Each
    // region holds at least 512 slots, so many short sequences can still outgrow it (then the
    // buffer moves and the decode graphs are recaptured once).
    int64_t initial_capacity = 4096;
  };

  SlotArena(Backend* backend, Options options) : backend_(backend), options_(options) {}

  // Starts a step: frees temporary regions and regions not mapped for evict_after_steps steps.
  void BeginStep();

  // Makes seq_id's region hold the slots of positions [0, num_positions) under block_table
  // (which must cover them: the caller validated it) and returns the region's offset into
  // slots(). Writes are queued until Flush(). rewrite: upload every position again even when
  // the blocks are unchanged (the per-step cost before this arena existed; benchmarks only).
  absl::StatusOr<int32_t> Map(int64_t seq_id, const std::vector<int32_t>& block_table,
                              int64_t num_positions, bool rewrite = false);

  // Enqueues the queued writes (see the header comment). Call before any op reads slots().
  void Flush();

  // Backend address of the table; null before the first Map. Changes only when the buffer grows.
  const int32_t* slots() const {
    return buffer_ == nullptr ? nullptr : static_cast<const int32_t*>(buffer_->data());
  }

  // Allocates the buffer at Options::initial_capacity now (at load, so that a shortage is a load
  // error, not a failed step); a no-op once allocated. ResourceExhausted names the bytes.
  absl::Status Reserve();
  // Backend bytes the table holds now.
  int64_t bytes() const { return capacity_ * static_cast<int64_t>(sizeof(int32_t)); }

  // Frees seq_id's region (no-op when unknown).
  void Release(int64_t seq_id);

  const SlotArenaStats& stats() const { return stats_; }

 private:
  struct Region {
    int64_t offset = 0;
    int64_t capacity = 0;
    int64_t len = 0;                  // valid positions
    std::vector<int32_t> blocks;      // block ids the valid positions were computed from
    int64_t last_step = -1;
  };

  // A free range of at least n slots (best fit), freeing idle regions (ReclaimIdle) and then
  // growing the buffer if needed; -1 on failure (status_ says why).
  int64_t Allocate(int64_t n);
  // Frees the regions mapped neither in this step nor the one before; returns how many.
  int64_t ReclaimIdle();
  void FreeRange(int64_t offset, int64_t n);
  bool Grow(int64_t min_free);
  void Queue(int64_t dst, const std::vector<int32_t>& block_table, int64_t begin, int64_t end);
  void DeviceCopy(int64_t src, int64_t dst, int64_t n, int32_t* src_base);

  Backend* backend_;
  Options options_;
  std::unique_ptr<Buffer> buffer_;   // [capacity] int32 slots
  int64_t capacity_ = 0;
  std::map<int64_t, int64_t> free_;  // offset -> size
  std::unordered_map<int64_t, Region> regions_;
  std::vector<Region> temporaries_;  // second mappings of a seq_id within this step
  int64_t step_ = 0;
  absl::Status status_;
  // Queued writes: contiguous runs of slot values.
  struct Run {
    int64_t dst = 0, src = 0, n = 0;  // src: index into values_
  };
  std::vector<Run> runs_;
  std::vector<int32_t> values_;
  SlotArenaStats stats_;
};

}  // namespace glm::engine
