// The weight-transfer wire protocol: plain TCP, one request per connection (kept dependency-free
// of gRPC so staging works before the control plane is up and moves bytes with sendfile).
//
// Request  (client → server), little-endian:
//   u32 magic 'GLMS' | u32 path_len | path bytes (relative, no "..") | u64 offset | u64 length
//   (length 0 = to the end of the file)
// Response (server → client):
//   u32 magic 'GLMS' | u32 status (0 ok, 1 not found, 2 bad request, 3 offset past end)
//   | u64 file_size | u64 count, then `count` bytes of the file from `offset`.
// A short read of the body means the peer went away; the client resumes elsewhere.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glm::stage {

inline constexpr uint32_t kStageMagic = 0x534d4c47;  // "GLMS"
inline constexpr uint32_t kMaxPathLen = 4096;

enum class StageStatus : uint32_t { kOk = 0, kNotFound = 1, kBadRequest = 2, kBadOffset = 3 };

struct StageRequest {
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct StageResponseHeader {
  StageStatus status = StageStatus::kOk;
  uint64_t file_size = 0;
  uint64_t count = 0;
};

// Blocking helpers on a connected socket; `timeout_ms` bounds each wait for data (poll).
absl::Status WriteAll(int fd, const void* data, size_t size);
absl::Status ReadAll(int fd, void* data, size_t size, int timeout_ms);

absl::Status SendRequest(int fd, const StageRequest& request);
absl::StatusOr<StageRequest> ReadRequest(int fd, int timeout_ms);
absl::Status SendResponseHeader(int fd, const StageResponseHeader& header);
absl::StatusOr<StageResponseHeader> ReadResponseHeader(int fd, int timeout_ms);

// A path a peer may ask for: relative, no "..", no empty or "." parts, not a .partial file.
bool IsServablePath(const std::string& path);

// Connects to host:port (IPv4 literal or name) with a timeout. Returns the socket.
absl::StatusOr<int> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms);

}  // namespace glm::stage
