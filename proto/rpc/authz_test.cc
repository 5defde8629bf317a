#include "proto/rpc/authz.h"

#include <algorithm>
#include <string>
#include <vector>

#include "glm/v1/agent.grpc.pb.h"
#include "glm/v1/controller.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::rpc {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> ServiceMethods(const std::string& service) {
  // Through a message of each file, so that the linker keeps its generated descriptors.
  const google::protobuf::ServiceDescriptor* d =
      service == "glm.v1.Agent"
          ? glm::v1::InfoRequest::descriptor()->file()->FindServiceByName("Agent")
          : glm::v1::StatusRequest::descriptor()->file()->FindServiceByName("Controller");
  EXPECT_NE(d, nullptr) << service;
  std::vector<std::string> names;
  for (int i = 0; d != nullptr && i < d->method_count(); ++i) names.push_back(d->method(i)->name());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(AuthzRoleTest, RoleComesFromTheSubjectOu) {
  EXPECT_EQ(RoleOf("controller", "controller"), Role::kController);
  EXPECT_EQ(RoleOf("spark-1", "agent"), Role::kAgent);
  EXPECT_EQ(RoleOf("operator", "operator"), Role::kOperator);
  // The OU decides, not the CN: a node named like a role is still an agent.
  EXPECT_EQ(RoleOf("operator", "agent"), Role::kAgent);
  EXPECT_EQ(RoleOf("controller", "operator"), Role::kOperator);
  // Certificates without roles: only the controller's keeps its role.
  EXPECT_EQ(RoleOf("controller", ""), Role::kController);
  EXPECT_EQ(RoleOf("spark-1", ""), Role::kNone);
  EXPECT_EQ(RoleOf("operator", ""), Role::kNone);
  // Anything else is no role.
  EXPECT_EQ(RoleOf("x", "Agent"), Role::kNone);
  EXPECT_EQ(RoleOf("x", "admin"), Role::kNone);
  EXPECT_EQ(RoleFromOu("none"), Role::kNone);
}

// A new RPC must be placed in the table: every method of each generated service is listed, and
// the table names nothing the service lacks.
TEST(AuthzPolicyTest, EveryRpcOfBothServicesIsInTheTable) {
  EXPECT_EQ(AgentAuthzPolicy().service(), glm::v1::Agent::service_full_name());
  EXPECT_EQ(ControllerAuthzPolicy().service(), glm::v1::Controller::service_full_name());
  EXPECT_EQ(AgentAuthzPolicy().Methods(), ServiceMethods("glm.v1.Agent"));
  EXPECT_EQ(ControllerAuthzPolicy().Methods(), ServiceMethods("glm.v1.Controller"));
  for (const AuthzPolicy* p : {&AgentAuthzPolicy(), &ControllerAuthzPolicy()}) {
    for (const std::string& m : p->Methods()) {
      EXPECT_TRUE(p->AllowedRoles(m).count(Role::kController)) << p->service() << "/" << m;
    }
  }
}

TEST(AuthzPolicyTest, AgentTable) {
  const AuthzPolicy& p = AgentAuthzPolicy();
  for (const std::string& m : ServiceMethods("glm.v1.Agent")) {
    const std::string path = "/glm.v1.Agent/" + m;
    EXPECT_TRUE(p.Check(path, {"controller", Role::kController}).ok()) << m;
    EXPECT_EQ(p.Check(path, {"spark-2", Role::kAgent}).ok(), m == "FetchFile") << m;
    EXPECT_EQ(p.Check(path, {"operator", Role::kOperator}).code(),
              absl::StatusCode::kPermissionDenied) << m;
    EXPECT_EQ(p.Check(path, {"someone", Role::kNone}).code(),
              absl::StatusCode::kPermissionDenied) << m;
  }
}

TEST(AuthzPolicyTest, ControllerTable) {
  const AuthzPolicy& p = ControllerAuthzPolicy();
  for (const std::string& m : ServiceMethods("glm.v1.Controller")) {
    const std::string path = "/glm.v1.Controller/" + m;
    EXPECT_TRUE(p.Check(path, {"controller", Role::kController}).ok()) << m;
    EXPECT_TRUE(p.Check(path, {"operator", Role::kOperator}).ok()) << m;
    EXPECT_EQ(p.Check(path, {"spark-1", Role::kAgent}).ok(), m.rfind("Rendezvous", 0) == 0) << m;
    EXPECT_EQ(p.Check(path, {"someone", Role::kNone}).code(),
              absl::StatusCode::kPermissionDenied) << m;
  }
}

TEST(AuthzPolicyTest, RefusalNamesIdentityRoleRpcAndFix) {
  absl::Status s =
      ControllerAuthzPolicy().Check("/glm.v1.Controller/Down", {"spark-1", Role::kAgent});
  ASSERT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("glm.v1.Controller/Down"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'spark-1'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("role agent"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("controller, operator"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("operator.pem"));

  s = AgentAuthzPolicy().Check("/glm.v1.Agent/LoadShard", {"operator", Role::kOperator});
  EXPECT_THAT(std::string(s.message()), HasSubstr("role operator"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("talks to the controller only"));
  s = AgentAuthzPolicy().Check("/glm.v1.Agent/Info", {"old-node", Role::kNone});
  EXPECT_THAT(std::string(s.message()), HasSubstr("role none"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("glmctl certs"));
}

// Fail closed: a method or service the table does not know is the controller's only.
TEST(AuthzPolicyTest, UnknownMethodsAreTheControllersOnly) {
  const AuthzPolicy& p = ControllerAuthzPolicy();
  for (const std::string path :
       {"/glm.v1.Controller/NewRpc", "/glm.v1.Agent/Status", "/other.Service/Status", "",
        "Status"}) {
    EXPECT_TRUE(p.Check(path, {"controller", Role::kController}).ok()) << path;
    EXPECT_EQ(p.Check(path, {"operator", Role::kOperator}).code(),
              absl::StatusCode::kPermissionDenied) << path;
    EXPECT_EQ(p.Check(path, {"spark-1", Role::kAgent}).code(),
              absl::StatusCode::kPermissionDenied) << path;
  }
  EXPECT_EQ(
      AgentAuthzPolicy().Check("/glm.v1.Controller/RendezvousPut", {"n", Role::kAgent}).code(),
      absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace glm::rpc
