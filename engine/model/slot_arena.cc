#include "engine/model/slot_arena.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace glm::engine {
namespace {

constexpr int64_t kMaxSlots = std::numeric_limits<int32_t>::max();  // int32 offsets
constexpr int64_t kRegionAlign = 256;

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 4-byte elements as a one-row fp32 view (the row ops copy bits).
MatView Row(int32_t* data, int64_t n) { return {reinterpret_cast<float*>(data), 1, n, n}; }

}  // namespace

void SlotArena::BeginStep() {
  ++step_;
  ++stats_.steps;
  stats_.slots_uploaded_last_step = 0;
  for (const Region& t : temporaries_) FreeRange(t.offset, t.capacity);
  temporaries_.clear();
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (it->second.last_step < step_ - options_.evict_after_steps) {
      FreeRange(it->second.offset, it->second.capacity);
      ++stats_.evictions;
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
  stats_.live_regions = static_cast<int64_t>(regions_.size());
}

absl::StatusOr<int32_t> SlotArena::Map(int64_t seq_id, const std::vector<int32_t>& block_table,
                                       int64_t num_positions, bool rewrite) {
  const int64_t bs = options_.block_size;
  Region temp;
  Region* r = nullptr;
  bool is_temp = false;
  auto it = regions_.find(seq_id);
  if (it != regions_.end() && it->second.last_step == step_) {
    r = &temp;  // mapped earlier in this step: do not overwrite what that slice reads
    is_temp = true;
  } else {
    r = &regions_[seq_id];  // references into an unordered_map survive rehashing
  }
  r->last_step = step_;  // before Allocate, which must not see it as unused
  // Positions [0, keep) are valid under block_table: compare only the blocks that cover them.
  const int64_t valid = rewrite ? 0 : std::min(r->len, num_positions);
  int64_t keep = valid;
  const int64_t valid_blocks = (valid + bs - 1) / bs;
  for (int64_t b = 0; b < valid_blocks; ++b) {
    if (r->blocks[b] != block_table[b]) {
      keep = b * bs;
      break;
    }
  }
  if (keep < valid || r->len == 0) ++stats_.region_rewrites;
  if (num_positions > r->capacity) {
    const int64_t want = RoundUp(num_positions + std::max<int64_t>(num_positions / 8, kRegionAlign),
                                 kRegionAlign);
    // Grow in place when the range right after the region is free.
    auto next = r->capacity > 0 ? free_.find(r->offset + r->capacity) : free_.end();
    if (next != free_.end() && next->second >= want - r->capacity) {
      const int64_t extra = want - r->capacity;
      const int64_t rest_off = next->first + extra, rest = next->second - extra;
      free_.erase(next);
      if (rest > 0) free_[rest_off] = rest;
      stats_.used_slots += extra;
      ++stats_.region_extends;
      r->capacity = want;
    } else {
      const int64_t offset = Allocate(want);
      if (offset < 0) {
        if (!is_temp && r->capacity == 0) regions_.erase(seq_id);
        return status_;
      }
      if (keep > 0) {
        DeviceCopy(r->offset, offset, keep, static_cast<int32_t*>(buffer_->data()));
        ++stats_.region_moves;
      }
      if (r->capacity > 0) FreeRange(r->offset, r->capacity);
      r->offset = offset;
      r->capacity = want;
    }
  }
  if (keep < num_positions) Queue(r->offset + keep, block_table, keep, num_positions);
  r->len = num_positions;
  const int64_t num_blocks = (num_positions + bs - 1) / bs;
  r->blocks.resize(num_blocks);
  std::copy(block_table.begin() + keep / bs, block_table.begin() + num_blocks,
            r->blocks.begin() + keep / bs);
  const int32_t offset = static_cast<int32_t>(r->offset);
  if (is_temp) temporaries_.push_back(std::move(temp));
  stats_.live_regions = static_cast<int64_t>(regions_.size() + temporaries_.size());
  return offset;
}

void SlotArena::Queue(int64_t dst, const std::vector<int32_t>& block_table, int64_t begin,
                      int64_t end) {
  const int64_t bs = options_.block_size;
  if (!runs_.empty() && runs_.back().dst + runs_.back().n == dst) {
    runs_.back().n += end - begin;  // adjacent in the buffer: one copy
  } else {
    runs_.push_back({dst, static_cast<int64_t>(values_.size()), end - begin});
  }
  for (int64_t pos = begin; pos < end; ++pos) {
    values_.push_back(static_cast<int32_t>(block_table[pos / bs] * bs + pos % bs));
  }
}

void SlotArena::Flush() {
  int64_t written = 0;
  int32_t* base = buffer_ == nullptr ? nullptr : static_cast<int32_t*>(buffer_->data());
  for (const Run& c : runs_) {
    backend_->CopyToDevice(base + c.dst, values_.data() + c.src, c.n * sizeof(int32_t));
    written += c.n;
  }
  stats_.copies_last_step = static_cast<int64_t>(runs_.size());
  runs_.clear();
  values_.clear();
  stats_.slots_uploaded_last_step += written;
  stats_.slots_uploaded_total += written;
}

int64_t SlotArena::Allocate(int64_t n) {
  bool reclaimed = false, grown = false;
  while (true) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= n && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best != free_.end()) {
      const int64_t offset = best->first, rest = best->second - n;
      free_.erase(best);
      if (rest > 0) free_[offset + n] = rest;
      stats_.used_slots += n;
      return offset;
    }
    if (!reclaimed) {
      reclaimed = true;
      if (ReclaimIdle() > 0) continue;
    }
    if (grown) break;
    if (!Grow(n)) return -1;
    grown = true;
  }
  status_ = absl::InternalError("slot arena: no free range after growing");
  return -1;
}

