#include "controller/gateway/api_keys.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::gateway {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kKeyA[] = "sk-aaaaaaaaaaaaaaaaaaaa";
constexpr char kKeyB[] = "sk-bbbbbbbbbbbbbbbbbbbb";
constexpr char kKeyC[] = "sk-cccccccccccccccccccc";

class ApiKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("api_keys_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "keys").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& text, mode_t mode = 0600) {
    {
      std::ofstream out(path_, std::ios::trunc);
      out << text;
    }
    ASSERT_EQ(::chmod(path_.c_str(), mode), 0);
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(ApiKeysTest, LoadsKeysSkippingCommentsAndBlankLines) {
  Write(std::string("# gateway keys\n\n   ") + kKeyA + "  \r\n\t# " + kKeyC + "\n" + kKeyB);
  auto keys = ApiKeys::Load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)->size(), 2u);
  EXPECT_EQ((*keys)->warning(), "");
  EXPECT_TRUE((*keys)->Check(std::string("Bearer ") + kKeyA));
  EXPECT_TRUE((*keys)->Check(std::string("Bearer ") + kKeyB));
  EXPECT_FALSE((*keys)->Check(std::string("Bearer ") + kKeyC));  // commented out
}

TEST_F(ApiKeysTest, ParsesBearerHeader) {
  Write(std::string(kKeyA) + "\n");
  auto keys = ApiKeys::Load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  const ApiKeys& k = **keys;
  const std::string a = kKeyA;
  EXPECT_TRUE(k.Check("Bearer " + a));
  EXPECT_TRUE(k.Check("bearer " + a));  // schemes are case-insensitive (RFC 9110)
  EXPECT_TRUE(k.Check("BEARER  " + a + " "));
  EXPECT_FALSE(k.Check(""));
  EXPECT_FALSE(k.Check("Bearer"));
  EXPECT_FALSE(k.Check("Bearer "));
  EXPECT_FALSE(k.Check(a));                      // no scheme
  EXPECT_FALSE(k.Check("Basic " + a));           // other scheme
  EXPECT_FALSE(k.Check("Bearerx " + a));
  EXPECT_FALSE(k.Check("Bearer " + a + "x"));    // longer
  EXPECT_FALSE(k.Check("Bearer " + a.substr(0, a.size() - 1)));  // a prefix
  EXPECT_FALSE(k.Check("Bearer " + std::string(kKeyB)));
  EXPECT_FALSE(k.Check("Bearer " + a + " extra"));
}

TEST_F(ApiKeysTest, NamedHashedAndRateLimitedLines) {
  // Line 2 is plain (named key-2), line 3 named, line 4 the SHA-256 of kKeyB (upper-case hex is
  // accepted too), line 5 a named key with a per-minute rate.
  Write(std::string("# keys\n") + kKeyA + "\nci: sk-ci-0123456789abcdef rate=10/s\nbob: sha256:" +
        "91120D00C519C78C50959AABC182E67D97FC2FAB890E99C33BA46337DCE8AF8E" + "\nslow: " + kKeyC + " rate=60/m\n");
  auto keys = ApiKeys::Load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  const ApiKeys& k = **keys;
  EXPECT_EQ(k.size(), 4u);
  const Clock::TimePoint t0{};
  auto auth = [&](const std::string& key, Clock::TimePoint now = Clock::TimePoint{}) {
    return k.Authenticate("Bearer " + key, now);
  };
  using Outcome = ApiKeys::AuthResult::Outcome;
  EXPECT_EQ(auth(kKeyA).key_name, "key-2");
  EXPECT_EQ(auth("sk-ci-0123456789abcdef").key_name, "ci");
  EXPECT_EQ(auth(kKeyB).key_name, "bob");
  EXPECT_EQ(auth(kKeyB).outcome, Outcome::kAllowed);
  EXPECT_EQ(auth("sha256:91120d00c519c78c50959aabc182e67d97fc2fab890e99c33ba46337dce8af8e").outcome, Outcome::kDenied);  // the digest is not a key
  EXPECT_EQ(auth("sk-zzzzzzzzzzzzzzzzzzzz").outcome, Outcome::kDenied);
  EXPECT_EQ(auth("sk-zzzzzzzzzzzzzzzzzzzz").key_name, "");
  // slow: 1/s, burst 1; the second request in the same instant waits 1 s.
  EXPECT_EQ(auth(kKeyC, t0).outcome, Outcome::kAllowed);
  ApiKeys::AuthResult limited = auth(kKeyC, t0 + std::chrono::milliseconds(100));
  EXPECT_EQ(limited.outcome, Outcome::kRateLimited);
  EXPECT_EQ(limited.key_name, "slow");
  EXPECT_EQ(limited.retry_after_s, 1);
  EXPECT_EQ(auth(kKeyC, t0 + std::chrono::seconds(1)).outcome, Outcome::kAllowed);
  // ci: 10/s, burst 10; one token went to the name check above.
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(auth("sk-ci-0123456789abcdef", t0).outcome, Outcome::kAllowed) << i;
  }
  EXPECT_EQ(auth("sk-ci-0123456789abcdef", t0).outcome, Outcome::kRateLimited);
  EXPECT_EQ(auth("sk-ci-0123456789abcdef", t0 + std::chrono::milliseconds(100)).outcome,
            Outcome::kAllowed);
}

