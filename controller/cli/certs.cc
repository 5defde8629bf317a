#include "controller/cli/certs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <utility>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace glm::cli {
namespace {

namespace fs = std::filesystem;

struct KeyDeleter { void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); } };
struct CertDeleter { void operator()(X509* c) const { X509_free(c); } };
using Key = std::unique_ptr<EVP_PKEY, KeyDeleter>;
using Cert = std::unique_ptr<X509, CertDeleter>;

absl::Status OpenSslError(const std::string& what) {
  return absl::InternalError(absl::StrCat("OpenSSL failed to ", what));
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("generate an EC P-256 key");
  return key;
}

bool IsIp(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

absl::Status AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return OpenSslError(absl::StrCat("build extension ", OBJ_nid2sn(nid), "=", value));
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return absl::OkStatus();
}

// `role` goes into the subject's OU (proto/rpc/authz.h reads it); empty for the CA.
absl::StatusOr<Cert> NewCert(const std::string& common_name, const std::string& role,
                             EVP_PKEY* key, X509* issuer, int days) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 60L * 60 * 24 * days);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("glmctl"), -1, -1, 0);
  if (!role.empty()) {
    X509_NAME_add_entry_by_txt(name, "OU", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(role.c_str()), -1, -1, 0);
  }
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  return cert;
}

absl::Status Sign(X509* cert, EVP_PKEY* key) {
  if (X509_sign(cert, key, EVP_sha256()) == 0) return OpenSslError("sign a certificate");
  return absl::OkStatus();
}

absl::Status WritePem(const fs::path& path, X509* cert, EVP_PKEY* key, bool overwrite) {
  if (!overwrite && fs::exists(path)) {
    return absl::AlreadyExistsError(absl::StrCat(
        path.string(), " exists: pass --force to replace the cluster's certificates, or choose "
                       "another --out directory"));
  }
  mode_t old = ::umask(key ? 077 : 022);
  FILE* f = std::fopen(path.c_str(), "w");
  ::umask(old);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path.string()));
  int ok = key ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr)
               : PEM_write_X509(f, cert);
  std::fclose(f);
  if (!ok) return OpenSslError(absl::StrCat("write ", path.string()));
  if (key) ::chmod(path.c_str(), 0600);
  return absl::OkStatus();
}

// One leaf certificate to issue: CN `name`, OU `role` (empty: none), SANs `hosts`.
struct LeafSpec {
  std::string name;
  std::string role;
  std::set<std::string> hosts;
};

absl::StatusOr<Cert> ReadCertFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) {
    return absl::NotFoundError(absl::StrCat("cannot read certificate ", path, ": ",
                                            std::strerror(errno)));
  }
  Cert cert(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (!cert) return absl::InvalidArgumentError(absl::StrCat(path, " is not a PEM certificate"));
  return cert;
}

// The cluster CA (ca.pem, ca.key) in `dir`.
absl::StatusOr<std::pair<Cert, Key>> LoadCa(const fs::path& dir) {
  const fs::path pem = dir / "ca.pem";
  const fs::path keyf = dir / "ca.key";
  auto cert = ReadCertFile(pem.string());
  if (!cert.ok()) {
    return absl::NotFoundError(absl::StrCat(
        cert.status().message(), ": --renew re-issues certificates from the cluster CA in --out "
        "(ca.pem and ca.key); point --out at it, or make a new CA without --renew"));
  }
  FILE* f = std::fopen(keyf.c_str(), "r");
  if (!f) {
    return absl::NotFoundError(absl::StrCat(
        "cannot read the CA key ", keyf.string(), ": ", std::strerror(errno),
        "; bring ca.key back next to ca.pem to issue certificates (or make a new CA with "
        "--force)"));
  }
  Key key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (!key) return absl::InvalidArgumentError(absl::StrCat(keyf.string(), " is not a PEM key"));
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        keyf.string(), " does not match ", pem.string(), ": restore the CA's own key"));
  }
  return std::make_pair(*std::move(cert), std::move(key));
}

