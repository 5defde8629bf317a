// Roles under mTLS (proto/rpc/authz.h), with certificates made by `glmctl certs`:
// - in process: every RPC of both services, called over TLS on loopback with each role's
//   certificate against servers whose handlers are all UNIMPLEMENTED, so a call the table lets
//   through answers UNIMPLEMENTED and a refused one PERMISSION_DENIED;
// - with real daemons: a local mTLS cluster comes up through the operator's certificate, and a
//   representative set of RPCs is called on an agent and the controller with each role's
//   certificate, a role-less one signed by the cluster CA, and one from another CA.
#include <filesystem>
#include <functional>
#include <tuple>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/cli/certs.h"
#include "glm/v1/agent.grpc.pb.h"
#include "glm/v1/controller.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/rpc/authz.h"
#include "proto/rpc/credentials.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/harness.h"

namespace glm::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

struct CallResult {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
};

// One call of `method` ("/glm.v1.Agent/Info") with an empty request, as a unary call whatever
// the method's streaming (only the status matters here).
CallResult Call(const std::string& address, const std::string& method,
                const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  grpc::GenericStub stub(grpc::CreateChannel(address, creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  grpc::CompletionQueue cq;
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return {status.error_code(), status.error_message()};
}

CallResult Call(const std::string& address, const std::string& method, const rpc::TlsFiles& tls) {
  auto creds = rpc::MakeChannelCredentials(tls);
  EXPECT_TRUE(creds.ok()) << creds.status();
  if (!creds.ok()) return {};
  return Call(address, method, *creds);
}

std::vector<std::string> Methods(const std::string& service) {
  // Through a message of each file, so that the linker keeps its generated descriptors.
  const google::protobuf::ServiceDescriptor* d =
      service == "glm.v1.Agent"
          ? glm::v1::InfoRequest::descriptor()->file()->FindServiceByName("Agent")
          : glm::v1::StatusRequest::descriptor()->file()->FindServiceByName("Controller");
  EXPECT_NE(d, nullptr) << service;
  std::vector<std::string> out;
  for (int i = 0; d != nullptr && i < d->method_count(); ++i) out.push_back(d->method(i)->name());
  return out;
}

// Certificates of every kind of caller, all from `glmctl certs` code.
class Certs {
 public:
  explicit Certs(const std::string& root) : root_(root) {
    orchestrate::ClusterTopology t;
    t.cluster_name = "authz";
    t.controller_listen = "127.0.0.1:1";
    t.nodes = {{"n1", "127.0.0.1:1"}, {"n2", "127.0.0.1:1"}};
    EXPECT_TRUE(cli::MakeClusterCerts(t, {.out_dir = Dir()}).ok());
    // Signed by the cluster CA but with no role.
    auto mallory = cli::IssueLeafCert(Dir(), "mallory", "", {"127.0.0.1"}, 1);
    EXPECT_TRUE(mallory.ok()) << mallory.status();
    // A controller certificate without a role, as written before roles existed.
    fs::create_directories(root_ + "/legacy");
    fs::copy_file(Dir() + "/ca.pem", root_ + "/legacy/ca.pem");
    fs::copy_file(Dir() + "/ca.key", root_ + "/legacy/ca.key");
    auto legacy = cli::IssueLeafCert(root_ + "/legacy", "controller", "", {"127.0.0.1"}, 1);
    EXPECT_TRUE(legacy.ok()) << legacy.status();
    // Another cluster's CA.
    t.cluster_name = "stranger";
    EXPECT_TRUE(cli::MakeClusterCerts(t, {.out_dir = root_ + "/stranger"}).ok());
  }
  std::string Dir() const { return root_ + "/certs"; }
  // `name`'s certificate of this cluster (controller, operator, n1, n2, mallory).
  rpc::TlsFiles Of(const std::string& name) const {
    return {Dir() + "/ca.pem", Dir() + "/" + name + ".pem", Dir() + "/" + name + ".key"};
  }
  rpc::TlsFiles LegacyController() const {
    return {Dir() + "/ca.pem", root_ + "/legacy/controller.pem", root_ + "/legacy/controller.key"};
  }
  // The stranger's controller certificate, presented to a server of this cluster.
  rpc::TlsFiles Stranger() const {
    return {Dir() + "/ca.pem", root_ + "/stranger/controller.pem",
            root_ + "/stranger/controller.key"};
  }

 private:
  std::string root_;
};

class AuthzInProcessTest : public ::testing::Test {
 protected:
  AuthzInProcessTest() : dir_("authz-inproc"), certs_(dir_.path()) {}

  // Serves `service` on 127.0.0.1 with `server_cert`'s mTLS credentials and `policy`.
  std::unique_ptr<grpc::Server> Serve(grpc::Service* service, const rpc::TlsFiles& server_cert,
                                      const rpc::AuthzPolicy& policy, int* port) {
    auto creds = rpc::MakeServerCredentials(server_cert);
    EXPECT_TRUE(creds.ok()) << creds.status();
    (*creds)->SetAuthMetadataProcessor(rpc::MakeAuthzProcessor(&policy));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, port);
    builder.RegisterService(service);
    return builder.BuildAndStart();
  }

  TempDir dir_;
  Certs certs_;
};

// Expected from the issue's rules, independent of the table in authz.cc.
TEST_F(AuthzInProcessTest, EachRoleCallingEachRpcOfBothServices) {
  glm::v1::Agent::Service agent_service;            // every handler UNIMPLEMENTED
  glm::v1::Controller::Service controller_service;  // likewise
  int agent_port = 0;
  int controller_port = 0;
  auto agent = Serve(&agent_service, certs_.Of("n1"), rpc::AgentAuthzPolicy(), &agent_port);
  auto controller = Serve(&controller_service, certs_.Of("controller"),
                          rpc::ControllerAuthzPolicy(), &controller_port);
  ASSERT_TRUE(agent && agent_port > 0);
  ASSERT_TRUE(controller && controller_port > 0);
  const std::string agent_address = absl::StrCat("127.0.0.1:", agent_port);
  const std::string controller_address = absl::StrCat("127.0.0.1:", controller_port);

  struct Caller {
    std::string name;
    rpc::TlsFiles tls;
    std::function<bool(const std::string&)> agent_allows;
    std::function<bool(const std::string&)> controller_allows;
  };
  const auto all = [](const std::string&) { return true; };
  const auto none = [](const std::string&) { return false; };
  const std::vector<Caller> callers = {
      {"controller", certs_.Of("controller"), all, all},
      {"legacy controller", certs_.LegacyController(), all, all},
      {"agent", certs_.Of("n2"), [](const std::string& m) { return m == "FetchFile"; },
       [](const std::string& m) { return m.rfind("Rendezvous", 0) == 0; }},
      {"operator", certs_.Of("operator"), none, all},
      {"no role", certs_.Of("mallory"), none, none},
  };
  int calls = 0;
  for (const Caller& caller : callers) {
    for (const auto& [service, address, allows] :
         {std::make_tuple(std::string("glm.v1.Agent"), agent_address, caller.agent_allows),
          std::make_tuple(std::string("glm.v1.Controller"), controller_address,
                          caller.controller_allows)}) {
      for (const std::string& method : Methods(service)) {
        const std::string path = absl::StrCat("/", service, "/", method);
        CallResult r = Call(address, path, caller.tls);
        ++calls;
        if (allows(method)) {
          EXPECT_EQ(r.code, grpc::StatusCode::UNIMPLEMENTED)
              << caller.name << " " << path << ": " << r.message;
        } else {
          EXPECT_EQ(r.code, grpc::StatusCode::PERMISSION_DENIED)
              << caller.name << " " << path << ": " << r.message;
          EXPECT_NE(r.message.find(absl::StrCat(service, "/", method)), std::string::npos)
              << r.message;
          EXPECT_NE(r.message.find("Fix:"), std::string::npos) << r.message;
        }
      }
    }
  }
  EXPECT_GE(calls, 5 * 26);
  // Another CA's certificate never gets as far as the table: the handshake fails.
  for (const std::string& address : {agent_address, controller_address}) {
    CallResult r = Call(address, "/glm.v1.Agent/FetchFile", certs_.Stranger());
    EXPECT_EQ(r.code, grpc::StatusCode::UNAVAILABLE) << address << ": " << r.message;
  }
  // The refusal names the identity, its role, the RPC and the fix.
  CallResult r = Call(controller_address, "/glm.v1.Controller/Down", certs_.Of("n2"));
  EXPECT_NE(r.message.find("'n2'"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("role agent"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("operator.pem"), std::string::npos) << r.message;
  r = Call(agent_address, "/glm.v1.Agent/LoadShard", certs_.Of("operator"));
  EXPECT_NE(r.message.find("'operator'"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("role operator"), std::string::npos) << r.message;
  r = Call(agent_address, "/glm.v1.Agent/Info", certs_.Of("mallory"));
  EXPECT_NE(r.message.find("'mallory'"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("role none"), std::string::npos) << r.message;
  agent->Shutdown();
  controller->Shutdown();
}

class CertExpiryTest : public LoopbackClusterTest {
 protected:
  CertExpiryTest() : LoopbackClusterTest("certexpiry") {}
};

class AuthzClusterTest : public LoopbackClusterTest {
 protected:
  AuthzClusterTest() : LoopbackClusterTest("authz") {}
  void SetUp() override {
    ClusterYaml cluster;
    cluster.local = true;
    cluster.controller_lines =
        "  tls: {ca: certs/ca.pem, cert: certs/controller.pem, key: certs/controller.key}\n";
    cluster.nodes = {{"a1", ""}, {"a2", ""}};
    WriteClusterYaml(cluster);
  }
  std::string Cert(const std::string& name) const { return dir_->path() + "/certs/" + name; }
  rpc::TlsFiles Of(const std::string& name) const {
    return {Cert("ca.pem"), Cert(name + ".pem"), Cert(name + ".key")};
  }
  std::string ControllerAddress() const { return absl::StrCat("127.0.0.1:", ports_[0]); }
};

TEST_F(AuthzClusterTest, DaemonsAllowEachRoleItsRpcsOnly) {
  CommandResult certs = Glmctl({"certs", "--out", dir_->path() + "/certs", yaml_});
  ASSERT_EQ(certs.exit_code, 0) << certs.output;
  ASSERT_TRUE(fs::exists(Cert("operator.pem"))) << certs.output;
  // Up runs on the operator's certificate; the agents form their TP group through the
  // controller's rendezvous with theirs; the controller drives the agents with its own.
  CommandResult up = Glmctl({"up", yaml_});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  ASSERT_EQ(Glmctl({"health", yaml_}).exit_code, 0);
  CommandResult gen = Glmctl({"generate", yaml_, "--tokens", "1,2,3", "--max-tokens", "2"});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;

  const std::string agent = AgentAddress(0);
  const std::string controller = ControllerAddress();
  // A role-less certificate the cluster CA signed.
  auto mallory = cli::IssueLeafCert(dir_->path() + "/certs", "mallory", "", {"127.0.0.1"}, 1);
  ASSERT_TRUE(mallory.ok()) << mallory.status();
  const auto denied = grpc::StatusCode::PERMISSION_DENIED;

  // The agent: the controller may do anything, a peer only fetch, the operator nothing.
  EXPECT_EQ(Call(agent, "/glm.v1.Agent/Info", Of("controller")).code, grpc::StatusCode::OK);
  for (const char* who : {"a2", "operator", "mallory"}) {
    for (const char* method : {"Info", "StopShard", "LoadShard", "RestartProcess"}) {
      CallResult r = Call(agent, std::string("/glm.v1.Agent/") + method, Of(who));
      EXPECT_EQ(r.code, denied) << who << " " << method << ": " << r.message;
      EXPECT_NE(r.message.find(absl::StrCat("'", who, "'")), std::string::npos) << r.message;
    }
  }
  // A peer's fetch reaches the file server (an empty path is not servable).
  CallResult fetch = Call(agent, "/glm.v1.Agent/FetchFile", Of("a2"));
  EXPECT_NE(fetch.code, denied) << fetch.message;
  EXPECT_NE(fetch.code, grpc::StatusCode::UNAVAILABLE) << fetch.message;
  EXPECT_EQ(Call(agent, "/glm.v1.Agent/FetchFile", Of("operator")).code, denied);

  // The controller: operator and controller may do anything, an agent only the rendezvous.
  EXPECT_EQ(Call(controller, "/glm.v1.Controller/Status", Of("operator")).code,
            grpc::StatusCode::OK);
  EXPECT_EQ(Call(controller, "/glm.v1.Controller/Status", Of("controller")).code,
            grpc::StatusCode::OK);
  for (const char* who : {"a1", "mallory"}) {
    for (const char* method : {"Status", "Down", "Restart", "Logs"}) {
      CallResult r = Call(controller, std::string("/glm.v1.Controller/") + method, Of(who));
      EXPECT_EQ(r.code, denied) << who << " " << method << ": " << r.message;
      EXPECT_NE(r.message.find("operator.pem"), std::string::npos) << r.message;
    }
  }
  CallResult rendezvous = Call(controller, "/glm.v1.Controller/RendezvousGet", Of("a1"));
  EXPECT_NE(rendezvous.code, denied) << rendezvous.message;
  EXPECT_NE(rendezvous.code, grpc::StatusCode::UNAVAILABLE) << rendezvous.message;

  // Another cluster's certificates are refused by the TLS handshake on both daemons.
  orchestrate::ClusterTopology rogue;
  rogue.cluster_name = "rogue";
  rogue.controller_listen = "127.0.0.1:1";
  ASSERT_TRUE(cli::MakeClusterCerts(rogue, {.out_dir = dir_->path() + "/rogue"}).ok());
  const rpc::TlsFiles stranger{Cert("ca.pem"), dir_->path() + "/rogue/operator.pem",
                               dir_->path() + "/rogue/operator.key"};
  EXPECT_EQ(Call(controller, "/glm.v1.Controller/Status", stranger).code,
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(agent, "/glm.v1.Agent/Info", stranger).code, grpc::StatusCode::UNAVAILABLE);

  // None of the refused Down/StopShard/RestartProcess calls had an effect.
  EXPECT_EQ(Glmctl({"health", yaml_}).exit_code, 0);
  const std::string log = ReadFile(run_dir_ + "/controller.log");
  EXPECT_NE(log.find("authz refused"), std::string::npos);
  EXPECT_EQ(log.find("audit action=Down"), std::string::npos)
      << "a refused Down reached the handler";
}

// Short-lived certificates: the controller reports the time left and glmctl status warns with
// the fix; --renew re-issues them from the same CA.
TEST_F(CertExpiryTest, StatusWarnsBeforeTheControllersCertificateExpires) {
  ClusterYaml cluster;
  cluster.controller_lines =
      "  tls: {ca: certs/ca.pem, cert: certs/controller.pem, key: certs/controller.key}\n";
  cluster.nodes = {{"a1", ""}};
  WriteClusterYaml(cluster);
  const std::string certs = dir_->path() + "/certs";
  CommandResult made = Glmctl({"certs", "--out", certs, "--days", "10", yaml_});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  StartController();
  CommandResult status;
  auto took = PollUntil([&] { return (status = Glmctl({"status", yaml_})).exit_code == 0; },
                        seconds(20));
  ASSERT_GE(took.count(), 0) << status.output << ReadFile(dir_->path() + "/controller.log");
  // 9 days and some hours, or 10 days within the second it was made.
  EXPECT_TRUE(status.output.find("warning: the controller's certificate expires in 9 days") !=
                  std::string::npos ||
              status.output.find("warning: the controller's certificate expires in 10 days") !=
                  std::string::npos)
      << status.output;
  EXPECT_NE(status.output.find("glmctl certs --renew"), std::string::npos) << status.output;
  EXPECT_EQ(status.output.find("cluster CA"), std::string::npos) << status.output;
  EXPECT_NE(ReadFile(dir_->path() + "/controller.log").find("controller.pem expires in "),
            std::string::npos);
  nlohmann::json json = StatusJson();
  const int64_t cert_left = json["controller"].value("cert_expires_in_s", int64_t{0});
  EXPECT_GT(cert_left, 9 * 86400) << json.dump();
  EXPECT_LE(cert_left, 10 * 86400) << json.dump();
  EXPECT_GT(json["controller"].value("ca_expires_in_s", int64_t{0}), 365 * 86400) << json.dump();

  // Renewal keeps the CA, so the running controller still trusts the new operator certificate.
  const std::string ca = ReadFile(certs + "/ca.pem");
  CommandResult renewed = Glmctl({"certs", "--out", certs, "--renew", yaml_});
  ASSERT_EQ(renewed.exit_code, 0) << renewed.output;
  EXPECT_EQ(ReadFile(certs + "/ca.pem"), ca);
  EXPECT_EQ(Glmctl({"status", yaml_}).exit_code, 0);
  // Without --renew an existing CA is kept unless --force.
  CommandResult again = Glmctl({"certs", "--out", certs, yaml_});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("--renew"), std::string::npos) << again.output;
}

}  // namespace
}  // namespace glm::testing