TEST_F(ApiKeysTest, RetryAfterCoversASlowRate) {
  Write(std::string("slow: ") + kKeyA + " rate=2/m\n");  // one token per 30 s, burst 1
  auto keys = ApiKeys::Load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  const Clock::TimePoint t0{};
  EXPECT_EQ((*keys)->Authenticate(std::string("Bearer ") + kKeyA, t0).outcome,
            ApiKeys::AuthResult::Outcome::kAllowed);
  ApiKeys::AuthResult r = (*keys)->Authenticate(std::string("Bearer ") + kKeyA,
                                                t0 + std::chrono::seconds(10));
  EXPECT_EQ(r.outcome, ApiKeys::AuthResult::Outcome::kRateLimited);
  EXPECT_EQ(r.retry_after_s, 20);
}

TEST_F(ApiKeysTest, MalformedLinesNameFileLineAndFixWithoutTheKey) {
  const std::string hex = "91120d00c519c78c50959aabc182e67d97fc2fab890e99c33ba46337dce8af8e";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("b@d: ") + kKeyA, "key name"},
      {std::string("ok: ") + kKeyA + " rate=10/h", "rate=<N>/s"},
      {std::string("ok: ") + kKeyA + " rate=0/s", "rate=<N>/s"},
      {std::string("ok: ") + kKeyA + " rate=1/s rate=2/s", "rate=<N>/s"},
      {"ok:", "no key"},
      {"ok: sha256:abc", "64 hex"},
      {"ok: sha256:" + hex.substr(0, 63) + "g", "64 hex"},
      {"ok: short", "at least 16"},
      {std::string("a: ") + kKeyA + "\na: " + kKeyB, "used twice"},
      {std::string("a: ") + kKeyA + "\nb: sha256:" + "aaf47d2ad540d88b82e9872c780d0a43366681f217854f9e6936819541ba228a", "same key"},
  };
  for (const auto& [text, want] : cases) {
    Write("# keys\n" + text + "\n");
    auto keys = ApiKeys::Load(path_);
    ASSERT_FALSE(keys.ok()) << text;
    const std::string msg(keys.status().message());
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(msg, HasSubstr(path_ + ":")) << text;
    EXPECT_THAT(msg, HasSubstr(want)) << text;
    EXPECT_THAT(msg, HasSubstr("sha256sum")) << text;
    EXPECT_THAT(msg, ::testing::Not(HasSubstr("sk-aaaa"))) << text;
    EXPECT_THAT(msg, ::testing::Not(HasSubstr("sk-bbbb"))) << text;
  }
}

