// A KernelCacheOps for tests: counts sync(2) and drop_caches instead of calling the kernel, and
// plays the kernel's part in a fake proc tree by rewriting <proc_root>/meminfo after each drop
// (the cache shrank, MemAvailable changed), which is what PageCacheManager reads back.
#pragma once

#include <cstdint>
#include <string>

#include "agent/pagecache/page_cache_manager.h"

namespace glm::pagecache {

// The fields of /proc/meminfo the manager reads, in kB.
struct FakeMeminfo {
  uint64_t total_kb = 0;
  uint64_t available_kb = 0;
  uint64_t cached_kb = 0;
};

// Writes <proc_root>/meminfo (MemTotal, MemFree, MemAvailable, Cached) as the kernel spells it.
void WriteFakeMeminfo(const std::string& proc_root, const FakeMeminfo& meminfo);

// What the fakes were asked to do. Owned by the test and shared by every fake built with it (a
// test may hand one fake to each of several managers).
struct KernelCacheCalls {
  int syncs = 0;
  int drops = 0;
  int last_drop_value = 0;  // the value written by the last DropCaches
};

// Not thread-safe on its own; PageCacheManager calls it under its lock.
class FakeKernelCacheOps : public KernelCacheOps {
 public:
  // `calls` must outlive the fake. Each drop writes `after_drop` to <proc_root>/meminfo.
  FakeKernelCacheOps(KernelCacheCalls* calls, std::string proc_root, FakeMeminfo after_drop);

  void Sync() override;
  absl::Status DropCaches(int value) override;

 private:
  KernelCacheCalls* const calls_;
  const std::string proc_root_;
  const FakeMeminfo after_drop_;
};

}  // namespace glm::pagecache
