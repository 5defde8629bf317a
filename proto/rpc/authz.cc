#include "proto/rpc/authz.h"

#include <memory>
#include <utility>

#include <openssl/bio.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "proto/rpc/audit.h"

namespace glm::rpc {
namespace {

constexpr Role kAllRoles[] = {Role::kController, Role::kAgent, Role::kOperator};

// The subject OU of the PEM certificate `pem`; empty when absent or unparsable.
std::string SubjectOu(std::string_view pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return "";
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) return "";
  std::string ou;
  X509_NAME* name = X509_get_subject_name(cert);
  const int index = X509_NAME_get_index_by_NID(name, NID_organizationalUnitName, -1);
  if (index >= 0) {
    unsigned char* utf8 = nullptr;
    const int len =
        ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index)));
    if (len > 0) ou.assign(reinterpret_cast<const char*>(utf8), static_cast<size_t>(len));
    OPENSSL_free(utf8);
  }
  X509_free(cert);
  return ou;
}

std::string RoleList(const std::set<Role>& roles) {
  if (roles.empty()) return "none";
  std::vector<std::string> names;
  for (Role r : roles) names.emplace_back(RoleName(r));
  return absl::StrJoin(names, ", ");
}

class AuthzProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit AuthzProcessor(const AuthzPolicy* policy) : policy_(policy) {}

  // Cheap (a table lookup and one certificate parse): runs on the call's thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata*, OutputMetadata*) override {
    std::string path;
    if (auto it = auth_metadata.find(":path"); it != auth_metadata.end()) {
      path.assign(it->second.data(), it->second.size());
    }
    const Caller caller = context != nullptr ? CallerFromAuthContext(*context) : Caller{"insecure"};
    const absl::Status allowed = policy_->Check(path, caller);
    if (allowed.ok()) return grpc::Status::OK;
    GLM_LOG_WARN("authz refused method={} who={} role={}", path, caller.identity,
                 RoleName(caller.role));
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(allowed.message()));
  }

 private:
  const AuthzPolicy* const policy_;
};

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kController: return "controller";
    case Role::kAgent: return "agent";
    case Role::kOperator: return "operator";
    case Role::kNone: break;
  }
  return "none";
}

Role RoleFromOu(std::string_view ou) {
  for (Role r : kAllRoles) {
    if (ou == RoleName(r)) return r;
  }
  return Role::kNone;
}

Role RoleOf(std::string_view common_name, std::string_view ou) {
  if (ou.empty()) return common_name == "controller" ? Role::kController : Role::kNone;
  return RoleFromOu(ou);
}

Caller CallerFromAuthContext(const grpc::AuthContext& auth) {
  Caller caller{IdentityFromAuthContext(&auth), Role::kNone};
  if (!auth.IsPeerAuthenticated()) return caller;
  std::string ou;
  for (const grpc::string_ref& pem : auth.FindPropertyValues("x509_pem_cert")) {
    ou = SubjectOu(std::string_view(pem.data(), pem.size()));
    break;
  }
  std::string cn;
  for (const grpc::string_ref& value : auth.FindPropertyValues("x509_common_name")) {
    cn.assign(value.data(), value.size());
    break;
  }
  caller.role = RoleOf(cn, ou);
  return caller;
}

AuthzPolicy::AuthzPolicy(std::string service, std::map<std::string, std::set<Role>> methods,
                         std::map<Role, std::string> fixes)
    : service_(std::move(service)), methods_(std::move(methods)), fixes_(std::move(fixes)) {}

std::vector<std::string> AuthzPolicy::Methods() const {
  std::vector<std::string> out;
  for (const auto& [name, roles] : methods_) out.push_back(name);
  return out;
}

std::set<Role> AuthzPolicy::AllowedRoles(std::string_view method) const {
  auto it = methods_.find(std::string(method));
  return it == methods_.end() ? std::set<Role>{} : it->second;
}

absl::Status AuthzPolicy::Check(std::string_view path, const Caller& caller) const {
  // The controller drives everything, so a method the table lacks stays callable by it only.
  if (caller.role == Role::kController) return absl::OkStatus();
  const std::string prefix = absl::StrCat("/", service_, "/");
  std::set<Role> allowed;
  std::string method(path);
  if (path.substr(0, prefix.size()) == prefix) {
    method = std::string(path.substr(prefix.size()));
    allowed = AllowedRoles(method);
  }
  if (allowed.count(caller.role) > 0) return absl::OkStatus();
  std::set<Role> open_to = allowed;
  open_to.insert(Role::kController);
  auto fix = fixes_.find(caller.role);
  const std::string role(RoleName(caller.role));
  return absl::PermissionDeniedError(absl::StrCat(
      service_, "/", method, " refused: the client certificate '", caller.identity,
      "' has role ", role, "; this RPC is open only to role(s) ", RoleList(open_to), ". Fix: ",
      fix != fixes_.end() ? fix->second
                          : "present the certificate `glmctl certs` wrote for that role"));
}

const AuthzPolicy& AgentAuthzPolicy() {
  const std::set<Role> controller = {Role::kController};
  static const AuthzPolicy* const policy = new AuthzPolicy(
      "glm.v1.Agent",
      {
          {"Info", controller},
          {"Preflight", controller},
          {"StageNccl", controller},
          {"StageWeights", controller},
          {"LoadShard", controller},
          {"StartShard", controller},
          {"DrainShard", controller},
          {"StopShard", controller},
          {"RestartProcess", controller},
          {"WatchStatus", controller},
          {"Generate", controller},
          {"FetchFile", {Role::kController, Role::kAgent}},  // peers' stagers
          {"Logs", controller},
      },
      {
          {Role::kAgent,
           "an agent's certificate may only fetch staged files from its peers (FetchFile); "
           "control RPCs come from the controller with controller.pem"},
          {Role::kOperator,
           "the operator's certificate talks to the controller only: run glmctl against the "
           "controller (glmctl status/logs/restart cluster.yaml), which drives the agents"},
          {Role::kNone,
           "this certificate carries no glmctl role (subject OU controller, agent or "
           "operator); use the certificates `glmctl certs --out DIR cluster.yaml` writes "
           "(controller.pem for the controller, <node>.pem for agents)"},
      });
  return *policy;
}

const AuthzPolicy& ControllerAuthzPolicy() {
  const std::set<Role> control = {Role::kController, Role::kOperator};
  const std::set<Role> rendezvous = {Role::kController, Role::kOperator, Role::kAgent};
  static const AuthzPolicy* const policy = new AuthzPolicy(
      "glm.v1.Controller",
      {
          {"Up", control},
          {"Status", control},
          {"Health", control},
          {"Restart", control},
          {"Down", control},
          {"Plan", control},
          {"Validate", control},
          {"Preflight", control},
          {"Generate", control},
          {"RendezvousPut", rendezvous},  // the agents' engine shards form their groups here
          {"RendezvousGet", rendezvous},
          {"RendezvousDelete", rendezvous},
          {"Logs", control},
      },
      {
          {Role::kAgent,
           "an agent's certificate may only use the shard groups' rendezvous; run glmctl with "
           "the operator certificate `glmctl certs` writes (operator.pem next to ca.pem)"},
          {Role::kNone,
           "this certificate carries no glmctl role (subject OU controller, agent or "
           "operator); use the operator certificate `glmctl certs --out DIR cluster.yaml` "
           "writes (operator.pem next to ca.pem)"},
      });
  return *policy;
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthzProcessor(const AuthzPolicy* policy) {
  return std::make_shared<AuthzProcessor>(policy);
}

}  // namespace glm::rpc
