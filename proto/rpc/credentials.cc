#include "proto/rpc/credentials.h"

#include <fstream>
#include <sstream>

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

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

absl::StatusOr<int64_t> CertificateSecondsLeft(const std::string& path,
                                               std::chrono::system_clock::time_point now) {
  auto pem = ReadPemFile(path, "certificate");
  if (!pem.ok()) return pem.status();
  BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  X509* cert = bio != nullptr ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr;
  BIO_free(bio);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("certificate '", path,
                                                   "' holds no PEM X.509 certificate"));
  }
  int days = 0;
  int seconds = 0;
  ASN1_TIME* at = ASN1_TIME_set(nullptr, std::chrono::system_clock::to_time_t(now));
  const int ok = at != nullptr && ASN1_TIME_diff(&days, &seconds, at, X509_get0_notAfter(cert));
  ASN1_TIME_free(at);
  X509_free(cert);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate '", path, "': cannot read its notAfter date"));
  }
  return static_cast<int64_t>(days) * 86400 + seconds;
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
