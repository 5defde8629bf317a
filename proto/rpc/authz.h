// Roles between the daemons, enforced by each gRPC server from the caller's client certificate.
//
// `glmctl certs` writes the role into every leaf certificate's subject as its OU
// (organizationalUnitName); the CN stays the identity that audit lines name:
//   CN=controller  OU=controller   the controller (controller.pem)
//   CN=<node>      OU=agent        a node's agent (<node>.pem)
//   CN=operator    OU=operator     the operator's glmctl (operator.pem)
// A certificate with no OU and CN "controller" is the controller (certificates written before
// roles existed, so a cluster keeps its control path until it re-issues them). Any other
// certificate the cluster CA signed has no role and may call nothing.
//
// A policy is a table: full method name ("/glm.v1.Agent/FetchFile") -> the roles that may call
// it. A method missing from the table is refused to every role but the controller (fail
// closed). Refusals are PERMISSION_DENIED with the identity, its role, the method and the fix.
// Without TLS there is no identity and servers install no policy (plaintext loopback, or the
// explicit insecure opt-in).
//
// Tables (ControllerAuthzPolicy, AgentAuthzPolicy):
//   Agent service:       controller: every RPC; agent: FetchFile (peer staging); operator: none.
//   Controller service:  controller, operator: every RPC; agent: RendezvousPut/Get/Delete (the
//                        shard groups' rendezvous the agents' engines call).
// The path-MTU echo is a UDP responder outside gRPC; nothing here applies to it.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace glm::rpc {

enum class Role { kNone, kController, kAgent, kOperator };

// "controller", "agent", "operator", "none".
std::string_view RoleName(Role role);
// The role a certificate's subject OU names; kNone for anything else.
Role RoleFromOu(std::string_view ou);

// The authenticated caller: the certificate's CN (as IdentityFromAuthContext) and its role.
struct Caller {
  std::string identity;
  Role role = Role::kNone;
};

// Role of a subject with CN `common_name` and OU `ou` (empty when absent), as described above.
Role RoleOf(std::string_view common_name, std::string_view ou);
// The caller of a TLS connection, from the leaf certificate in `auth` (x509_pem_cert property).
// Unauthenticated or unparsable: identity as IdentityFromAuthContext, role kNone.
Caller CallerFromAuthContext(const grpc::AuthContext& auth);

class AuthzPolicy {
 public:
  // `service` is the full service name ("glm.v1.Agent"); `fixes` is the advice a refused caller
  // of each role gets (what to use instead).
  AuthzPolicy(std::string service, std::map<std::string, std::set<Role>> methods,
              std::map<Role, std::string> fixes);

  const std::string& service() const { return service_; }
  // Method names of the table ("FetchFile"), sorted.
  std::vector<std::string> Methods() const;
  // Roles allowed to call `method` (a bare name); empty when the table lacks it.
  std::set<Role> AllowedRoles(std::string_view method) const;

  // OK, or PERMISSION_DENIED naming the caller, its role, the method and the fix. `path` is the
  // call's ":path" ("/glm.v1.Agent/FetchFile"); a path of another service, or none, is refused
  // to every role but the controller, like a method missing from the table.
  absl::Status Check(std::string_view path, const Caller& caller) const;

 private:
  std::string service_;
  std::map<std::string, std::set<Role>> methods_;
  std::map<Role, std::string> fixes_;
};

const AuthzPolicy& AgentAuthzPolicy();
const AuthzPolicy& ControllerAuthzPolicy();

// Enforces `policy` on every call of a TLS server: install with
// ServerCredentials::SetAuthMetadataProcessor() on the mTLS credentials (before the server
// starts). It runs before the handler, so a refused call has no effect; each refusal is logged
// at WARN. `policy` must outlive the server (the tables above are static).
std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthzProcessor(const AuthzPolicy* policy);

}  // namespace glm::rpc
