#include "agent/service/host_facts.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace glm::agent {
namespace {

namespace fs = std::filesystem;

class HostFactsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("host_facts_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(root_ / "proc");
    fs::create_directories(root_ / "dev");
    paths_.proc_root = (root_ / "proc").string();
    paths_.dev_root = (root_ / "dev").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  void WriteMeminfo(int64_t total_kb, int64_t avail_kb) {
    std::ofstream(root_ / "proc" / "meminfo")
        << "MemTotal:       " << total_kb << " kB\nMemFree:  1 kB\nMemAvailable:   " << avail_kb
        << " kB\n";
  }
  const glm::v1::Check& Find(const std::vector<glm::v1::Check>& checks, const std::string& id) {
    for (auto& c : checks)
      if (c.id() == id) return c;
    ADD_FAILURE() << "no check " << id;
    static glm::v1::Check none;
    return none;
  }

  fs::path root_;
  HostProbePaths paths_;
};

TEST_F(HostFactsTest, StableOrderAndPassOnAHealthyHost) {
  WriteMeminfo(64 * 1024 * 1024, 60 * 1024 * 1024);
  std::ofstream(root_ / "dev" / "nvidia0") << "";
  std::ofstream(root_ / "dev" / "nvidiactl") << "";
  auto checks = RunHostChecks({.model_dir = root_.string()}, paths_);
  ASSERT_EQ(checks.size(), 5u);
  EXPECT_EQ(checks[0].id(), "host.cpu.count");
  EXPECT_EQ(checks[1].id(), "host.memory.total");
  EXPECT_EQ(checks[2].id(), "host.memory.available");
  EXPECT_EQ(checks[3].id(), "host.disk.free");
  EXPECT_EQ(checks[4].id(), "host.gpu.present");
  for (auto& c : checks) EXPECT_NE(c.status(), glm::v1::CHECK_STATUS_FAIL) << c.id();
  EXPECT_EQ(checks[4].status(), glm::v1::CHECK_STATUS_PASS);
  EXPECT_NE(checks[4].message().find("1 NVIDIA GPU"), std::string::npos) << checks[4].message();
  EXPECT_NE(checks[1].evidence().find("MemTotal"), std::string::npos);
}

TEST_F(HostFactsTest, MemoryShortfallFailsWithEvidenceAndFix) {
  WriteMeminfo(16 * 1024 * 1024, 2 * 1024 * 1024);
  auto checks = RunHostChecks({.required_memory_bytes = 8LL << 30}, paths_);
  const auto& avail = Find(checks, "host.memory.available");
  EXPECT_EQ(avail.status(), glm::v1::CHECK_STATUS_FAIL);
  EXPECT_NE(avail.message().find("2.00 GiB"), std::string::npos) << avail.message();
  EXPECT_NE(avail.evidence().find("MemAvailable"), std::string::npos);
  EXPECT_FALSE(avail.fix().empty());
  EXPECT_EQ(Find(checks, "host.memory.total").status(), glm::v1::CHECK_STATUS_PASS);
}

TEST_F(HostFactsTest, MissingMeminfoFails) {
  auto checks = RunHostChecks({}, paths_);
  EXPECT_EQ(Find(checks, "host.memory.total").status(), glm::v1::CHECK_STATUS_FAIL);
}

TEST_F(HostFactsTest, NoGpuWarnsOrFailsWhenRequired) {
  WriteMeminfo(1024 * 1024, 1024 * 1024);
  EXPECT_EQ(Find(RunHostChecks({}, paths_), "host.gpu.present").status(),
            glm::v1::CHECK_STATUS_WARN);
  const auto checks = RunHostChecks({.require_gpu = true}, paths_);
  const auto& gpu = Find(checks, "host.gpu.present");
  EXPECT_EQ(gpu.status(), glm::v1::CHECK_STATUS_FAIL);
  EXPECT_FALSE(gpu.fix().empty());
}

TEST_F(HostFactsTest, DiskCheckUsesNearestExistingParentAndFailsWhenShort) {
  WriteMeminfo(1024 * 1024, 1024 * 1024);
  auto checks = RunHostChecks(
      {.model_dir = (root_ / "not" / "yet" / "there").string(),
       .required_disk_bytes = int64_t{1} << 62},
      paths_);
  const auto& disk = Find(checks, "host.disk.free");
  EXPECT_EQ(disk.status(), glm::v1::CHECK_STATUS_FAIL);
  EXPECT_NE(disk.message().find(root_.string()), std::string::npos) << disk.message();
}

TEST_F(HostFactsTest, GatherReadsFakeTree) {
  WriteMeminfo(2048, 1024);
  std::ofstream(root_ / "dev" / "nvidia3") << "";
  auto facts = GatherHostFacts(paths_);
  EXPECT_EQ(facts.mem_total_bytes(), 2048 * 1024);
  EXPECT_EQ(facts.mem_available_bytes(), 1024 * 1024);
  ASSERT_EQ(facts.gpu_devices_size(), 1);
  EXPECT_GT(facts.cpu_count(), 0);
}

TEST(HumanBytesTest, Formats) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(3LL << 30), "3.00 GiB");
}

}  // namespace
}  // namespace glm::agent
