#include "cluster/manifest/file_hash.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace glm::cluster {

Xxh3Hasher::Xxh3Hasher() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Hasher::~Xxh3Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Hasher::Update(const void* data, size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

std::string Xxh3Hasher::HexDigest() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static const char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = kHex[c.digest[i] >> 4];
    out[2 * i + 1] = kHex[c.digest[i] & 0xf];
  }
  return out;
}

absl::StatusOr<FileHash> HashFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": not found"));
    return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Xxh3Hasher hasher;
  std::vector<char> buf(1 << 20);
  FileHash result;
  while (true) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat(path, ": read: ", std::strerror(err)));
    }
    if (n == 0) break;
    hasher.Update(buf.data(), static_cast<size_t>(n));
    result.size += static_cast<uint64_t>(n);
  }
  close(fd);
  result.xxh3_128 = hasher.HexDigest();
  return result;
}

}  // namespace glm::cluster
