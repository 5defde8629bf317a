#include "controller/gateway/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <cerrno>
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
    "put one key per line (at least 16 characters, e.g. from `openssl rand -hex 32`); '#' starts "
    "a comment";

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
    for (char c : line) {
      if (IsSpace(c)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", line_no, ": a key contains whitespace; ", kFix,
            " (a comment must start its own line)"));
      }
    }
    if (line.size() < kMinKeyLength) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": key is ", line.size(),
                                                     " characters, at least ", kMinKeyLength,
                                                     " are needed; ", kFix));
    }
    keys->digests.push_back(Sha256(line));
  }
  if (keys->digests.empty()) {
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

bool ApiKeys::Check(std::string_view authorization_header_value) const {
  std::string_view value = Trim(authorization_header_value);
  size_t space = 0;
  while (space < value.size() && !IsSpace(value[space])) ++space;
  const std::string_view scheme = value.substr(0, space);
  constexpr std::string_view kBearer = "bearer";
  if (scheme.size() != kBearer.size()) return false;
  for (size_t i = 0; i < kBearer.size(); ++i) {
    const char c = scheme[i];
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if (lower != kBearer[i]) return false;
  }
  const std::string_view key = Trim(value.substr(space));
  if (key.empty()) return false;

  const Digest presented = Sha256(key);
  const std::shared_ptr<const KeySet> keys = this->keys();
  // Every configured key is compared, whatever matched before: the time taken depends only on
  // the number of keys.
  int matched = 0;
  for (const Digest& digest : keys->digests) {
    matched |= CRYPTO_memcmp(digest.data(), presented.data(), digest.size()) == 0 ? 1 : 0;
  }
  return matched != 0;
}

size_t ApiKeys::size() const { return keys()->digests.size(); }

std::string ApiKeys::warning() const { return keys()->warning; }

}  // namespace glm::gateway