int64_t SlotArena::ReclaimIdle() {
  int64_t freed = 0;
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (it->second.last_step < step_ - 1) {
      FreeRange(it->second.offset, it->second.capacity);
      it = regions_.erase(it);
      ++freed;
    } else {
      ++it;
    }
  }
  stats_.reclaims += freed;
  stats_.live_regions = static_cast<int64_t>(regions_.size() + temporaries_.size());
  return freed;
}

void SlotArena::FreeRange(int64_t offset, int64_t n) {
  if (n <= 0) return;
  stats_.used_slots -= n;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + n) {
    n += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += n;
      return;
    }
  }
  free_[offset] = n;
}

bool SlotArena::Grow(int64_t min_free) {
  // The free tail (if any) counts towards min_free.
  int64_t tail = 0;
  if (!free_.empty()) {
    auto last = std::prev(free_.end());
    if (last->first + last->second == capacity_) tail = last->second;
  }
  int64_t cap = std::max<int64_t>(
      {capacity_ * 2, capacity_ + min_free - tail, options_.initial_capacity, 1024});
  if (cap > kMaxSlots) cap = kMaxSlots;
  if (cap - capacity_ + tail < min_free) {
    status_ = absl::InvalidArgumentError(absl::StrCat(
        "slot arena: ", capacity_ + min_free - tail, " key slots would exceed the int32 offsets "
        "of the key table (", kMaxSlots, "); lower max_num_seqs or max_model_len"));
    return false;
  }
  // TryAllocate: out of device memory fails this step (the scheduler fails its sequences) and
  // leaves the backend usable, instead of a sticky backend error that stops the engine.
  std::unique_ptr<Buffer> grown = backend_->TryAllocate(cap * sizeof(int32_t));
  if (grown == nullptr || grown->data() == nullptr) {
    status_ = absl::ResourceExhaustedError(
        absl::StrCat("slot arena: allocating ", cap * sizeof(int32_t),
                     " bytes for the key-slot table (", cap, " slots, ", capacity_,
                     " now) failed: device memory is short; lower max_num_seqs, "
                     "max_model_len or the KV cache budget"));
    return false;
  }
  if (buffer_ != nullptr && capacity_ > 0) {
    backend_->Copy(Row(static_cast<int32_t*>(buffer_->data()), capacity_),
                   Row(grown->i32(), capacity_));
  }
  const int64_t old = capacity_;
  buffer_ = std::move(grown);  // freeing the old buffer waits for the copy (cudaFree syncs)
  capacity_ = cap;
  stats_.used_slots += cap - old;  // FreeRange below subtracts it again
  FreeRange(old, cap - old);
  ++stats_.buffer_grows;
  stats_.capacity_slots = capacity_;
  return true;
}

void SlotArena::DeviceCopy(int64_t src, int64_t dst, int64_t n, int32_t* base) {
  backend_->Copy(Row(base + src, n), Row(base + dst, n));
}

absl::Status SlotArena::Reserve() {
  if (buffer_ == nullptr && !Grow(0)) return status_;
  return absl::OkStatus();
}

void SlotArena::Release(int64_t seq_id) {
  auto it = regions_.find(seq_id);
  if (it == regions_.end()) return;
  FreeRange(it->second.offset, it->second.capacity);
  regions_.erase(it);
  stats_.live_regions = static_cast<int64_t>(regions_.size() + temporaries_.size());
}

}  // namespace glm::engine
