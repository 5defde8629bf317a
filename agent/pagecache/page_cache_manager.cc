#include "agent/pagecache/page_cache_manager.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"

namespace glm::pagecache {
namespace {

class RealKernelCacheOps : public KernelCacheOps {
 public:
  explicit RealKernelCacheOps(std::string proc_root) : proc_root_(std::move(proc_root)) {}
  void Sync() override { ::sync(); }
  absl::Status DropCaches(int value) override {
    std::string path = proc_root_ + "/sys/vm/drop_caches";
    int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
    std::string text = absl::StrCat(value, "\n");
    ssize_t n = write(fd, text.data(), text.size());
    int err = errno;
    close(fd);
    if (n != static_cast<ssize_t>(text.size())) {
      return absl::PermissionDeniedError(absl::StrCat(path, ": write: ", std::strerror(err)));
    }
    return absl::OkStatus();
  }

 private:
  std::string proc_root_;
};

// Bytes of [offset, offset+length) of `fd` resident in the page cache (mincore on a mapping).
uint64_t ResidentBytes(int fd, uint64_t offset, uint64_t length) {
  if (length == 0) return 0;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t start = offset / page * page;
  uint64_t span = offset + length - start;
  void* map = mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) return 0;
  std::vector<unsigned char> vec((span + page - 1) / page);
  uint64_t resident = 0;
  if (mincore(map, span, vec.data()) == 0) {
    for (unsigned char v : vec) resident += (v & 1) ? page : 0;
  }
  munmap(map, span);
  return resident;
}

}  // namespace

absl::StatusOr<Policy> ParsePolicy(const std::string& name) {
  if (name == "off") return Policy::kOff;
  if (name == "periodic") return Policy::kPeriodic;
  if (name == "adaptive") return Policy::kAdaptive;
  return absl::InvalidArgumentError(
      absl::StrCat("page_cache.policy '", name, "' is not one of off, periodic, adaptive"));
}

const char* PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kOff: return "off";
    case Policy::kPeriodic: return "periodic";
    case Policy::kAdaptive: return "adaptive";
  }
  return "off";
}

const char* ActionKindName(Action::Kind kind) {
  switch (kind) {
    case Action::Kind::kFadvise: return "fadvise";
    case Action::Kind::kDropCaches: return "drop_caches";
    case Action::Kind::kNotPermitted: return "not_permitted";
  }
  return "?";
}

std::unique_ptr<KernelCacheOps> MakeRealKernelCacheOps(const std::string& proc_root) {
  return std::make_unique<RealKernelCacheOps>(proc_root);
}

PageCacheManager::PageCacheManager(Options options, Clock* clock,
                                   std::unique_ptr<KernelCacheOps> ops)
    : options_(std::move(options)),
      clock_(clock),
      ops_(ops ? std::move(ops) : MakeRealKernelCacheOps(options_.proc_root)) {}

absl::Status PageCacheManager::ReleaseRange(int fd, uint64_t offset, uint64_t length,
                                            const std::string& label) {
  if (length == 0) {
    struct stat st;
    if (fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat(label, ": fstat: ", std::strerror(errno)));
    length = static_cast<uint64_t>(st.st_size) > offset ? static_cast<uint64_t>(st.st_size) - offset : 0;
  }
  uint64_t before = ResidentBytes(fd, offset, length);
  // Dirty pages are not dropped by DONTNEED; write the range back first (no-op when clean).
  sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(length),
                  SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
  int rc = posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(length),
                         POSIX_FADV_DONTNEED);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat(label, ": posix_fadvise(DONTNEED): ", std::strerror(rc)));
  }
  uint64_t after = ResidentBytes(fd, offset, length);
  std::lock_guard<std::mutex> lock(mu_);
  actions_.push_back(Action{Action::Kind::kFadvise, clock_->Now(),
                            absl::StrCat(label, " [", offset, ", +", length, ")"),
                            before > after ? before - after : 0});
  return absl::OkStatus();
}

absl::Status PageCacheManager::ReleaseFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  absl::Status s = ReleaseRange(fd, 0, 0, path);
  close(fd);
  return s;
}

void PageCacheManager::BeginLoad() {
  std::lock_guard<std::mutex> lock(mu_);
  loading_ = true;
  progress_bytes_ = 0;
  last_progress_ = clock_->Now();
  if (!dropped_once_) last_drop_ = clock_->Now();
}

void PageCacheManager::ReportProgress(uint64_t bytes_loaded) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes_loaded != progress_bytes_) {
    progress_bytes_ = bytes_loaded;
    last_progress_ = clock_->Now();
  }
}

void PageCacheManager::EndLoad() {
  std::lock_guard<std::mutex> lock(mu_);
  loading_ = false;
}

absl::StatusOr<uint64_t> PageCacheManager::MemInfoKb(const std::string& field) const {
  std::string path = options_.proc_root + "/meminfo";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (!absl::ConsumePrefix(&v, field) || !absl::ConsumePrefix(&v, ":")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, "kB");
    uint64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) return kb;
  }
  return absl::NotFoundError(absl::StrCat(path, ": no ", field, " line"));
}

void PageCacheManager::DropLocked(const std::string& reason) {
  Clock::TimePoint now = clock_->Now();
  last_drop_ = now;
  dropped_once_ = true;
  absl::StatusOr<uint64_t> cached_before = MemInfoKb("Cached");
  ops_->Sync();
  absl::Status s = ops_->DropCaches(options_.drop_caches_value);
  if (!s.ok()) {
    not_permitted_ = true;
    GLM_LOG_WARN("page cache: dropping caches is not permitted ({}); continuing with per-file "
                 "fadvise only. Run the agent as root with a writable /proc/sys for policy={}",
                 std::string(s.message()), PolicyName(options_.policy));
    actions_.push_back(Action{Action::Kind::kNotPermitted, now,
                              absl::StrCat(reason, ": ", s.message()), 0});
    return;
  }
  absl::StatusOr<uint64_t> cached_after = MemInfoKb("Cached");
  uint64_t freed = 0;
  if (cached_before.ok() && cached_after.ok() && *cached_before > *cached_after) {
    freed = (*cached_before - *cached_after) * 1024;
  }
  actions_.push_back(Action{Action::Kind::kDropCaches, now, reason, freed});
}

void PageCacheManager::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loading_ || not_permitted_ || options_.policy == Policy::kOff) return;
  Clock::TimePoint now = clock_->Now();
  if (options_.policy == Policy::kPeriodic) {
    if (now - last_drop_ >= options_.period) DropLocked("periodic");
    return;
  }
  // Adaptive.
  if (dropped_once_ && now - last_drop_ < options_.min_interval) return;
  absl::StatusOr<uint64_t> available_kb = MemInfoKb("MemAvailable");
  if (available_kb.ok() && *available_kb * 1024 < options_.min_available_bytes) {
    DropLocked(absl::StrCat("MemAvailable ", *available_kb, " kB < threshold ",
                            options_.min_available_bytes / 1024, " kB"));
    return;
  }
  if (now - last_progress_ >= options_.stall_timeout) {
    DropLocked(absl::StrCat("load progress stalled at ", progress_bytes_, " bytes for ",
                            std::chrono::duration_cast<std::chrono::seconds>(now - last_progress_).count(),
                            " s"));
    last_progress_ = now;  // one drop per stall period, not one per tick.
  }
}

std::vector<Action> PageCacheManager::actions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return actions_;
}

bool PageCacheManager::drop_not_permitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return not_permitted_;
}

uint64_t PageCacheManager::total_bytes_freed() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const Action& a : actions_) total += a.bytes_freed;
  return total;
}

}  // namespace glm::pagecache