// Signs `leaf` with the CA and writes <dir>/<name>.pem and .key (replacing them), appending the
// paths to `written`. A leaf with hosts is good for server and client auth; without, client only.
absl::Status IssueLeaf(const LeafSpec& leaf, X509* ca, EVP_PKEY* ca_key, int days,
                       const fs::path& dir, std::vector<std::string>* written) {
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert = NewCert(leaf.name, leaf.role, key->get(), ca, days);
  if (!cert.ok()) return cert.status();
  std::vector<std::string> sans;
  for (const auto& h : leaf.hosts) {
    if (h.empty()) continue;
    sans.push_back(absl::StrCat(IsIp(h) ? "IP:" : "DNS:", h));
  }
  std::vector<std::pair<int, std::string>> extensions = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
      {NID_ext_key_usage, sans.empty() ? "clientAuth" : "serverAuth,clientAuth"},
      {NID_authority_key_identifier, "keyid:always"}};
  if (!sans.empty()) extensions.push_back({NID_subject_alt_name, absl::StrJoin(sans, ",")});
  for (const auto& [nid, v] : extensions) {
    if (auto s = AddExt(cert->get(), ca, nid, v); !s.ok()) return s;
  }
  if (auto s = Sign(cert->get(), ca_key); !s.ok()) return s;
  fs::path pem = dir / (leaf.name + ".pem");
  fs::path keyf = dir / (leaf.name + ".key");
  if (auto s = WritePem(pem, cert->get(), nullptr, true); !s.ok()) return s;
  if (auto s = WritePem(keyf, nullptr, key->get(), true); !s.ok()) return s;
  written->push_back(pem.string());
  written->push_back(keyf.string());
  return absl::OkStatus();
}

}  // namespace

rpc::TlsFiles OperatorTlsFiles(const rpc::TlsFiles& controller_tls) {
  if (controller_tls.ca.empty()) return controller_tls;
  const fs::path dir = fs::path(controller_tls.ca).parent_path();
  rpc::TlsFiles files{controller_tls.ca, (dir / "operator.pem").string(),
                      (dir / "operator.key").string()};
  std::error_code ec;
  if (!fs::exists(files.cert, ec) || !fs::exists(files.key, ec)) return controller_tls;
  return files;
}

std::vector<std::string> CertificateExpiryWarnings(const glm::v1::ClusterStatus& status) {
  std::vector<std::string> out;
  const auto when = [](int64_t seconds) {
    return seconds < 0 ? absl::StrCat("expired ", -seconds / 86400, " days ago")
                       : absl::StrCat("expires in ", seconds / 86400, " days");
  };
  if (status.has_controller_cert_expires_in_s() &&
      status.controller_cert_expires_in_s() < rpc::kCertificateExpiryWarningS) {
    out.push_back(absl::StrCat(
        "the controller's certificate ", when(status.controller_cert_expires_in_s()),
        ": run `glmctl certs --renew --out DIR ", status.config_path(),
        "` (DIR holds ca.pem), then restart glm-controller and every glm-agent"));
  }
  if (status.has_ca_expires_in_s() && status.ca_expires_in_s() < rpc::kCertificateExpiryWarningS) {
    out.push_back(absl::StrCat(
        "the cluster CA ", when(status.ca_expires_in_s()),
        ": make a new one with `glmctl certs --force --out DIR ", status.config_path(),
        "`, then restart glm-controller and every glm-agent"));
  }
  return out;
}

std::string HostOf(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    auto end = address.find(']');
    return end == std::string::npos ? address : address.substr(1, end - 1);
  }
  auto colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

