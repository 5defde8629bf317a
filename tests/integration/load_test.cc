// The Load phase through the daemons: a local TP2 x PP2 cluster on loopback (glmctl starts the
// controller and four agents) over tests/golden/tiny-dense. `glmctl up` passes Stage -> Load ->
// Ready; every agent validates its PP stage, then the group forms and each rank reads its TP slice;
// `glmctl status` shows the shards with bytes loaded, load time and page-cache figures. A second
// `up --force` finds the shards loaded and re-forms the group in a new epoch, and `glmctl down`
// stops them.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace glm::testing {
namespace {

using std::chrono::seconds;

class LoadClusterTest : public LoopbackClusterTest {
 protected:
  LoadClusterTest() : LoopbackClusterTest("loadtest") {}
  void SetUp() override {
    ClusterYaml cluster;
    cluster.local = true;
    cluster.kv_cache_bytes = "16MiB";
    cluster.parallel_lines =
        "  tensor: 2\n  pipeline: 2\n  replicas: 1\n  layer_partition: [2, 1]\n";
    cluster.sections = "page_cache:\n  policy: periodic\n  interval_s: 30\n";
    for (int i = 1; i <= 4; ++i) cluster.nodes.push_back({absl::StrCat("node-", i), ""});
    WriteClusterYaml(cluster);
  }
};

TEST_F(LoadClusterTest, UpLoadsEveryShardAndStatusShowsThem) {
  auto t0 = std::chrono::steady_clock::now();
  CommandResult up = Glmctl({"up", yaml_}, seconds(120));
  const double up_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(up.exit_code, 0) << up.output;
  std::cout << "[ measure ] glmctl up (TP2 x PP2, tiny-dense, 4 local agents): " << up_s << " s\n";
  EXPECT_NE(up.output.find("is up"), std::string::npos) << up.output;
  // The Load phase ran on every node after Stage, with byte progress and a summary line.
  const size_t stage = up.output.find("[Stage]");
  const size_t load = up.output.find("[Load]");
  ASSERT_NE(load, std::string::npos) << up.output;
  EXPECT_LT(stage, load) << up.output;
  // Each rank validates and prepares its stage, then reads its TP slice as the group forms.
  for (int i = 1; i <= 4; ++i) {
    EXPECT_NE(up.output.find(absl::StrCat("[Load] node-", i, ": Connected: prepared layers ")),
              std::string::npos)
        << up.output;
  }
  EXPECT_NE(up.output.find("prepared layers 0-1 + embedding"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("prepared layers 2-2 + norm/lm_head"), std::string::npos)
      << up.output;
  EXPECT_NE(up.output.find("running: world rank 3 (pp 1, tp 1)"), std::string::npos)
      << up.output;

  // Status: every node Ready with its shard Loaded and page-cache figures (the status stream
  // keeps them current; the Load phase recorded them already).
  nlohmann::json status = StatusJson();
  ASSERT_FALSE(status.is_null());
  EXPECT_EQ(status["phase"], "Ready");
  ASSERT_EQ(status["nodes"].size(), 4u);
  int64_t freed = 0;
  for (const auto& n : status["nodes"]) {
    SCOPED_TRACE(n.dump());
    EXPECT_EQ(n["state"], "Ready");
    const nlohmann::json& shard = n["shard"];
    ASSERT_TRUE(shard.is_object());
    EXPECT_EQ(shard["state"], "Running");
    const bool first = n["name"] == "node-1" || n["name"] == "node-2";
    EXPECT_EQ(shard["layers"], nlohmann::json(first ? std::vector<int>{0, 1}
                                                    : std::vector<int>{2, 2}));
    EXPECT_EQ(shard["tp_size"], 2);
    EXPECT_EQ(shard["tp_replicated"], false);
    // CPU ranks: the TP all-reduces run over Gloo, and the status says why not NCCL.
    EXPECT_EQ(shard["tp_transport"], "gloo (rank 0 runs the cpu backend)");
    EXPECT_GT(shard["bytes_total"].get<int64_t>(), 0);
    EXPECT_GE(shard["load_time_ms"].get<int64_t>(), 0);
    EXPECT_GT(shard["kv_cache_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(shard["page_cache"]["policy"], "periodic");
    EXPECT_EQ(shard["page_cache"]["fadvise_ranges"], shard["tensors_loaded"]);
    freed += shard["page_cache"]["fadvise_bytes_freed"].get<int64_t>();
    std::cout << "[ measure ] " << n["name"].get<std::string>() << ": layers "
              << shard["layers"].dump() << ", " << shard["bytes_loaded"] << " B in "
              << shard["load_time_ms"] << " ms, fadvise freed "
              << shard["page_cache"]["fadvise_bytes_freed"] << " B\n";
  }
  EXPECT_GE(freed, 0);
  CommandResult table = Glmctl({"status", yaml_}, seconds(10));
  ASSERT_EQ(table.exit_code, 0) << table.output;
  for (const char* want : {"SHARD", "LOAD TIME", "PAGE CACHE", "Running", "0/2 gloo",
                           "pp stage 0 tp transport: gloo (rank 0 runs the cpu backend)"}) {
    EXPECT_NE(table.output.find(want), std::string::npos) << want << "\n" << table.output;
  }

  // Re-running the whole bring-up finds every shard already loaded.
  CommandResult again = Glmctl({"up", "--force", yaml_}, seconds(120));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("shard already loaded"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("running: world rank 0"), std::string::npos) << again.output;

  // Down stops the shards before the processes go.
  CommandResult down = Glmctl({"down", yaml_}, seconds(30));
  EXPECT_EQ(down.exit_code, 0) << down.output;
  EXPECT_NE(down.output.find("shards stopped on 4 of 4 node(s)"), std::string::npos)
      << down.output;
  EXPECT_NE(down.output.find("stopped: freed layers [0, 2)"), std::string::npos) << down.output;
}

}  // namespace
}  // namespace glm::testing
