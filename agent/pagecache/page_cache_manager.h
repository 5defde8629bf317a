// Page cache during a shard load. On GB10 the page cache competes with the GPU for the same
// 128 GB of unified memory: loads die at 73–97 % after an rsync filled the cache
// (MiaAI-Lab/...#35), while MemAvailable looks clean (model-serving-minefield#113). So:
//  (1) each weight range is dropped from the cache once it is on the device
//      (posix_fadvise DONTNEED; no root needed), and
//  (2) the cluster's policy runs while a load is in progress:
//        off       nothing more;
//        periodic  sync + drop_caches every `period` (what the community recipes do);
//        adaptive  sync + drop_caches only when MemAvailable < threshold or load progress has
//                  stalled for `stall_timeout`, at most once per `min_interval`.
// Writing drop_caches needs root and a writable /proc/sys; when it is refused the manager says
// so once (log + one kNotPermitted action) and carries on with fadvise only.
//
// Thread-safe. Time comes from the injected Clock; Tick() is driven by the caller's timer.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"

namespace glm::pagecache {

enum class Policy { kOff, kPeriodic, kAdaptive };
// "off" | "periodic" | "adaptive"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<Policy> ParsePolicy(const std::string& name);
const char* PolicyName(Policy policy);

struct Options {
  Policy policy = Policy::kOff;
  Clock::Duration period = std::chrono::seconds(30);          // periodic
  uint64_t min_available_bytes = uint64_t{8} << 30;          // adaptive threshold
  Clock::Duration stall_timeout = std::chrono::seconds(20);   // adaptive
  Clock::Duration min_interval = std::chrono::seconds(5);     // adaptive
  std::string proc_root = "/proc";
  int drop_caches_value = 1;  // 1 = page cache only (3 would also drop dentries/inodes).
};

// The kernel operations the policies use; a fake stands in for tests.
class KernelCacheOps {
 public:
  virtual ~KernelCacheOps() = default;
  virtual void Sync() = 0;
  // Writes `value` to <proc>/sys/vm/drop_caches. Errors carry the errno text.
  virtual absl::Status DropCaches(int value) = 0;
};

// sync(2) and a write to <proc_root>/sys/vm/drop_caches.
std::unique_ptr<KernelCacheOps> MakeRealKernelCacheOps(const std::string& proc_root);

struct Action {
  enum class Kind { kFadvise, kDropCaches, kNotPermitted };
  Kind kind;
  Clock::TimePoint time;
  std::string reason;        // "range of model-00003.safetensors", "periodic", "MemAvailable ...".
  uint64_t bytes_freed = 0;  // fadvise: resident bytes before − after (mincore); drop: ΔCached.
};
const char* ActionKindName(Action::Kind kind);

class PageCacheManager {
 public:
  // `ops` null → MakeRealKernelCacheOps(options.proc_root). `clock` must outlive the manager.
  PageCacheManager(Options options, Clock* clock, std::unique_ptr<KernelCacheOps> ops = nullptr);

  // Drops [offset, offset+length) of the open file `fd` from the page cache (after writing back
  // any dirty pages of the range). length 0 = to the end of the file. `label` names it in reports.
  absl::Status ReleaseRange(int fd, uint64_t offset, uint64_t length, const std::string& label);
  absl::Status ReleaseFile(const std::string& path);

  // A load starts/ends; the policy runs only in between. Progress = total bytes loaded so far.
  void BeginLoad();
  void ReportProgress(uint64_t bytes_loaded);
  void EndLoad();

  // Applies the policy now. Call every second or so while loading.
  void Tick();

  std::vector<Action> actions() const;
  bool drop_not_permitted() const;
  uint64_t total_bytes_freed() const;

 private:
  void DropLocked(const std::string& reason);
  absl::StatusOr<uint64_t> MemInfoKb(const std::string& field) const;

  const Options options_;
  Clock* const clock_;
  std::unique_ptr<KernelCacheOps> ops_;
  mutable std::mutex mu_;
  bool loading_ = false;
  bool not_permitted_ = false;
  Clock::TimePoint last_drop_{};
  bool dropped_once_ = false;
  uint64_t progress_bytes_ = 0;
  Clock::TimePoint last_progress_{};
  std::vector<Action> actions_;
};

}  // namespace glm::pagecache
