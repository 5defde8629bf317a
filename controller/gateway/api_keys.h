// The gateway's API keys (`--api-key-file`): checks `Authorization: Bearer <key>` headers.
//
// File format: one key per line; surrounding whitespace trimmed; blank lines and lines starting
// with '#' ignored. A key is at least 16 characters and has no inner whitespace. A file with no
// keys is an error (an empty path, i.e. auth off, is the caller's decision, not this class's).
//
// Check() compares the SHA-256 of the presented key against the SHA-256 of every configured key
// with CRYPTO_memcmp, always all of them (no early exit), so neither the key's length nor which
// key matched shows in the timing.
//
// Thread-safe: Check() runs concurrently with Reload(); a check sees either the old or the new
// key set, never a mix.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glm::gateway {

class ApiKeys {
 public:
  static constexpr size_t kMinKeyLength = 16;

  // Reads `path`. Errors (InvalidArgument / NotFound / PermissionDenied...) name the file, the
  // line where it applies, and the fix.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(std::string path);

  // `authorization_header_value`: the Authorization header's value, e.g. "Bearer sk-...". The
  // scheme is case-insensitive; anything but "Bearer <key>" (absent, other scheme, empty key)
  // is false.
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
  struct KeySet {
    std::vector<Digest> digests;
    std::string warning;
  };

  explicit ApiKeys(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::shared_ptr<const KeySet>> Read(const std::string& path);
  std::shared_ptr<const KeySet> keys() const;

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const KeySet> keys_;  // guarded by mu_; never null after Load
};

}  // namespace glm::gateway
