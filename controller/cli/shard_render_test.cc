#include "controller/cli/shard_render.h"

#include <sstream>

#include "controller/cli/render.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

glm::v1::ClusterStatus TwoNodes() {
  glm::v1::ClusterStatus s;
  s.set_cluster_name("demo");
  s.set_phase(glm::v1::BRING_UP_PHASE_READY);
  for (int i = 0; i < 2; ++i) {
    glm::v1::NodeStatus* n = s.add_nodes();
    n->set_name("local-" + std::to_string(i + 1));
    n->set_state(glm::v1::NODE_STATE_READY);
    glm::v1::ShardStatus* sh = n->mutable_shard();
    sh->set_state(glm::v1::SHARD_STATE_LOADED);
    sh->set_layer_begin(0);
    sh->set_layer_end(3);
    sh->set_tp_rank(i);
    sh->set_tp_size(2);
    sh->set_tp_replicated(true);
    sh->set_tp_note("not TP-sharded: TP rank 0 of 2 holds its stage's full layers");
    sh->set_bytes_loaded(747776);
    sh->set_bytes_total(747776);
    sh->set_tensors_loaded(106);
    sh->set_tensors_total(106);
    sh->set_load_time_ms(25);
    sh->set_kv_cache_bytes(64 << 20);
    sh->set_kv_capacity_tokens(139808);
    sh->set_backend("cpu");
    glm::v1::PageCacheStatus* p = sh->mutable_page_cache();
    p->set_policy("periodic");
    p->set_fadvise_bytes_freed(761856);
    p->set_fadvise_ranges(106);
    if (i == 1) {
      p->set_drop_not_permitted(true);
      p->set_drop_not_permitted_message(
          "drop_caches not permitted (/proc/sys/vm/drop_caches: Permission denied); Fix: run "
          "glm-agent as root");
    } else {
      p->set_drop_caches_count(2);
      p->set_drop_caches_bytes_freed(int64_t{3} << 30);
    }
  }
  return s;
}

TEST(ShardRenderTest, TableShowsStateBytesLoadTimeAndPageCache) {
  std::ostringstream out;
  PrintShardTable(out, TwoNodes());
  const std::string text = out.str();
  EXPECT_THAT(text, AllOf(HasSubstr("SHARD"), HasSubstr("LOAD TIME"), HasSubstr("PAGE CACHE"),
                          HasSubstr("Loaded"), HasSubstr("0-2"), HasSubstr("1/2 full copy"),
                          HasSubstr("730 KiB/730 KiB (106/106 tensors)"), HasSubstr("0.03s"),
                          HasSubstr("64.0 MiB (139808 tok)"),
                          HasSubstr("periodic: fadvise freed 744 KiB (106 ranges), drop_caches 2 "
                                    "(3.00 GiB)"),
                          HasSubstr("drop NOT PERMITTED"),
                          HasSubstr("note: TP is not sharded yet: each of the 2 TP ranks"),
                          HasSubstr("local-2: drop_caches not permitted")));
}

TEST(ShardRenderTest, NoShardsSaysSo) {
  glm::v1::ClusterStatus s;
  s.add_nodes()->set_name("n1");
  std::ostringstream out;
  PrintShardTable(out, s);
  EXPECT_EQ(out.str(), "shards: none loaded yet\n");
  EXPECT_TRUE(ShardToJson(s.nodes(0)).is_null());
}

TEST(ShardRenderTest, StatusJsonAndTableCarryTheShard) {
  glm::v1::ClusterStatus s = TwoNodes();
  nlohmann::json j = StatusToJson(s);
  ASSERT_EQ(j["nodes"].size(), 2u);
  const nlohmann::json& shard = j["nodes"][1]["shard"];
  EXPECT_EQ(shard["state"], "Loaded");
  EXPECT_EQ(shard["layers"], nlohmann::json({0, 2}));
  EXPECT_EQ(shard["bytes_loaded"], 747776);
  EXPECT_EQ(shard["load_time_ms"], 25);
  EXPECT_EQ(shard["tp_replicated"], true);
  EXPECT_EQ(shard["page_cache"]["fadvise_bytes_freed"], 761856);
  EXPECT_EQ(shard["page_cache"]["drop_not_permitted"], true);
  EXPECT_EQ(j["nodes"][0]["shard"]["page_cache"]["drop_caches_count"], 2);
  std::ostringstream out;
  PrintStatusTable(out, s);
  EXPECT_THAT(out.str(), AllOf(HasSubstr("SHARD"), HasSubstr("fadvise freed")));

  s.mutable_nodes(0)->mutable_shard()->set_state(glm::v1::SHARD_STATE_FAILED);
  s.mutable_nodes(0)->mutable_shard()->set_last_error("LoadShard on node 'local-1': corrupt");
  std::ostringstream failed;
  PrintShardTable(failed, s);
  EXPECT_THAT(failed.str(), AllOf(HasSubstr("Failed"),
                                  HasSubstr("local-1 load failed: LoadShard on node 'local-1'")));
  EXPECT_THAT(failed.str(), Not(HasSubstr("local-1: drop_caches")));
}

TEST(ShardRenderTest, TpTransportShowsInTheTableJsonAndWhyNotNcclInTheNotes) {
  glm::v1::ClusterStatus s = TwoNodes();
  for (int i = 0; i < 2; ++i) {
    glm::v1::ShardStatus* sh = s.mutable_nodes(i)->mutable_shard();
    sh->set_tp_replicated(false);
    sh->set_state(glm::v1::SHARD_STATE_RUNNING);
    sh->set_tp_transport("gloo (host path: ranks 0 and 1 share GPU GPU-0b1c)");
  }
  std::ostringstream gloo;
  PrintShardTable(gloo, s);
  EXPECT_THAT(gloo.str(),
              AllOf(HasSubstr("0/2 gloo"), HasSubstr("1/2 gloo"),
                    HasSubstr("local-1: pp stage 0 tp transport: gloo (host path: ranks 0 and 1 "
                              "share GPU GPU-0b1c)")));
  EXPECT_THAT(gloo.str(), Not(HasSubstr("local-2: pp stage")));  // one note per stage
  EXPECT_EQ(ShardToJson(s.nodes(1))["tp_transport"],
            "gloo (host path: ranks 0 and 1 share GPU GPU-0b1c)");

  for (int i = 0; i < 2; ++i) s.mutable_nodes(i)->mutable_shard()->set_tp_transport("nccl");
  std::ostringstream nccl;
  PrintShardTable(nccl, s);
  EXPECT_THAT(nccl.str(), AllOf(HasSubstr("0/2 nccl"), HasSubstr("1/2 nccl")));
  EXPECT_THAT(nccl.str(), Not(HasSubstr("tp transport")));
}

}  // namespace
}  // namespace glm::cli