TEST_F(ApiKeysTest, FileWithoutKeysIsAnErrorNamingPathAndFix) {
  Write("# only a comment\n\n   \n");
  auto keys = ApiKeys::Load(path_);
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(keys.status().message(), HasSubstr(path_));
  EXPECT_THAT(keys.status().message(), HasSubstr("one key per line"));

  Write("");
  EXPECT_FALSE(ApiKeys::Load(path_).ok());
}

TEST_F(ApiKeysTest, ShortKeyIsAnErrorWithLineNumber) {
  Write(std::string("# keys\n") + kKeyA + "\nshort-key\n");
  auto keys = ApiKeys::Load(path_);
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(keys.status().message(), HasSubstr(path_ + ":3:"));
  EXPECT_THAT(keys.status().message(), HasSubstr("at least 16"));
  EXPECT_THAT(std::string(keys.status().message()), ::testing::Not(HasSubstr("short-key")));
}

TEST_F(ApiKeysTest, KeyWithInnerWhitespaceIsAnError) {
  Write(std::string(kKeyA) + " # trailing comment\n");
  auto keys = ApiKeys::Load(path_);
  ASSERT_FALSE(keys.ok());
  EXPECT_THAT(keys.status().message(), HasSubstr(path_ + ":1:"));
}

TEST_F(ApiKeysTest, MissingFileIsNotFound) {
  auto keys = ApiKeys::Load((dir_ / "absent").string());
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(keys.status().message(), HasSubstr("absent"));
}

TEST_F(ApiKeysTest, WarnsWhenOthersCanRead) {
  Write(std::string(kKeyA) + "\n", 0644);
  auto keys = ApiKeys::Load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT((*keys)->warning(), HasSubstr("0644"));
  EXPECT_THAT((*keys)->warning(), HasSubstr("chmod 600 " + path_));
  EXPECT_TRUE((*keys)->Check(std::string("Bearer ") + kKeyA));

  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  ASSERT_TRUE((*keys)->Reload().ok());
  EXPECT_EQ((*keys)->warning(), "");
}

TEST_F(ApiKeysTest, ReloadSwapsKeysAndKeepsOldOnError) {
  Write(std::string(kKeyA) + "\n");
  auto loaded = ApiKeys::Load(path_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ApiKeys& keys = **loaded;

  Write(std::string(kKeyB) + "\n" + kKeyC + "\n");
  ASSERT_TRUE(keys.Reload().ok());
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_FALSE(keys.Check(std::string("Bearer ") + kKeyA));
  EXPECT_TRUE(keys.Check(std::string("Bearer ") + kKeyB));

  Write("tooshort\n");
  absl::Status status = keys.Reload();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_TRUE(keys.Check(std::string("Bearer ") + kKeyB));

  fs::remove(path_);
  EXPECT_EQ(keys.Reload().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(keys.Check(std::string("Bearer ") + kKeyC));
}

TEST_F(ApiKeysTest, CheckDuringReloadSeesOldOrNewSet) {
  const std::string file_one = std::string(kKeyA) + "\n" + kKeyB + "\n";
  const std::string file_two = std::string(kKeyA) + "\n" + kKeyC + "\n";
  Write(file_one);
  auto loaded = ApiKeys::Load(path_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ApiKeys& keys = **loaded;
  const std::string other_one = (dir_ / "one").string();
  const std::string other_two = (dir_ / "two").string();
  std::ofstream(other_one) << file_one;
  std::ofstream(other_two) << file_two;

  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> checkers;
  for (int t = 0; t < 2; ++t) {
    checkers.emplace_back([&] {
      while (!stop.load()) {
        // A is in both files: a check that saw a half-swapped or empty set would fail it.
        if (!keys.Check(std::string("Bearer ") + kKeyA)) failures.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 200; ++i) {
    fs::copy_file(i % 2 == 0 ? other_two : other_one, path_, fs::copy_options::overwrite_existing);
    ASSERT_TRUE(keys.Reload().ok());
  }
  stop.store(true);
  for (std::thread& t : checkers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(keys.size(), 2u);
}

}  // namespace
}  // namespace glm::gateway
