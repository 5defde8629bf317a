#include "controller/cli/certs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
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
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  orchestrate::ClusterTopology topology_;
};

TEST_F(CertsTest, WritesCaAndLeavesThatVerifyWithSans) {
  auto written = MakeClusterCerts(topology_, {.out_dir = dir_.string()});
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->size(), 2u + 2u * 3u);
  X509* ca = ReadCert(dir_ / "ca.pem");
  ASSERT_NE(ca, nullptr);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  for (const char* name : {"controller", "n1", "n2"}) {
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
  X509_free(n2);
  X509* ctl = ReadCert(dir_ / "controller.pem");
  EXPECT_EQ(X509_check_ip_asc(ctl, "10.0.0.5", 0), 1);
  X509_free(ctl);
  X509_STORE_free(store);
}

TEST_F(CertsTest, RefusesToOverwriteWithoutForce) {
  ASSERT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string()}).ok());
  auto again = MakeClusterCerts(topology_, {.out_dir = dir_.string()});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("--force"), absl::string_view::npos);
  EXPECT_TRUE(MakeClusterCerts(topology_, {.out_dir = dir_.string(), .overwrite = true}).ok());
}

TEST(HostOfTest, Splits) {
  EXPECT_EQ(HostOf("10.0.0.1:80"), "10.0.0.1");
  EXPECT_EQ(HostOf("[::1]:80"), "::1");
  EXPECT_EQ(HostOf("host"), "host");
}

}  // namespace
}  // namespace glm::cli
