#include "agent/preflight/gid.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "xxhash.h"

namespace glm::preflight {
namespace {

using ::testing::HasSubstr;

const std::string kFixtures = GLM_PREFLIGHT_FIXTURES;

SystemRoots Roots(const std::string& name) {
  return SystemRoots{kFixtures + "/" + name + "/sys", kFixtures + "/" + name + "/proc",
                     kFixtures + "/" + name + "/dev"};
}

TEST(GidFormatTest, ClassifiesEntries) {
  EXPECT_EQ(FormatGid("0000:0000:0000:0000:0000:ffff:c0a8:6401"), "::ffff:192.168.100.1");
  EXPECT_EQ(GidIpv4("0000:0000:0000:0000:0000:ffff:c0a8:6401"), "192.168.100.1");
  EXPECT_EQ(FormatGid("fe80:0000:0000:0000:0e42:a1ff:fe00:0001"), "fe80::e42:a1ff:fe00:1");
  EXPECT_TRUE(GidIsLinkLocal("fe80:0000:0000:0000:0e42:a1ff:fe00:0001"));
  EXPECT_TRUE(GidIsLinkLocal("0000:0000:0000:0000:0000:ffff:a9fe:0c07"));  // 169.254.12.7
  EXPECT_FALSE(GidIsLinkLocal("0000:0000:0000:0000:0000:ffff:c0a8:6401"));
  EXPECT_TRUE(GidIsZero("0000:0000:0000:0000:0000:0000:0000:0000"));
  EXPECT_FALSE(GidIpv4("fe80:0000:0000:0000:0e42:a1ff:fe00:0001").has_value());
}

TEST(GidTableTest, ReadsHealthyTableSkippingZeroEntries) {
  auto table = ReadGidTable(Roots("healthy"), "rocep1s0f0", 1);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 4u);
  EXPECT_EQ((*table)[3].index, 3);
  EXPECT_EQ((*table)[3].type, "RoCE v2");
  EXPECT_EQ((*table)[3].netdev, "enp1s0f0np0");
  auto right = ResolveGidIndex(*table, "192.168.100.1", "enp1s0f0np0");
  ASSERT_TRUE(right.has_value());
  EXPECT_EQ(right->index, 3);  // index 2 carries the IP too, but as RoCE v1.
  EXPECT_FALSE(ResolveGidIndex(*table, "192.168.100.1", "other0").has_value());
}

TEST(GidTableTest, FingerprintIsStableAndFollowsEveryEntry) {
  auto healthy = ReadGidTable(Roots("healthy"), "rocep1s0f0", 1);
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  const std::string fp = GidTableFingerprint(*healthy);
  // The documented spelling: XXH64 of one "<hca> <port> <index> <gid> <type> <netdev>" line per
  // non-zero entry, in index order.
  std::string text;
  const char* kRows[] = {"0 fe80:0000:0000:0000:0e42:a1ff:fe00:0001 IB/RoCE v1",
                         "1 fe80:0000:0000:0000:0e42:a1ff:fe00:0001 RoCE v2",
                         "2 0000:0000:0000:0000:0000:ffff:c0a8:6401 IB/RoCE v1",
                         "3 0000:0000:0000:0000:0000:ffff:c0a8:6401 RoCE v2"};
  for (const char* row : kRows) text += std::string("rocep1s0f0 1 ") + row + " enp1s0f0np0\n";
  char want[40];
  std::snprintf(want, sizeof(want), "xxh64:%016llx",
                static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
  EXPECT_EQ(fp, want);

  // Order-independent; any changed, added or removed entry changes it.
  std::vector<GidEntry> shuffled(healthy->rbegin(), healthy->rend());
  EXPECT_EQ(GidTableFingerprint(shuffled), fp);
  auto moved = ReadGidTable(Roots("gid_linklocal_at_3"), "rocep1s0f0", 1);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_NE(GidTableFingerprint(*moved), fp);
  std::vector<GidEntry> retyped = *healthy;
  retyped[3].type = "IB/RoCE v1";
  EXPECT_NE(GidTableFingerprint(retyped), fp);
  std::vector<GidEntry> fewer(healthy->begin(), healthy->end() - 1);
  EXPECT_NE(GidTableFingerprint(fewer), fp);
  std::vector<GidEntry> renetdev = *healthy;
  renetdev[0].netdev = "other0";
  EXPECT_NE(GidTableFingerprint(renetdev), fp);
  EXPECT_EQ(GidTableFingerprint({}), "");
}

TEST(GidCheckTest, HealthyConfiguredIndexPasses) {
  std::optional<GidEntry> resolved;
  CheckResult r = CheckGidIndex(Roots("healthy"),
                                {"spark1", "rocep1s0f0", 1, 3, "192.168.100.1", "enp1s0f0np0"},
                                &resolved);
  EXPECT_EQ(r.id, "gid.index");
  EXPECT_EQ(r.status, CheckStatus::kPass) << r.message;
  ASSERT_TRUE(resolved.has_value());
  EXPECT_EQ(resolved->index, 3);
  EXPECT_TRUE(r.fix.empty());
}

TEST(GidCheckTest, LinkLocalAtThreeNamesIndexFour) {
  std::optional<GidEntry> resolved;
  CheckResult r = CheckGidIndex(Roots("gid_linklocal_at_3"),
                                {"spark1", "rocep1s0f0", 1, 3, "192.168.100.2", "enp1s0f0np0"},
                                &resolved);
  EXPECT_EQ(r.status, CheckStatus::kFail);
  EXPECT_FALSE(resolved.has_value());
  EXPECT_THAT(r.message, HasSubstr("gid_index 3"));
  EXPECT_THAT(r.message, HasSubstr("link-local (::ffff:169.254.12.7)"));
  EXPECT_THAT(r.message, HasSubstr("the right entry is index 4"));
  EXPECT_EQ(r.fix, "set gid_index: 4 for node spark1 (or gid_index: auto, which resolves per node)");
}

TEST(GidCheckTest, LinkLocalAtThreeAutoResolvesToFour) {
  std::optional<GidEntry> resolved;
  CheckResult r = CheckGidIndex(Roots("gid_linklocal_at_3"),
                                {"spark1", "rocep1s0f0", 1, std::nullopt, "192.168.100.2", "enp1s0f0np0"},
                                &resolved);
  EXPECT_EQ(r.status, CheckStatus::kPass) << r.message;
  ASSERT_TRUE(resolved.has_value());
  EXPECT_EQ(resolved->index, 4);
  EXPECT_EQ(FormatGid(resolved->gid), "::ffff:192.168.100.2");
}

TEST(GidCheckTest, SecondHcaOnlyLinkLocalSaysPersistTheIp) {
  std::optional<GidEntry> resolved;
  CheckResult r = CheckGidIndex(Roots("second_hca_linklocal"),
                                {"spark1", "rocep1s0f1", 1, std::nullopt, "192.168.101.3", "enp1s0f1np1"},
                                &resolved);
  EXPECT_EQ(r.status, CheckStatus::kFail);
  EXPECT_THAT(r.message, HasSubstr("only link-local GIDs"));
  EXPECT_THAT(r.fix, HasSubstr("assign the fabric IP 192.168.101.3 to enp1s0f1np1 persistently"));
  EXPECT_THAT(r.fix, HasSubstr("netplan"));
}

TEST(GidCheckTest, SecondHcaWhenTheIpIsOnTheTwinNamesIt) {
  std::optional<GidEntry> resolved;
  CheckResult r = CheckGidIndex(Roots("second_hca_linklocal"),
                                {"spark1", "rocep1s0f1", 1, 1, "192.168.100.3", "enp1s0f1np1"},
                                &resolved);
  EXPECT_EQ(r.status, CheckStatus::kFail);
  EXPECT_THAT(r.message, HasSubstr("gid_index 1 on rocep1s0f1 port 1 is wrong: the entry is link-local"));
  EXPECT_THAT(r.fix, HasSubstr("set hca: rocep1s0f0, netdev: enp1s0f0np0, gid_index: 3 for node spark1"));
}

TEST(GidCheckTest, EmptyConfiguredIndexAndWrongIp) {
  std::optional<GidEntry> resolved;
  CheckResult r = CheckGidIndex(Roots("healthy"),
                                {"spark1", "rocep1s0f0", 1, 7, "192.168.100.1", "enp1s0f0np0"},
                                &resolved);
  EXPECT_EQ(r.status, CheckStatus::kFail);
  EXPECT_THAT(r.message, HasSubstr("gid_index 7 on rocep1s0f0 port 1 is empty"));
  EXPECT_THAT(r.fix, HasSubstr("set gid_index: 3"));

  r = CheckGidIndex(Roots("healthy"),
                    {"spark1", "rocep1s0f0", 1, 3, "192.168.100.9", "enp1s0f0np0"}, &resolved);
  EXPECT_EQ(r.status, CheckStatus::kFail);
  EXPECT_THAT(r.message, HasSubstr("carries 192.168.100.1, not the fabric IP 192.168.100.9"));
}

}  // namespace
}  // namespace glm::preflight
