#include "controller/cli/certs.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

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

absl::StatusOr<Cert> NewCert(const std::string& common_name, EVP_PKEY* key, X509* issuer,
                             int days) {
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

}  // namespace

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

  auto ca_key = NewKey();
  if (!ca_key.ok()) return ca_key.status();
  auto ca = NewCert(absl::StrCat("glmctl cluster CA ", topology.cluster_name), ca_key->get(),
                    nullptr, options.valid_days);
  if (!ca.ok()) return ca.status();
  const std::vector<std::pair<int, std::string>> ca_extensions = {
      {NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
      {NID_key_usage, "critical,keyCertSign,cRLSign"},
      {NID_subject_key_identifier, "hash"}};
  for (const auto& [nid, v] : ca_extensions) {
    if (auto s = AddExt(ca->get(), ca->get(), nid, v); !s.ok()) return s;
  }
  if (auto s = Sign(ca->get(), ca_key->get()); !s.ok()) return s;

  struct Leaf {
    std::string name;
    std::set<std::string> hosts;
  };
  std::vector<Leaf> leaves;
  {
    Leaf c{"controller", {HostOf(topology.controller_listen), "127.0.0.1", "localhost"}};
    if (c.hosts.count("0.0.0.0") || c.hosts.count("::")) {
      c.hosts.erase("0.0.0.0");
      c.hosts.erase("::");
      char host[256] = {};
      if (gethostname(host, sizeof(host) - 1) == 0 && host[0]) c.hosts.insert(host);
    }
    leaves.push_back(c);
  }
  for (const auto& n : topology.nodes) {
    leaves.push_back({n.name, {HostOf(n.address), "127.0.0.1", "localhost"}});
  }

  // Check every target first, so a refusal leaves nothing half-written.
  if (!options.overwrite) {
    for (const auto& f : {std::string("ca.pem"), std::string("ca.key")}) {
      if (fs::exists(dir / f)) {
        return absl::AlreadyExistsError(absl::StrCat(
            (dir / f).string(), " exists: pass --force to replace the cluster's certificates, "
                                "or choose another --out directory"));
      }
    }
  }
  if (auto s = WritePem(dir / "ca.pem", ca->get(), nullptr, options.overwrite); !s.ok()) return s;
  if (auto s = WritePem(dir / "ca.key", nullptr, ca_key->get(), options.overwrite); !s.ok()) return s;
  written.push_back((dir / "ca.pem").string());
  written.push_back((dir / "ca.key").string());

  for (const auto& leaf : leaves) {
    auto key = NewKey();
    if (!key.ok()) return key.status();
    auto cert = NewCert(leaf.name, key->get(), ca->get(), options.valid_days);
    if (!cert.ok()) return cert.status();
    std::vector<std::string> sans;
    for (const auto& h : leaf.hosts) {
      if (h.empty()) continue;
      sans.push_back(absl::StrCat(IsIp(h) ? "IP:" : "DNS:", h));
    }
    const std::vector<std::pair<int, std::string>> extensions = {
        {NID_basic_constraints, "critical,CA:FALSE"},
        {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
        {NID_ext_key_usage, "serverAuth,clientAuth"},
        {NID_authority_key_identifier, "keyid:always"},
        {NID_subject_alt_name, absl::StrJoin(sans, ",")}};
    for (const auto& [nid, v] : extensions) {
      if (auto s = AddExt(cert->get(), ca->get(), nid, v); !s.ok()) return s;
    }
    if (auto s = Sign(cert->get(), ca_key->get()); !s.ok()) return s;
    fs::path pem = dir / (leaf.name + ".pem");
    fs::path keyf = dir / (leaf.name + ".key");
    if (auto s = WritePem(pem, cert->get(), nullptr, true); !s.ok()) return s;
    if (auto s = WritePem(keyf, nullptr, key->get(), true); !s.ok()) return s;
    written.push_back(pem.string());
    written.push_back(keyf.string());
  }
  return written;
}

}  // namespace glm::cli