absl::StatusOr<std::vector<std::string>> MakeClusterCerts(
    const orchestrate::ClusterTopology& topology, const CertsOptions& options) {
  fs::path dir(options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  std::vector<std::string> written;

  std::vector<LeafSpec> leaves;
  {
    LeafSpec c{"controller", "controller",
               {HostOf(topology.controller_listen), "127.0.0.1", "localhost"}};
    if (c.hosts.count("0.0.0.0") || c.hosts.count("::")) {
      c.hosts.erase("0.0.0.0");
      c.hosts.erase("::");
      char host[256] = {};
      if (gethostname(host, sizeof(host) - 1) == 0 && host[0]) c.hosts.insert(host);
    }
    leaves.push_back(c);
  }
  // The operator's glmctl is only ever a client: no host names.
  leaves.push_back({"operator", "operator", {}});
  for (const auto& n : topology.nodes) {
    if (n.name == "ca" || n.name == "controller" || n.name == "operator") {
      return absl::InvalidArgumentError(absl::StrCat(
          "node '", n.name, "': its certificate would overwrite ", n.name,
          ".pem, which glmctl certs writes for the cluster; rename the node in the cluster YAML"));
    }
    // Every address a peer or the controller dials: the agent's host and the fabric IP (staging
    // traffic and the stage port), plus loopback for local clusters.
    LeafSpec leaf{n.name, "agent", {HostOf(n.address), "127.0.0.1", "localhost"}};
    if (!n.fabric_ip.empty()) leaf.hosts.insert(n.fabric_ip);
    leaves.push_back(leaf);
  }

  Key ca_key;
  Cert ca;
  if (options.renew) {
    auto loaded = LoadCa(dir);
    if (!loaded.ok()) return loaded.status();
    ca = std::move(loaded->first);
    ca_key = std::move(loaded->second);
  } else {
    // Check every target first, so a refusal leaves nothing half-written.
    if (!options.overwrite) {
      for (const auto& f : {std::string("ca.pem"), std::string("ca.key")}) {
        if (fs::exists(dir / f)) {
          return absl::AlreadyExistsError(absl::StrCat(
              (dir / f).string(), " exists: pass --renew to re-issue the leaf certificates from "
                                  "this CA, --force to replace the CA and every certificate, or "
                                  "choose another --out directory"));
        }
      }
    }
    auto new_key = NewKey();
    if (!new_key.ok()) return new_key.status();
    ca_key = *std::move(new_key);
    auto new_ca = NewCert(absl::StrCat("glmctl cluster CA ", topology.cluster_name), "",
                          ca_key.get(), nullptr, options.ca_valid_days);
    if (!new_ca.ok()) return new_ca.status();
    ca = *std::move(new_ca);
    const std::vector<std::pair<int, std::string>> ca_extensions = {
        {NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
        {NID_key_usage, "critical,keyCertSign,cRLSign"},
        {NID_subject_key_identifier, "hash"}};
    for (const auto& [nid, v] : ca_extensions) {
      if (auto s = AddExt(ca.get(), ca.get(), nid, v); !s.ok()) return s;
    }
    if (auto s = Sign(ca.get(), ca_key.get()); !s.ok()) return s;
    if (auto s = WritePem(dir / "ca.pem", ca.get(), nullptr, options.overwrite); !s.ok()) return s;
    if (auto s = WritePem(dir / "ca.key", nullptr, ca_key.get(), options.overwrite); !s.ok()) {
      return s;
    }
    written.push_back((dir / "ca.pem").string());
    written.push_back((dir / "ca.key").string());
  }

  for (const auto& leaf : leaves) {
    if (auto s = IssueLeaf(leaf, ca.get(), ca_key.get(), options.valid_days, dir, &written);
        !s.ok()) {
      return s;
    }
  }
  return written;
}

absl::StatusOr<std::vector<std::string>> IssueLeafCert(const std::string& dir,
                                                       const std::string& name,
                                                       const std::string& role,
                                                       const std::vector<std::string>& hosts,
                                                       int valid_days) {
  auto loaded = LoadCa(dir);
  if (!loaded.ok()) return loaded.status();
  std::vector<std::string> written;
  LeafSpec leaf{name, role, {hosts.begin(), hosts.end()}};
  if (auto s = IssueLeaf(leaf, loaded->first.get(), loaded->second.get(), valid_days, dir,
                         &written);
      !s.ok()) {
    return s;
  }
  return written;
}

}  // namespace glm::cli
