// TLS credentials for every gRPC hop (glmctl -> controller -> agents). With the three files set
// the hop is mutual TLS: the server requires a client certificate signed by the cluster CA and the
// client verifies the server's certificate (its SANs must name the address dialled) against the
// same CA. With none set the hop is plaintext; a partial set is an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace glm::rpc {

struct TlsFiles {
  std::string ca;    // PEM cluster CA certificate.
  std::string cert;  // PEM certificate of this end (server or client).
  std::string key;   // PEM private key matching `cert`.

  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// Reads a whole file; the error names the path and what it was for (`what`).
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what);

// Within this many seconds of a certificate's expiry the controller (at start) and `glmctl
// status` warn: 14 days.
inline constexpr int64_t kCertificateExpiryWarningS = 14 * 86400;

// Seconds from `now` until the PEM certificate at `path` expires (negative once expired).
// Errors name the file.
absl::StatusOr<int64_t> CertificateSecondsLeft(const std::string& path,
                                               std::chrono::system_clock::time_point now);

// Insecure credentials when `files` is empty; mTLS (client certificate required and verified)
// otherwise. Errors name the missing or unreadable file; a certificate (this end's or the CA)
// that has expired or is not valid yet is FAILED_PRECONDITION naming the file, the date and the
// fix (glmctl certs --renew), since every TLS peer would refuse it in the handshake.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& files);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TlsFiles& files);

}  // namespace glm::rpc
