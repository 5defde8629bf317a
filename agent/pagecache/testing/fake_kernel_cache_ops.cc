#include "agent/pagecache/testing/fake_kernel_cache_ops.h"

#include <fstream>
#include <utility>

namespace glm::pagecache {

void WriteFakeMeminfo(const std::string& proc_root, const FakeMeminfo& meminfo) {
  const uint64_t free_kb = meminfo.available_kb > meminfo.cached_kb
                               ? meminfo.available_kb - meminfo.cached_kb
                               : 0;
  std::ofstream(proc_root + "/meminfo") << "MemTotal:       " << meminfo.total_kb << " kB\n"
                                        << "MemFree:        " << free_kb << " kB\n"
                                        << "MemAvailable:   " << meminfo.available_kb << " kB\n"
                                        << "Cached:         " << meminfo.cached_kb << " kB\n";
}

FakeKernelCacheOps::FakeKernelCacheOps(KernelCacheCalls* calls, std::string proc_root,
                                       FakeMeminfo after_drop)
    : calls_(calls), proc_root_(std::move(proc_root)), after_drop_(after_drop) {}

void FakeKernelCacheOps::Sync() { ++calls_->syncs; }

absl::Status FakeKernelCacheOps::DropCaches(int value) {
  ++calls_->drops;
  calls_->last_drop_value = value;
  WriteFakeMeminfo(proc_root_, after_drop_);
  return absl::OkStatus();
}

}  // namespace glm::pagecache
