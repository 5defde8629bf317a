#include "controller/gateway/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace glm::gateway {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::array<unsigned char, 32> Sha256(std::string_view data) {
  std::array<unsigned char, 32> digest{};
  unsigned int len = 0;
  // EVP_Digest with SHA-256 only fails on allocation failure; a zero digest then matches no
  // configured key (each is the SHA-256 of a >= 16 character key), so Check() fails closed.
  EVP_Digest(data.data(), data.size(), digest.data(), &len, EVP_sha256(), nullptr);
  return digest;
}

constexpr char kFix[] =
    "put one key per line: `<key>`, `<name>: <key>` or `<name>: sha256:<hex>` (hex from "
    "`printf %s \"$KEY\" | sha256sum`), optionally followed by ` rate=<N>/s` or ` rate=<N>/m`; a "
    "key is at least 16 characters (e.g. from `openssl rand -hex 32`); '#' starts a comment line";

std::vector<std::string_view> SplitWhitespace(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && IsSpace(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !IsSpace(s[j])) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "rate=<N>/s" or "rate=<N>/m", N a positive integer up to 1e6. Requests per second, or 0 when
// the token is malformed.
double ParseRate(std::string_view token) {
  constexpr std::string_view kPrefix = "rate=";
  if (token.substr(0, kPrefix.size()) != kPrefix) return 0;
  token.remove_prefix(kPrefix.size());
  const size_t slash = token.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash > 7) return 0;
  double n = 0;
  for (char c : token.substr(0, slash)) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + (c - '0');
  }
  if (n <= 0 || n > 1e6) return 0;
  const std::string_view unit = token.substr(slash + 1);
  if (unit == "s") return n;
  if (unit == "m") return n / 60.0;
  return 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ApiKeys::KeySet>> ApiKeys::Read(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("api key file ", path, ": ", std::strerror(err),
                                         "; fix the path or create the file and ", kFix);
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("api key file ", path, " is not a regular file; ", kFix));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat("api key file ", path, ": cannot open (",
                                                    std::strerror(errno),
                                                    "); make it readable by the controller"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  auto keys = std::make_shared<KeySet>();
  size_t line_no = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    const std::string_view line = Trim(std::string_view(text).substr(start, end - start));
    start = end + 1;
    if (line.empty() || line.front() == '#') continue;
    const auto where = [&] { return absl::StrCat(path, ":", line_no, ": "); };
    const std::vector<std::string_view> tokens = SplitWhitespace(line);
    Key key;
    std::string_view secret;
    size_t next = 1;
    if (tokens[0].back() == ':') {
      key.name = std::string(tokens[0].substr(0, tokens[0].size() - 1));
      if (!ValidName(key.name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "the key name (before ':') is not 1-64 of [A-Za-z0-9_.-]; ", kFix));
      }
      if (tokens.size() < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "name '", key.name, "' has no key after it; ", kFix));
      }
      secret = tokens[1];
      next = 2;
    } else {
      if (tokens.size() > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "a key contains whitespace, or a name lacks its ':'; ", kFix,
            " (a comment must start its own line)"));
      }
      key.name = absl::StrCat("key-", line_no);
      secret = tokens[0];
    }
    constexpr std::string_view kSha = "sha256:";
    if (secret.substr(0, kSha.size()) == kSha) {
      const std::string_view hex = secret.substr(kSha.size());
      bool ok = hex.size() == 64;
      for (size_t i = 0; ok && i < 32; ++i) {
        const int hi = HexValue(hex[2 * i]);
        const int lo = HexValue(hex[2 * i + 1]);
        ok = hi >= 0 && lo >= 0;
        if (ok) key.digest[i] = static_cast<unsigned char>(hi * 16 + lo);
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "sha256: needs 64 hex digits (`printf %s \"$KEY\" | sha256sum`); ", kFix));
      }
    } else {
      if (secret.size() < kMinKeyLength) {
        return absl::InvalidArgumentError(absl::StrCat(where(), "key is ", secret.size(),
                                                       " characters, at least ", kMinKeyLength,
                                                       " are needed; ", kFix));
      }
      key.digest = Sha256(secret);
    }
    for (; next < tokens.size(); ++next) {
      const double rate = ParseRate(tokens[next]);
      if (rate <= 0 || key.rate_per_s > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "word ", next + 1, " is not one rate=<N>/s or rate=<N>/m (N a whole number "
            "from 1 to 1000000); ", kFix, " (a comment must start its own line)"));
      }
      key.rate_per_s = rate;
      key.burst = std::max(1.0, std::ceil(rate));
    }
    for (const Key& other : keys->keys) {
      if (other.name == key.name) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "key name '", key.name, "' is used twice; give each key its own name; ", kFix));
      }
      if (other.digest == key.digest) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "the same key as '", other.name, "'; remove one of the two lines; ", kFix));
      }
    }
    keys->keys.push_back(std::move(key));
  }
  if (keys->keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("api key file ", path, " has no keys; ", kFix,
                                                   ", or run without an api key file to turn "
                                                   "authentication off"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    keys->warning = absl::StrFormat(
        "api key file %s is accessible by group/others (mode %04o); run `chmod 600 %s`", path,
        static_cast<unsigned>(st.st_mode & 07777), path);
  }
  return std::shared_ptr<const KeySet>(std::move(keys));
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(std::string path) {
  auto keys = Read(path);
  if (!keys.ok()) return keys.status();
  std::unique_ptr<ApiKeys> api_keys(new ApiKeys(std::move(path)));
  api_keys->keys_ = *std::move(keys);
  return api_keys;
}

absl::Status ApiKeys::Reload() {
  auto keys = Read(path_);
  if (!keys.ok()) return keys.status();
  std::lock_guard<std::mutex> lock(mu_);
  keys_ = *std::move(keys);
  return absl::OkStatus();
}

std::shared_ptr<const ApiKeys::KeySet> ApiKeys::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_;
}

