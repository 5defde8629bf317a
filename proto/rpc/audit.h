// The audit trail of control actions: every state-changing RPC (controller Up/Down/Restart,
// agent LoadShard/StartShard/DrainShard/StopShard/RestartProcess/StageWeights/StageNccl) logs
// one INFO line when its handler finishes:
//   audit action=<rpc> who=<identity> peer=<addr> outcome=ok <detail>
//   audit action=<rpc> who=<identity> peer=<addr> outcome=<CODE> error="<message>" <detail>
// `who` is the peer certificate's subject CN (else its SAN) under mTLS, else "insecure".
// `detail` is key=value pairs chosen by the caller (node, cluster, ...); never secrets.
// Servers install AuditInterceptorFactory, which logs the line for the listed methods when the
// status is sent, whichever path the handler returned by (early errors included).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"

namespace glm::rpc {

// The authenticated peer's name from `auth` (x509_common_name, else the transport's peer
// identity, e.g. a SAN); "insecure" when `auth` is null or the peer is not authenticated.
std::string IdentityFromAuthContext(const grpc::AuthContext* auth);
// IdentityFromAuthContext() of the call's auth context.
std::string PeerIdentity(const grpc::ServerContextBase& context);

// The audit line (without logger prefix). Values with spaces or quotes are quoted.
std::string FormatAudit(std::string_view action, std::string_view who, std::string_view peer,
                        const absl::Status& outcome, std::string_view detail);
// Logs FormatAudit() for the call at INFO.
void AuditLog(const grpc::ServerContextBase& context, std::string_view action,
              const absl::Status& outcome, std::string_view detail = {});

// Audits the RPCs whose method name (the part after the last '/', e.g. "StopShard") is in
// `actions`; others pass untouched. `detail` goes on every line (e.g. "node=spark-1").
// Install with ServerBuilder::experimental().SetInterceptorCreators().
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeAuditInterceptorFactory(
    std::vector<std::string> actions, std::string detail);

}  // namespace glm::rpc
