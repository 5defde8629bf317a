// Content hashes for staged files: XXH3-128 (xxHash's streaming API), spelled as 32 lowercase hex
// digits of the canonical (big-endian) form, as `xxh128sum` prints it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace glm::cluster {

// Incremental XXH3-128. Not thread-safe.
class Xxh3Hasher {
 public:
  Xxh3Hasher();
  ~Xxh3Hasher();
  Xxh3Hasher(const Xxh3Hasher&) = delete;
  Xxh3Hasher& operator=(const Xxh3Hasher&) = delete;

  void Update(const void* data, size_t size);
  std::string HexDigest() const;

 private:
  void* state_;  // XXH3_state_t*
};

struct FileHash {
  std::string xxh3_128;  // 32 hex digits.
  uint64_t size = 0;
};

// Streams the whole file (1 MiB reads). Errors name the path.
absl::StatusOr<FileHash> HashFile(const std::string& path);

}  // namespace glm::cluster
