// Secure by default: a gRPC control plane (controller, agent) listens beyond loopback only with
// mTLS, or with an explicit opt-out (agent `--insecure`, cluster.yaml `controller.insecure:
// true`).
#pragma once

#include <string_view>

namespace grpc {
class ServerBuilder;
}

namespace glm::rpc {

// Largest request either daemon accepts: a GenerateRequest of a 1M-token prompt is under 5 MiB,
// every other control message is tiny. Larger ones end RESOURCE_EXHAUSTED before any handler
// runs. Responses (FetchFile chunks, token events) are bounded by their senders.
inline constexpr int kMaxRequestBytes = 16 << 20;
// Applies kMaxRequestBytes to a daemon's server.
void LimitRequestSizes(grpc::ServerBuilder& builder);

// True when `listen` ("host:port", "[v6]:port", "unix:...") can only be reached from this host:
// 127.0.0.0/8, ::1, localhost, or a unix socket. Wildcards (0.0.0.0, [::]), other addresses and
// names are false.
bool IsLoopbackListen(std::string_view listen);

// Whether a plaintext server on `listen` must be refused: not loopback, no TLS, no opt-out.
inline bool RefuseInsecureListen(std::string_view listen, bool tls_enabled, bool insecure_opt_out) {
  return !tls_enabled && !insecure_opt_out && !IsLoopbackListen(listen);
}

}  // namespace glm::rpc
