#include "controller/cli/certs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <memory>

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "gtest/gtest.h"

namespace glm::cli {
namespace {

namespace fs = std::filesystem;

X509* ReadCert(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  if (!f) return nullptr;
  X509* c = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  return c;
}

class CertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("certs_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    topology_.cluster_name = "c";
    topology_.controller_listen = "10.0.0.5:47100";
    topology_.nodes = {{"n1", "10.0.0.11:47101"}, {"n2", "spark-2.lan:47101"}};
    topology_.nodes[1].fabric_ip = "192.168.100.12";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  orchestrate::ClusterTopology topology_;
};

TEST_F(CertsTest, WritesCaAndLeavesThatVerifyWithSans) {
  auto written = MakeClusterCerts(topology_, {.out_dir = dir_.string()});
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->size(), 2u + 2u * 4u);
  X509* ca = ReadCert(dir_ / "ca.pem");
  ASSERT_NE(ca, nullptr);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  for (const char* name : {"controller", "operator", "n1", "n2"}) {
    X509* leaf = ReadCert(dir_ / (std::string(name) + ".pem"));
    ASSERT_NE(leaf, nullptr) << name;
    X509_STORE_CTX* ctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(ctx, store, leaf, nullptr);
    EXPECT_EQ(X509_verify_cert(ctx), 1)
        << name << ": " << X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx));
    X509_STORE_CTX_free(ctx);
    X509_free(leaf);
    struct stat st {};
    ASSERT_EQ(::stat((dir_ / (std::string(name) + ".key")).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  X509* n1 = ReadCert(dir_ / "n1.pem");
  EXPECT_EQ(X509_check_ip_asc(n1, "10.0.0.11", 0), 1);
  EXPECT_EQ(X509_check_ip_asc(n1, "10.0.0.12", 0), 0);
  X509_free(n1);
  X509* n2 = ReadCert(dir_ / "n2.pem");
  EXPECT_EQ(X509_check_host(n2, "spark-2.lan", 0, 0, nullptr), 1);
  // Peers stage over the fabric: its IP is a name of the node too.
  EXPECT_EQ(X509_check_ip_asc(n2, "192.168.100.12", 0), 1);
  X509_free(n2);
  X509* ctl = ReadCert(dir_ / "controller.pem");
  EXPECT_EQ(X509_check_ip_asc(ctl, "10.0.0.5", 0), 1);
  X509_free(ctl);
  X509_STORE_free(store);
}

std::string SubjectField(X509* cert, int nid) {
  X509_NAME* name = X509_get_subject_name(cert);
  const int i = X509_NAME_get_index_by_NID(name, nid, -1);
  if (i < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                     static_cast<size_t>(ASN1_STRING_length(data)));
}

int DaysLeft(X509* cert) {
  int days = 0;
  int seconds = 0;
  EXPECT_EQ(ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert)), 1);
  return days;
}

// The role each server enforces (proto/rpc/authz.h) is the subject OU.
TEST_F(CertsTest, EveryLeafCarriesItsRoleAndTheOperatorIsClientOnly) {
  ASSERT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string()}).ok());
  const std::pair<const char*, const char*> expected[] = {
      {"controller", "controller"}, {"operator", "operator"}, {"n1", "agent"}, {"n2", "agent"}};
  for (const auto& [name, role] : expected) {
    X509* cert = ReadCert(dir_ / (std::string(name) + ".pem"));
    ASSERT_NE(cert, nullptr) << name;
    EXPECT_EQ(SubjectField(cert, NID_commonName), name);
    EXPECT_EQ(SubjectField(cert, NID_organizationalUnitName), role) << name;
    const uint32_t xku = X509_get_extended_key_usage(cert);
    EXPECT_TRUE(xku & XKU_SSL_CLIENT) << name;
    EXPECT_EQ((xku & XKU_SSL_SERVER) != 0, std::string(name) != "operator") << name;
    // Leaves are short-lived by default.
    EXPECT_GE(DaysLeft(cert), 89) << name;
    EXPECT_LE(DaysLeft(cert), 90) << name;
    X509_free(cert);
  }
  X509* ca = ReadCert(dir_ / "ca.pem");
  EXPECT_EQ(SubjectField(ca, NID_organizationalUnitName), "");
  EXPECT_GT(DaysLeft(ca), 365);
  X509_free(ca);
}

