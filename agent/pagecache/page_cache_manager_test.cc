#include "agent/pagecache/page_cache_manager.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "agent/pagecache/testing/fake_kernel_cache_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::pagecache {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using std::chrono::seconds;

// The meminfo of a machine with 128 GB, in kB.
FakeMeminfo Meminfo(uint64_t available_kb, uint64_t cached_kb) {
  return FakeMeminfo{127'535'000, available_kb, cached_kb};
}

class PageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    proc_ = fs::path(testing::TempDir()) / ("pagecache_proc_" + std::to_string(getpid()));
    fs::remove_all(proc_);
    fs::create_directories(proc_ / "sys/vm");
    WriteFakeMeminfo(proc_.string(), Meminfo(50'000'000, 41'000'000));
  }
  void TearDown() override { fs::remove_all(proc_); }

  // A manager on the fake proc tree whose drops leave 1 GB cached and 90 GB available.
  std::unique_ptr<PageCacheManager> Make(Options o) {
    o.proc_root = proc_.string();
    return std::make_unique<PageCacheManager>(
        o, &clock_,
        std::make_unique<FakeKernelCacheOps>(&calls_, proc_.string(),
                                             Meminfo(90'000'000, 1'000'000)));
  }

  fs::path proc_;
  FakeClock clock_;
  KernelCacheCalls calls_;
};

TEST(PolicyTest, Parses) {
  EXPECT_EQ(*ParsePolicy("adaptive"), Policy::kAdaptive);
  EXPECT_EQ(*ParsePolicy("off"), Policy::kOff);
  EXPECT_THAT(std::string(ParsePolicy("sometimes").status().message()),
              HasSubstr("not one of off, periodic, adaptive"));
}

TEST_F(PageCacheTest, OffNeverDrops) {
  auto m = Make(Options{});
  m->BeginLoad();
  clock_.Advance(seconds(1000));
  m->Tick();
  EXPECT_EQ(calls_.drops, 0);
  EXPECT_TRUE(m->actions().empty());
}

TEST_F(PageCacheTest, PeriodicDropsEveryPeriodOnlyWhileLoading) {
  Options o;
  o.policy = Policy::kPeriodic;
  o.period = seconds(30);
  auto m = Make(o);
  m->Tick();
  clock_.Advance(seconds(60));
  m->Tick();
  EXPECT_EQ(calls_.drops, 0);  // not loading

  m->BeginLoad();
  clock_.Advance(seconds(29));
  m->Tick();
  EXPECT_EQ(calls_.drops, 0);
  clock_.Advance(seconds(1));
  m->Tick();
  EXPECT_EQ(calls_.drops, 1);
  EXPECT_EQ(calls_.syncs, 1);
  EXPECT_EQ(calls_.last_drop_value, 1);  // the page cache only
  m->Tick();
  EXPECT_EQ(calls_.drops, 1);
  clock_.Advance(seconds(30));
  m->Tick();
  EXPECT_EQ(calls_.drops, 2);
  m->EndLoad();
  clock_.Advance(seconds(30));
  m->Tick();
  EXPECT_EQ(calls_.drops, 2);

  std::vector<Action> actions = m->actions();
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, Action::Kind::kDropCaches);
  EXPECT_EQ(actions[0].reason, "periodic");
  EXPECT_EQ(actions[0].bytes_freed, uint64_t{40'000'000} * 1024);  // ΔCached
  EXPECT_EQ(actions[1].bytes_freed, 0u);  // the cache was already small
}

TEST_F(PageCacheTest, AdaptiveDropsWhenMemAvailableLow) {
  Options o;
  o.policy = Policy::kAdaptive;
  o.min_available_bytes = uint64_t{60'000'000} * 1024;  // above the 50 GB available
  o.min_interval = seconds(5);
  auto m = Make(o);
  m->BeginLoad();
  m->Tick();
  ASSERT_EQ(calls_.drops, 1);
  EXPECT_THAT(m->actions()[0].reason, HasSubstr("MemAvailable 50000000 kB < threshold 60000000 kB"));
  WriteFakeMeminfo(proc_.string(), Meminfo(50'000'000, 41'000'000));  // filled again
  clock_.Advance(seconds(4));
  m->Tick();
  EXPECT_EQ(calls_.drops, 1);  // min_interval
  clock_.Advance(seconds(1));
  m->Tick();
  EXPECT_EQ(calls_.drops, 2);
}

