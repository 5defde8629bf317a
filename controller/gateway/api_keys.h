// The gateway's API keys (`--api-key-file`): checks `Authorization: Bearer <key>` headers.
//
// File format, one key per line; surrounding whitespace trimmed; blank lines and lines starting
// with '#' ignored:
//   <key>                                   plain key, named `key-<line number>`
//   <name>: <key>                           named plain key
//   <name>: sha256:<64 hex digits>          named key stored as its SHA-256 (nothing secret at
//                                           rest); make the hex with
//                                           `printf %s "$KEY" | sha256sum`
//   ... rate=<N>/s | rate=<N>/m             optional, after a named key: token bucket of N
//                                           requests per second/minute, burst ceil(per-second
//                                           rate), at least 1
// A plain key is at least 16 characters and has no inner whitespace. A name is 1-64 of
// [A-Za-z0-9_.-], unique in the file; names (never keys) appear in logs and metrics. A file
// with no keys is an error (an empty path, i.e. auth off, is the caller's decision).
//
// Authenticate() compares the SHA-256 of the presented key against every configured digest
// with CRYPTO_memcmp, always all of them (no early exit), so neither the key's length nor which
// key matched shows in the timing.
//
// Thread-safe: checks run concurrently with Reload(); a check sees either the old or the new
// key set, never a mix. Rate-limit buckets are kept per name across reloads.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"

namespace glm::gateway {

class ApiKeys {
 public:
  static constexpr size_t kMinKeyLength = 16;

  // Reads `path`. Errors (InvalidArgument / NotFound / PermissionDenied...) name the file, the
  // line where it applies, and the fix.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(std::string path);

  struct AuthResult {
    enum class Outcome { kDenied, kAllowed, kRateLimited };
    Outcome outcome = Outcome::kDenied;
    std::string key_name;   // kAllowed / kRateLimited: the matched key's name
    int retry_after_s = 0;  // kRateLimited: seconds until a token is available, >= 1
  };

  // `authorization_header_value`: the Authorization header's value, e.g. "Bearer sk-...". The
  // scheme is case-insensitive; anything but "Bearer <key>" (absent, other scheme, empty key)
  // is kDenied. A matched key with a rate limit takes one token from its bucket at `now`.
  AuthResult Authenticate(std::string_view authorization_header_value,
                          Clock::TimePoint now) const;
  // Authenticate() without the rate limit: true when the key matches.
  bool Check(std::string_view authorization_header_value) const;

  // Re-reads the file. On error the current keys stay in force and the error is returned.
  absl::Status Reload();

  // Number of keys in force.
  size_t size() const;
  // Empty, or why the file's permissions are unsafe (readable or writable by group/others) with
  // the chmod that fixes it; from the last successful load. Not an error: the caller logs it.
  std::string warning() const;
  const std::string& path() const { return path_; }

 private:
  using Digest = std::array<unsigned char, 32>;  // SHA-256
  struct Key {
    std::string name;
    Digest digest{};
    double rate_per_s = 0;  // 0: no limit
    double burst = 0;       // bucket capacity (tokens) when rate_per_s > 0
  };
  struct KeySet {
    std::vector<Key> keys;
    std::string warning;
  };
  struct Bucket {
    double tokens = 0;
    Clock::TimePoint last{};
  };

  explicit ApiKeys(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::shared_ptr<const KeySet>> Read(const std::string& path);
  std::shared_ptr<const KeySet> keys() const;
  // Index into `keys` of the key the header presents, or -1. Constant time in the key.
  static int Match(const KeySet& keys, std::string_view authorization_header_value);

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const KeySet> keys_;  // guarded by mu_; never null after Load
  mutable std::mutex bucket_mu_;
  mutable std::map<std::string, Bucket> buckets_;  // guarded by bucket_mu_; by key name
};

}  // namespace glm::gateway
