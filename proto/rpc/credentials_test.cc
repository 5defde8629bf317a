// Certificate validity under mTLS, with certificates minted here (OpenSSL, EC P-256) so that
// their validity windows can lie in the past:
// - our credentials refuse an expired (or not yet valid) certificate or CA before any
//   connection, naming the file, the date and the fix;
// - the TLS handshake refuses an expired client certificate at the server, and an expired
//   server certificate at the client, when the credentials are built without our check (a peer
//   that does not run our code, or a certificate that expired while the process ran).
#include "proto/rpc/credentials.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace glm::rpc {
namespace {

namespace fs = std::filesystem;
constexpr long kDay = 86400;

struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertDeleter {
  void operator()(X509* c) const { X509_free(c); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyDeleter>;
using Cert = std::unique_ptr<X509, CertDeleter>;

// A certificate for CN `name` valid from now + not_before_s to now + not_after_s, signed by
// `issuer` / `issuer_key` (self-signed when null); CA:TRUE when `ca`; SAN IP:127.0.0.1 otherwise.
Cert Mint(const std::string& name, EVP_PKEY* key, long not_before_s, long not_after_s, bool ca,
          X509* issuer, EVP_PKEY* issuer_key) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), static_cast<long>(std::rand()) + 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), not_before_s);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), not_after_s);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    EXPECT_NE(ext, nullptr) << value;
    if (ext != nullptr) X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  };
  if (ca) {
    add(NID_basic_constraints, "critical,CA:TRUE");
    add(NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add(NID_basic_constraints, "CA:FALSE");
    add(NID_ext_key_usage, "serverAuth,clientAuth");
    add(NID_subject_alt_name, "IP:127.0.0.1");
  }
  EXPECT_GT(X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()), 0);
  return cert;
}

std::string Pem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

std::string Pem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

class CertExpiryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("cert_expiry_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ca_key_.reset(EVP_EC_gen("P-256"));
    ca_ = Mint("glmctl test CA", ca_key_.get(), -10 * kDay, 365 * kDay, true, nullptr, nullptr);
    Write("ca.pem", Pem(ca_.get()));
    Leaf("good", -kDay, 90 * kDay);
    Leaf("expired", -30 * kDay, -kDay);
    Leaf("future", 10 * kDay, 90 * kDay);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  // <name>.pem / <name>.key: a leaf of the test CA valid in [now + from_s, now + to_s].
  void Leaf(const std::string& name, long from_s, long to_s) {
    Key key(EVP_EC_gen("P-256"));
    Cert cert = Mint(name, key.get(), from_s, to_s, false, ca_.get(), ca_key_.get());
    Write(name + ".pem", Pem(cert.get()));
    Write(name + ".key", Pem(key.get()));
  }
  TlsFiles Files(const std::string& name, const std::string& ca = "ca.pem") const {
    return {(dir_ / ca).string(), (dir_ / (name + ".pem")).string(),
            (dir_ / (name + ".key")).string()};
  }
  std::string Read(const std::string& name) const {
    std::ifstream in(dir_ / name);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Server and client credentials straight from gRPC, without our validity check.
  std::shared_ptr<grpc::ServerCredentials> RawServer(const std::string& name) const {
    grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    o.pem_root_certs = Read("ca.pem");
    o.pem_key_cert_pairs.push_back({Read(name + ".key"), Read(name + ".pem")});
    return grpc::SslServerCredentials(o);
  }
  std::shared_ptr<grpc::ChannelCredentials> RawClient(const std::string& name) const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read("ca.pem");
    o.pem_private_key = Read(name + ".key");
    o.pem_cert_chain = Read(name + ".pem");
    return grpc::SslCredentials(o);
  }
  // Agent.Info against a server whose handlers are all UNIMPLEMENTED: UNIMPLEMENTED means the
  // handshake passed.
  grpc::Status CallInfo(const std::shared_ptr<grpc::ServerCredentials>& server_creds,
                        const std::shared_ptr<grpc::ChannelCredentials>& client_creds) {
    glm::v1::Agent::Service service;
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", server_creds, &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    EXPECT_NE(port, 0);
    auto stub = glm::v1::Agent::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), client_creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    glm::v1::InfoResponse resp;
    grpc::Status status = stub->Info(&ctx, glm::v1::InfoRequest(), &resp);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    return status;
  }

  fs::path dir_;
  Key ca_key_;
  Cert ca_;
};

TEST_F(CertExpiryTest, ValidCertificatesConnect) {
  auto server = MakeServerCredentials(Files("good"));
  auto client = MakeChannelCredentials(Files("good"));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  grpc::Status s = CallInfo(*server, *client);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
}

// A daemon (server credentials) or glmctl / a daemon dialling out (channel credentials) with an
// expired certificate stops before any connection, saying which file, since when, and the fix.
TEST_F(CertExpiryTest, ExpiredCertificateIsRefusedNamingFileDateAndFix) {
  for (const bool server : {true, false}) {
    absl::Status s = server ? MakeServerCredentials(Files("expired")).status()
                            : MakeChannelCredentials(Files("expired")).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find((dir_ / "expired.pem").string()), std::string::npos) << s;
    EXPECT_NE(s.message().find("expired on "), std::string::npos) << s;
    EXPECT_NE(s.message().find(" GMT"), std::string::npos) << s;
    EXPECT_NE(s.message().find("glmctl certs --renew"), std::string::npos) << s;
  }
  absl::Status s = MakeChannelCredentials(Files("future")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("is not valid before"), std::string::npos) << s;
  EXPECT_NE(s.message().find("clock"), std::string::npos) << s;
}

TEST_F(CertExpiryTest, ExpiredCaIsRefusedWithTheFixForACa) {
  Key key(EVP_EC_gen("P-256"));
  Cert old_ca = Mint("old CA", key.get(), -400 * kDay, -kDay, true, nullptr, nullptr);
  Write("old_ca.pem", Pem(old_ca.get()));
  absl::Status s = MakeServerCredentials(Files("good", "old_ca.pem")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("TLS CA certificate '" + (dir_ / "old_ca.pem").string()),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("glmctl certs --force"), std::string::npos) << s;
}

// An expired client certificate signed by the cluster CA, presented anyway: the server's
// handshake refuses it and no handler runs.
TEST_F(CertExpiryTest, ServerRefusesAnExpiredClientCertificate) {
  auto server = MakeServerCredentials(Files("good"));
  ASSERT_TRUE(server.ok()) << server.status();
  grpc::Status s = CallInfo(*server, RawClient("expired"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

// A server whose own certificate expired: a client with valid credentials refuses it.
TEST_F(CertExpiryTest, ClientRefusesAServerWithAnExpiredCertificate) {
  auto client = MakeChannelCredentials(Files("good"));
  ASSERT_TRUE(client.ok()) << client.status();
  grpc::Status s = CallInfo(RawServer("expired"), *client);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

}  // namespace
}  // namespace glm::rpc