TEST_F(PageCacheTest, AdaptiveDropsOnStallOnly) {
  Options o;
  o.policy = Policy::kAdaptive;
  o.min_available_bytes = 1024;  // plenty available
  o.stall_timeout = seconds(20);
  auto m = Make(o);
  m->BeginLoad();
  for (int i = 1; i <= 5; ++i) {  // steady progress: no drop
    clock_.Advance(seconds(10));
    m->ReportProgress(uint64_t(i) << 30);
    m->Tick();
  }
  EXPECT_EQ(calls_.drops, 0);
  clock_.Advance(seconds(19));
  m->Tick();
  EXPECT_EQ(calls_.drops, 0);
  clock_.Advance(seconds(1));
  m->Tick();
  ASSERT_EQ(calls_.drops, 1);
  EXPECT_THAT(m->actions().back().reason, HasSubstr("load progress stalled at 5368709120 bytes for 20 s"));
  clock_.Advance(seconds(10));
  m->Tick();
  EXPECT_EQ(calls_.drops, 1);  // one per stall period
}

TEST_F(PageCacheTest, RealOpsWriteDropCachesInTheProcTree) {
  std::ofstream(proc_ / "sys/vm/drop_caches") << "";
  Options o;
  o.policy = Policy::kPeriodic;
  o.period = seconds(1);
  o.proc_root = proc_.string();
  PageCacheManager m(o, &clock_);
  m.BeginLoad();
  clock_.Advance(seconds(1));
  m.Tick();
  std::ifstream in(proc_ / "sys/vm/drop_caches");
  std::string value;
  in >> value;
  EXPECT_EQ(value, "1");
  ASSERT_EQ(m.actions().size(), 1u);
  EXPECT_EQ(m.actions()[0].kind, Action::Kind::kDropCaches);
  EXPECT_FALSE(m.drop_not_permitted());
}

TEST_F(PageCacheTest, NotPermittedIsReportedOnceAndFadviseContinues) {
  // A directory in place of the file: the write fails as it does on a read-only /proc/sys.
  fs::create_directories(proc_ / "sys/vm/drop_caches");
  Options o;
  o.policy = Policy::kPeriodic;
  o.period = seconds(1);
  o.proc_root = proc_.string();
  PageCacheManager m(o, &clock_);
  m.BeginLoad();
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(seconds(1));
    m.Tick();
  }
  ASSERT_EQ(m.actions().size(), 1u);
  EXPECT_EQ(m.actions()[0].kind, Action::Kind::kNotPermitted);
  EXPECT_THAT(m.actions()[0].reason, HasSubstr("drop_caches"));
  EXPECT_TRUE(m.drop_not_permitted());

  fs::path file = proc_ / "weights.bin";
  std::ofstream(file) << std::string(1 << 16, 'x');
  EXPECT_TRUE(m.ReleaseFile(file.string()).ok());
  EXPECT_EQ(m.actions().size(), 2u);
  EXPECT_EQ(m.actions()[1].kind, Action::Kind::kFadvise);
}

TEST_F(PageCacheTest, FadviseFreesResidentPagesOfARange) {
  fs::path file = fs::path(testing::TempDir()) / ("pagecache_data_" + std::to_string(getpid()));
  const size_t kSize = 8 << 20;
  {
    std::ofstream out(file, std::ios::binary);
    out << std::string(kSize, 'w');
  }
  int fd = open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<char> buf(kSize);
  ASSERT_EQ(read(fd, buf.data(), kSize), static_cast<ssize_t>(kSize));  // now cached
  auto m = Make(Options{});
  ASSERT_TRUE(m->ReleaseRange(fd, 0, kSize / 2, "shard-0").ok());
  std::vector<Action> a = m->actions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Action::Kind::kFadvise);
  EXPECT_THAT(a[0].reason, HasSubstr("shard-0 [0, +4194304)"));
  struct statfs sfs;
  fstatfs(fd, &sfs);
  if (sfs.f_type != TMPFS_MAGIC) {
    EXPECT_GT(a[0].bytes_freed, 0u);
    EXPECT_LE(a[0].bytes_freed, kSize / 2);
  }
  close(fd);
  fs::remove(file);
}

}  // namespace
}  // namespace glm::pagecache
