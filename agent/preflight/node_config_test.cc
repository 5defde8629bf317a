#include "agent/preflight/node_config.h"

#include <filesystem>
#include <fstream>

#include "common/testing/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::preflight {
namespace {

using ::testing::HasSubstr;

constexpr char kYaml[] = R"(
name: t
model: {path: /models/x, max_model_len: 4096}
parallel: {tensor: 2}
fabric: {mtu: 9000, subnet: 192.168.100.0/24}
nccl: {library: /opt/nccl/libnccl.so.2, expected_version: "2.30.4"}
node_defaults: {hca: rocep1s0f0, netdev: enp1s0f0np0, gid_index: auto}
nodes:
  - {name: a, agent: 10.0.0.1:47101, fabric_ip: 192.168.100.1}
  - {name: b, agent: 10.0.0.2:47101, fabric_ip: 192.168.100.2, hca: rocep1s0f1, port: 2,
     netdev: enp1s0f1np1, gid_index: 5}
)";

std::string Write(const std::string& text) {
  std::filesystem::path p = testing_util::ScratchDir("node_config") / "node_config_test.yaml";
  std::ofstream(p) << text;
  return p.string();
}

TEST(NodeConfigTest, ReadsNodeWithDefaults) {
  std::string path = Write(kYaml);
  auto a = LoadNodePreflightConfig(path, "a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->hca, "rocep1s0f0");
  EXPECT_EQ(a->netdev, "enp1s0f0np0");
  EXPECT_FALSE(a->gid_index.has_value());
  EXPECT_EQ(a->fabric_mtu, 9000);
  EXPECT_EQ(a->nccl_library, "/opt/nccl/libnccl.so.2");
  EXPECT_EQ(a->nccl_expected_version, "2.30.4");
  EXPECT_EQ(a->port, 1);
  auto b = LoadNodePreflightConfig(path, "b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->gid_index, 5);
  EXPECT_EQ(b->port, 2);
  EXPECT_EQ(b->hca, "rocep1s0f1");
}

TEST(NodeConfigTest, UnknownNodeListsNames) {
  auto missing = LoadNodePreflightConfig(Write(kYaml), "zz");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no node named 'zz'"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("have: a, b"));
  EXPECT_FALSE(LoadNodePreflightConfig(Write("name: [broken"), "a").ok());
}

}  // namespace
}  // namespace glm::preflight
