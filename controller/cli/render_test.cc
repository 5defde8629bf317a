#include "controller/cli/render.h"

#include <sstream>

#include "controller/cli/commands.h"
#include "controller/cli/local_cluster.h"
#include "gtest/gtest.h"

namespace glm::cli {
namespace {

glm::v1::ClusterStatus Sample() {
  glm::v1::ClusterStatus s;
  s.set_cluster_name("demo");
  s.set_phase(glm::v1::BRING_UP_PHASE_READY);
  auto* n = s.add_nodes();
  n->set_name("node-1");
  n->set_address("127.0.0.1:47101");
  n->set_state(glm::v1::NODE_STATE_UNREACHABLE);
  n->set_last_error("status stream broken: connection refused");
  n->set_last_heartbeat_age_ms(4200);
  auto* r = s.add_replicas();
  r->set_index(0);
  r->set_state(glm::v1::REPLICA_STATE_FAILED);
  r->add_nodes("node-1");
  return s;
}

TEST(RenderTest, StateNames) {
  EXPECT_EQ(NodeStateName(glm::v1::NODE_STATE_UNREACHABLE), "Unreachable");
  EXPECT_EQ(NodeStateName(glm::v1::NODE_STATE_READY), "Ready");
  EXPECT_EQ(ReplicaStateName(glm::v1::REPLICA_STATE_FAILED), "Failed");
  EXPECT_EQ(PhaseName(glm::v1::BRING_UP_PHASE_PREFLIGHT), "Preflight");
}

TEST(RenderTest, JsonHasNodesAndReplicas) {
  auto j = StatusToJson(Sample());
  EXPECT_EQ(j["cluster"], "demo");
  EXPECT_EQ(j["phase"], "Ready");
  EXPECT_EQ(j["nodes"][0]["state"], "Unreachable");
  EXPECT_EQ(j["nodes"][0]["last_heartbeat_age_ms"], 4200);
  EXPECT_EQ(j["replicas"][0]["state"], "Failed");
  EXPECT_EQ(j["replicas"][0]["nodes"][0], "node-1");
}

TEST(RenderTest, TableShowsErrorsAndReplicas) {
  std::ostringstream out;
  PrintStatusTable(out, Sample());
  std::string t = out.str();
  EXPECT_NE(t.find("Unreachable"), std::string::npos) << t;
  EXPECT_NE(t.find("connection refused"), std::string::npos) << t;
  EXPECT_NE(t.find("4.2s ago"), std::string::npos) << t;
  EXPECT_NE(t.find("REPLICA"), std::string::npos) << t;
}

TEST(RenderTest, SpeculativeDecodingShowsOnlyWhenOn) {
  glm::v1::ClusterStatus s = Sample();
  std::ostringstream plain;
  PrintStatusTable(plain, s);
  EXPECT_EQ(plain.str().find("speculative"), std::string::npos) << plain.str();
  EXPECT_FALSE(StatusToJson(s)["replicas"][0].contains("spec_decode"));
  auto* r = s.mutable_replicas(0);
  r->set_mtp_draft_tokens(3);
  r->set_spec_drafts(40);
  r->set_spec_draft_tokens(120);
  r->set_spec_accepted_tokens(90);
  for (int64_t n : {38, 30, 22}) r->add_spec_accepted_per_position(n);
  std::ostringstream out;
  PrintStatusTable(out, s);
  EXPECT_NE(out.str().find("speculative decoding: 3 MTP drafts per step; 90 of 120 drafts "
                           "accepted (75.0%) in 40 verify steps; by position 38/30/22"),
            std::string::npos)
      << out.str();
  const auto j = StatusToJson(s)["replicas"][0]["spec_decode"];
  EXPECT_EQ(j["draft_tokens"], 120);
  EXPECT_DOUBLE_EQ(j["acceptance_rate"].get<double>(), 0.75);
  EXPECT_EQ(j["accepted_per_position"][2], 22);
}

TEST(RenderTest, PipelineLineShowsStepsInFlightAndStageBusy) {
  glm::v1::ClusterStatus s = Sample();
  std::ostringstream before;
  PrintStatusTable(before, s);
  EXPECT_EQ(before.str().find("pipeline:"), std::string::npos) << before.str();
  s.mutable_replicas(0)->add_nodes("node-2");
  auto* n2 = s.add_nodes();
  n2->set_name("node-2");
  for (auto* n : {s.mutable_nodes(0), n2}) {
    glm::v1::ShardStatus* shard = n->mutable_shard();
    shard->set_state(glm::v1::SHARD_STATE_RUNNING);
    shard->set_pp_size(2);
  }
  glm::v1::ShardStatus* head = s.mutable_nodes(0)->mutable_shard();
  head->set_head(true);
  head->set_steps_in_flight(1);
  head->set_max_steps_in_flight_observed(2);
  head->set_stage_busy_fraction(0.41);
  n2->mutable_shard()->set_stage_busy_fraction(0.376);
  std::ostringstream out;
  PrintStatusTable(out, s);
  EXPECT_NE(out.str().find("  pipeline: 1 steps in flight (at most 2); stage busy: node-1 41%, "
                           "node-2 38%"),
            std::string::npos)
      << out.str();
  const auto j = StatusToJson(s)["nodes"][0]["shard"];
  EXPECT_EQ(j["max_steps_in_flight_observed"], 2);
  EXPECT_DOUBLE_EQ(j["stage_busy_fraction"].get<double>(), 0.41);
}

TEST(RenderTest, AnOpenControlPlaneIsAWarning) {
  glm::v1::ClusterStatus s = Sample();
  s.set_config_path("/etc/glm/cluster.yaml");
  std::ostringstream quiet;
  PrintStatusTable(quiet, s);
  EXPECT_EQ(quiet.str().find("warning:"), std::string::npos) << quiet.str();
  s.set_insecure_listen("0.0.0.0:47100");
  s.mutable_nodes(0)->set_insecure(true);
  std::ostringstream out;
  PrintStatusTable(out, s);
  EXPECT_NE(out.str().find("warning: the controller serves plaintext gRPC on 0.0.0.0:47100"),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("warning: agent(s) node-1 serve plaintext gRPC beyond loopback"),
            std::string::npos)
      << out.str();
  const auto j = StatusToJson(s);
  EXPECT_EQ(j["controller"]["insecure"], true);
  EXPECT_EQ(j["nodes"][0]["insecure"], true);
  EXPECT_EQ(j["warnings"].size(), 2u);
}

TEST(ValidateTest, ControlPlaneExposureWithoutTls) {
  cluster::ClusterSpec spec;
  spec.controller.listen = "0.0.0.0:47100";
  ControlPlaneCheck refused = CheckControlPlane(spec, "c.yaml");
  EXPECT_NE(refused.error.find("refuses to serve plaintext gRPC"), std::string::npos)
      << refused.error;
  EXPECT_NE(refused.error.find("glmctl certs --out DIR c.yaml"), std::string::npos);
  spec.controller.insecure = true;
  ControlPlaneCheck open = CheckControlPlane(spec, "c.yaml");
  EXPECT_TRUE(open.error.empty());
  ASSERT_EQ(open.warnings.size(), 1u);
  EXPECT_NE(open.warnings[0].find("controller.insecure: true"), std::string::npos);
  spec.controller.insecure = false;
  spec.controller.listen = "127.0.0.1:47100";
  ControlPlaneCheck loopback = CheckControlPlane(spec, "c.yaml");
  EXPECT_TRUE(loopback.error.empty());
  ASSERT_EQ(loopback.warnings.size(), 1u);  // not local: nodes on other hosts need TLS
  spec.local = true;
  EXPECT_TRUE(CheckControlPlane(spec, "c.yaml").warnings.empty());
  spec.local = false;
  spec.controller.listen = "0.0.0.0:47100";
  spec.controller.tls = cluster::TlsFiles{};
  ControlPlaneCheck tls = CheckControlPlane(spec, "c.yaml");
  EXPECT_TRUE(tls.error.empty());
  EXPECT_TRUE(tls.warnings.empty());
}

TEST(RenderTest, PlainProgressIsOneLinePerEvent) {
  std::ostringstream out;
  UpProgress p(out, /*tty=*/false, {"a", "b"});
  glm::v1::UpEvent e;
  e.set_phase(glm::v1::BRING_UP_PHASE_CONNECT);
  e.set_node("a");
  e.set_node_state(glm::v1::NODE_STATE_CONNECTED);
  e.set_message("connected");
  p.OnEvent(e);
  EXPECT_EQ(out.str(), "[Connect] a: Connected: connected\n");
  EXPECT_EQ(out.str().find('\x1b'), std::string::npos);
}

TEST(RenderTest, ByteProgressShowsABar) {
  std::ostringstream out;
  UpProgress p(out, /*tty=*/false, {"a"});
  glm::v1::UpEvent e;
  e.set_phase(glm::v1::BRING_UP_PHASE_STAGE);
  e.set_node("a");
  e.set_message("weights");
  e.mutable_progress()->set_done_bytes(1LL << 30);
  e.mutable_progress()->set_total_bytes(4LL << 30);
  p.OnEvent(e);
  EXPECT_NE(out.str().find("[#####---------------]  25% 1.00 GiB/4.00 GiB"), std::string::npos)
      << out.str();

  // A tiny file (a config, the test checkpoints) reads in bytes, not "0.00 GiB".
  out.str("");
  e.mutable_progress()->set_done_bytes(700);
  e.mutable_progress()->set_total_bytes(2900);
  p.OnEvent(e);
  EXPECT_NE(out.str().find("24% 700 B/2.83 KiB"), std::string::npos) << out.str();
}

TEST(RenderTest, HumanBytesPicksTheUnit) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(37LL * 1024 * 1024 + 300 * 1024), "37.3 MiB");
  EXPECT_EQ(HumanBytes(742LL << 30), "742 GiB");
  EXPECT_EQ(HumanBytes(3LL << 40), "3.00 TiB");
}

TEST(RenderTest, TtyProgressRedrawsInPlace) {
  std::ostringstream out;
  UpProgress p(out, /*tty=*/true, {"a", "b"});
  glm::v1::UpEvent e;
  e.set_phase(glm::v1::BRING_UP_PHASE_CONNECT);
  p.OnEvent(e);
  p.OnEvent(e);
  EXPECT_NE(out.str().find("\x1b[3A"), std::string::npos);  // moved up over phase + 2 nodes
}

TEST(RenderTest, HumanDuration) {
  EXPECT_EQ(HumanDuration(-1), "-");
  EXPECT_EQ(HumanDuration(41'000), "41s");
  EXPECT_EQ(HumanDuration(312'000), "5m12s");
  EXPECT_EQ(HumanDuration(90'000'000), "1d1h");
}

TEST(LocalClusterTest, DialAddress) {
  EXPECT_EQ(DialAddress("0.0.0.0:47100"), "127.0.0.1:47100");
  EXPECT_EQ(DialAddress("10.0.0.1:47100"), "10.0.0.1:47100");
}

}  // namespace
}  // namespace glm::cli
