#include "agent/preflight/node_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::preflight {
namespace {

using ::testing::HasSubstr;

constexpr char kYaml[] = R"(
fabric: {mtu: 9000, subnet: 192.168.100.0/24}
nccl: {library: /opt/nccl/libnccl.so.2, expected_version: "2.30.4"}
nodes:
  - name: a
    fabric_ip: 192.168.100.1
    hca: rocep1s0f0
    netdev: enp1s0f0np0
    gid_index: auto
  - name: b
    fabric_ip: 192.168.100.2
    hca: rocep1s0f1
    port: 2
    netdev: enp1s0f1np1
    gid_index: 5
    fabric: {mtu: 4200}
)";

TEST(NodeConfigTest, ReadsNodeWithDefaults) {
  auto a = ParseNodePreflightConfig(kYaml, "a", "c.yaml");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->gid_index.has_value());
  EXPECT_EQ(a->fabric_mtu, 9000);
  EXPECT_EQ(a->nccl_expected_version, "2.30.4");
  EXPECT_EQ(a->port, 1);
  auto b = ParseNodePreflightConfig(kYaml, "b", "c.yaml");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->gid_index, 5);
  EXPECT_EQ(b->port, 2);
  EXPECT_EQ(b->fabric_mtu, 4200);
}

TEST(NodeConfigTest, ErrorsNameFileLineField) {
  auto missing = ParseNodePreflightConfig(kYaml, "zz", "c.yaml");
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no node named 'zz'"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("have: a, b"));
  auto bad = ParseNodePreflightConfig("nodes:\n  - name: a\n    fabric_ip: 1.2.3.4\n    hca: x\n    netdev: y\n    gid_index: three\n", "a", "c.yaml");
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("c.yaml:6: field 'gid_index' must be an integer"));
  auto nohca = ParseNodePreflightConfig("nodes:\n  - name: a\n    fabric_ip: 1.2.3.4\n    netdev: y\n", "a", "c.yaml");
  EXPECT_THAT(std::string(nohca.status().message()), HasSubstr("has no 'hca' field"));
}

}  // namespace
}  // namespace glm::preflight