int ApiKeys::Match(const KeySet& keys, std::string_view authorization_header_value) {
  std::string_view value = Trim(authorization_header_value);
  size_t space = 0;
  while (space < value.size() && !IsSpace(value[space])) ++space;
  const std::string_view scheme = value.substr(0, space);
  constexpr std::string_view kBearer = "bearer";
  if (scheme.size() != kBearer.size()) return -1;
  for (size_t i = 0; i < kBearer.size(); ++i) {
    const char c = scheme[i];
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if (lower != kBearer[i]) return -1;
  }
  const std::string_view key = Trim(value.substr(space));
  if (key.empty()) return -1;

  const Digest presented = Sha256(key);
  // Every configured key is compared, whatever matched before, and the index is selected with
  // a mask: the time taken depends only on the number of keys. Digests are unique (Read).
  unsigned matched = 0;
  unsigned index = 0;
  for (size_t i = 0; i < keys.keys.size(); ++i) {
    const unsigned equal =
        static_cast<unsigned>(CRYPTO_memcmp(keys.keys[i].digest.data(), presented.data(),
                                            presented.size()) == 0);
    const unsigned mask = 0u - equal;
    index |= mask & static_cast<unsigned>(i);
    matched |= equal;
  }
  return matched != 0 ? static_cast<int>(index) : -1;
}

bool ApiKeys::Check(std::string_view authorization_header_value) const {
  return Match(*keys(), authorization_header_value) >= 0;
}

ApiKeys::AuthResult ApiKeys::Authenticate(std::string_view authorization_header_value,
                                          Clock::TimePoint now) const {
  AuthResult result;
  const std::shared_ptr<const KeySet> keys = this->keys();
  const int index = Match(*keys, authorization_header_value);
  if (index < 0) return result;
  const Key& key = keys->keys[static_cast<size_t>(index)];
  result.key_name = key.name;
  result.outcome = AuthResult::Outcome::kAllowed;
  if (key.rate_per_s <= 0) return result;

  std::lock_guard<std::mutex> lock(bucket_mu_);
  auto [it, inserted] = buckets_.try_emplace(key.name);
  Bucket& bucket = it->second;
  if (inserted) {
    bucket.tokens = key.burst;
  } else {
    const double elapsed_s = std::chrono::duration<double>(now - bucket.last).count();
    bucket.tokens = std::min(key.burst, bucket.tokens + std::max(0.0, elapsed_s) * key.rate_per_s);
  }
  bucket.last = now;
  if (bucket.tokens >= 1.0) {
    bucket.tokens -= 1.0;
    return result;
  }
  result.outcome = AuthResult::Outcome::kRateLimited;
  const double wait_s = (1.0 - bucket.tokens) / key.rate_per_s;
  result.retry_after_s = std::max(1, static_cast<int>(std::ceil(wait_s - 1e-9)));
  return result;
}

size_t ApiKeys::size() const { return keys()->keys.size(); }

std::string ApiKeys::warning() const { return keys()->warning; }

}  // namespace glm::gateway
