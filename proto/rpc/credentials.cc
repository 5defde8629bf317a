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

// The first certificate of `pem`; null when there is none.
X509* ReadCertificate(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = bio != nullptr ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr;
  BIO_free(bio);
  return cert;
}

// "Mar  1 12:00:00 2025 GMT".
std::string FormatTime(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return "?";
  std::string out = "?";
  if (ASN1_TIME_print(bio, t) == 1) {
    char* data = nullptr;
    const long len = BIO_get_mem_data(bio, &data);
    if (len > 0) out.assign(data, static_cast<size_t>(len));
  }
  BIO_free(bio);
  return out;
}

// FAILED_PRECONDITION when the certificate in `pem` (read from `path`, used as `what`) has
// expired or is not valid yet at `now`: TLS peers would refuse it in every handshake, with a
// message that names neither the file nor the date. Unparsable PEM is left to gRPC.
absl::Status CheckValidity(const std::string& pem, const std::string& path,
                           const std::string& what, std::chrono::system_clock::time_point now) {
  X509* cert = ReadCertificate(pem);
  if (cert == nullptr) return absl::OkStatus();
  time_t now_t = std::chrono::system_clock::to_time_t(now);  // X509_cmp_time takes it non-const
  const bool is_ca = what.find("CA") != std::string::npos;
  const std::string fix =
      is_ca ? "Fix: make a new cluster CA and certificates (glmctl certs --force --out DIR "
              "cluster.yaml), install them on every node and restart the daemons"
            : "Fix: re-issue the certificates from the cluster CA (glmctl certs --renew --out DIR "
              "cluster.yaml), install them and restart the daemon or re-run glmctl";
  absl::Status status;
  if (X509_cmp_time(X509_get0_notAfter(cert), &now_t) < 0) {
    status = absl::FailedPreconditionError(absl::StrCat(
        what, " '", path, "' expired on ", FormatTime(X509_get0_notAfter(cert)),
        "; TLS peers refuse an expired certificate. ", fix));
  } else if (X509_cmp_time(X509_get0_notBefore(cert), &now_t) > 0) {
    status = absl::FailedPreconditionError(absl::StrCat(
        what, " '", path, "' is not valid before ", FormatTime(X509_get0_notBefore(cert)),
        "; TLS peers refuse it until then. Fix: check this host's clock (timedatectl), or ",
        fix.substr(5)));
  }
  X509_free(cert);
  return status;
}

// Reads the three files and checks that the CA and this end's certificate are valid now.
struct TlsPems {
  std::string ca;
  std::string cert;
  std::string key;
};
absl::StatusOr<TlsPems> ReadTlsFiles(const TlsFiles& files) {
  if (auto s = CheckComplete(files); !s.ok()) return s;
  TlsPems pems;
  auto ca = ReadPemFile(files.ca, "TLS CA certificate");
  if (!ca.ok()) return ca.status();
  auto cert = ReadPemFile(files.cert, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(files.key, "TLS private key");
  if (!key.ok()) return key.status();
  const auto now = std::chrono::system_clock::now();
  if (auto s = CheckValidity(*cert, files.cert, "TLS certificate", now); !s.ok()) return s;
  if (auto s = CheckValidity(*ca, files.ca, "TLS CA certificate", now); !s.ok()) return s;
  return TlsPems{*std::move(ca), *std::move(cert), *std::move(key)};
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
  X509* cert = ReadCertificate(*pem);
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
  absl::StatusOr<TlsPems> pems = ReadTlsFiles(files);
  if (!pems.ok()) return pems.status();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = pems->ca;
  options.pem_key_cert_pairs.push_back({pems->key, pems->cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<TlsPems> pems = ReadTlsFiles(files);
  if (!pems.ok()) return pems.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pems->ca;
  options.pem_private_key = pems->key;
  options.pem_cert_chain = pems->cert;
  return grpc::SslCredentials(options);
}

}  // namespace glm::rpc