TEST_F(CertsTest, RefusesNodesNamedLikeTheClusterFiles) {
  for (const char* name : {"ca", "controller", "operator"}) {
    topology_.nodes[0].name = name;
    auto written = MakeClusterCerts(topology_, {.out_dir = dir_.string()});
    EXPECT_EQ(written.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(written.status().message().find("rename the node"), absl::string_view::npos);
    EXPECT_FALSE(fs::exists(dir_ / "ca.pem")) << "a refusal wrote files";
  }
}

TEST_F(CertsTest, RenewKeepsTheCaAndReissuesEveryLeaf) {
  ASSERT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string(), .valid_days = 3}).ok());
  auto read = [&](const char* f) {
    std::ifstream in(dir_ / f);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string ca_pem = read("ca.pem");
  const std::string ca_key = read("ca.key");
  const std::string n1_pem = read("n1.pem");
  const std::string n1_key = read("n1.key");
  auto renewed = MakeClusterCerts(topology_, {.out_dir = dir_.string(), .renew = true});
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->size(), 2u * 4u) << "renew writes the leaves only";
  EXPECT_EQ(read("ca.pem"), ca_pem);
  EXPECT_EQ(read("ca.key"), ca_key);
  EXPECT_NE(read("n1.pem"), n1_pem);
  EXPECT_NE(read("n1.key"), n1_key);
  X509* ca = ReadCert(dir_ / "ca.pem");
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  for (const char* name : {"controller", "operator", "n1", "n2"}) {
    X509* leaf = ReadCert(dir_ / (std::string(name) + ".pem"));
    EXPECT_GE(DaysLeft(leaf), 89) << name;
    X509_STORE_CTX* ctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(ctx, store, leaf, nullptr);
    EXPECT_EQ(X509_verify_cert(ctx), 1) << name;
    X509_STORE_CTX_free(ctx);
    X509_free(leaf);
    struct stat st {};
    ASSERT_EQ(::stat((dir_ / (std::string(name) + ".key")).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  X509_STORE_free(store);
  X509_free(ca);
}

TEST_F(CertsTest, RenewWithoutACaSaysWhereItLooked) {
  auto renewed = MakeClusterCerts(topology_, {.out_dir = dir_.string(), .renew = true});
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(renewed.status().message().find("ca.pem"), absl::string_view::npos);
  EXPECT_NE(renewed.status().message().find("--renew"), absl::string_view::npos);
}

TEST_F(CertsTest, OperatorFilesWhenPresentElseTheControllers) {
  const rpc::TlsFiles controller{(dir_ / "ca.pem").string(), (dir_ / "controller.pem").string(),
                                 (dir_ / "controller.key").string()};
  EXPECT_EQ(OperatorTlsFiles(controller).cert, controller.cert);
  EXPECT_TRUE(OperatorTlsFiles({}).ca.empty());
  ASSERT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string()}).ok());
  const rpc::TlsFiles op = OperatorTlsFiles(controller);
  EXPECT_EQ(op.ca, controller.ca);
  EXPECT_EQ(op.cert, (dir_ / "operator.pem").string());
  EXPECT_EQ(op.key, (dir_ / "operator.key").string());
}

TEST_F(CertsTest, SecondsLeftReadsNotAfter) {
  ASSERT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string(), .valid_days = 3}).ok());
  const auto now = std::chrono::system_clock::now();
  auto left = rpc::CertificateSecondsLeft((dir_ / "controller.pem").string(), now);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_NEAR(static_cast<double>(*left), 3 * 86400.0, 120.0);
  auto later = rpc::CertificateSecondsLeft((dir_ / "controller.pem").string(),
                                           now + std::chrono::hours(24 * 5));
  ASSERT_TRUE(later.ok());
  EXPECT_NEAR(static_cast<double>(*later), -2 * 86400.0, 120.0);
  auto missing = rpc::CertificateSecondsLeft((dir_ / "nope.pem").string(), now);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.pem"), absl::string_view::npos);
}

TEST(CertificateExpiryWarningsTest, WarnsWithinFourteenDaysWithTheFix) {
  glm::v1::ClusterStatus s;
  s.set_config_path("/etc/glm/cluster.yaml");
  EXPECT_TRUE(CertificateExpiryWarnings(s).empty()) << "no TLS, no warning";
  s.set_controller_cert_expires_in_s(15 * 86400);
  s.set_ca_expires_in_s(400 * 86400);
  EXPECT_TRUE(CertificateExpiryWarnings(s).empty());
  s.set_controller_cert_expires_in_s(13 * 86400 + 5);
  std::vector<std::string> w = CertificateExpiryWarnings(s);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("controller's certificate expires in 13 days"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("glmctl certs --renew --out DIR /etc/glm/cluster.yaml"), std::string::npos)
      << w[0];
  s.set_controller_cert_expires_in_s(-2 * 86400);
  s.set_ca_expires_in_s(86400);
  w = CertificateExpiryWarnings(s);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("expired 2 days ago"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("cluster CA expires in 1 days"), std::string::npos) << w[1];
  EXPECT_NE(w[1].find("--force"), std::string::npos) << w[1];
}

TEST_F(CertsTest, RefusesToOverwriteWithoutForce) {
  ASSERT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string()}).ok());
  auto again = MakeClusterCerts(topology_, {.out_dir = dir_.string()});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("--force"), absl::string_view::npos);
  EXPECT_NE(again.status().message().find("--renew"), absl::string_view::npos);
  EXPECT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string(), .overwrite = true}).ok());
}

TEST(HostOfTest, Splits) {
  EXPECT_EQ(HostOf("10.0.0.1:80"), "10.0.0.1");
  EXPECT_EQ(HostOf("[::1]:80"), "::1");
  EXPECT_EQ(HostOf("host"), "host");
}

}  // namespace
}  // namespace glm::cli
