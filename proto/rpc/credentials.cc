#include "proto/rpc/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace glm::rpc {
namespace {

absl::Status CheckComplete(const TlsFiles& files) {
  if (files.ca.empty() || files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "incomplete TLS configuration (ca='", files.ca, "', cert='", files.cert, "', key='",
        files.key, "'): mutual TLS needs all three files; set them all (glmctl certs makes them) "
        "or none"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path,
                                            "': check the path (glmctl certs --out DIR makes it)"));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  if (text.find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is not PEM (no -----BEGIN line)"));
  }
  return text;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  if (auto s = CheckComplete(files); !s.ok()) return s;
  auto ca = ReadPemFile(files.ca, "TLS CA certificate");
  if (!ca.ok()) return ca.status();
  auto cert = ReadPemFile(files.cert, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(files.key, "TLS private key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = *ca;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  if (auto s = CheckComplete(files); !s.ok()) return s;
  auto ca = ReadPemFile(files.ca, "TLS CA certificate");
  if (!ca.ok()) return ca.status();
  auto cert = ReadPemFile(files.cert, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(files.key, "TLS private key");
  if (!key.ok()) return key.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  options.pem_private_key = *key;
  options.pem_cert_chain = *cert;
  return grpc::SslCredentials(options);
}

}  // namespace glm::rpc
