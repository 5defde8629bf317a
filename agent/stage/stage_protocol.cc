#include "agent/stage/stage_protocol.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace glm::stage {

absl::Status WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t size, int timeout_ms) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int rc = poll(&pfd, 1, timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return absl::DeadlineExceededError(absl::StrCat("no data for ", timeout_ms, " ms"));
    if (rc < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    ssize_t n = recv(fd, p, size, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    if (n == 0) return absl::UnavailableError("connection closed by peer");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SendRequest(int fd, const StageRequest& r) {
  std::vector<char> buf(8 + r.path.size() + 16);
  uint32_t magic = kStageMagic, len = static_cast<uint32_t>(r.path.size());
  std::memcpy(buf.data(), &magic, 4);
  std::memcpy(buf.data() + 4, &len, 4);
  std::memcpy(buf.data() + 8, r.path.data(), r.path.size());
  std::memcpy(buf.data() + 8 + r.path.size(), &r.offset, 8);
  std::memcpy(buf.data() + 16 + r.path.size(), &r.length, 8);
  return WriteAll(fd, buf.data(), buf.size());
}

absl::StatusOr<StageRequest> ReadRequest(int fd, int timeout_ms) {
  uint32_t head[2];
  if (absl::Status s = ReadAll(fd, head, sizeof(head), timeout_ms); !s.ok()) return s;
  if (head[0] != kStageMagic) return absl::InvalidArgumentError("bad request magic");
  if (head[1] > kMaxPathLen) return absl::InvalidArgumentError("path too long");
  StageRequest r;
  r.path.resize(head[1]);
  if (absl::Status s = ReadAll(fd, r.path.data(), r.path.size(), timeout_ms); !s.ok()) return s;
  uint64_t tail[2];
  if (absl::Status s = ReadAll(fd, tail, sizeof(tail), timeout_ms); !s.ok()) return s;
  r.offset = tail[0];
  r.length = tail[1];
  return r;
}

absl::Status SendResponseHeader(int fd, const StageResponseHeader& h) {
  char buf[24];
  uint32_t magic = kStageMagic, status = static_cast<uint32_t>(h.status);
  std::memcpy(buf, &magic, 4);
  std::memcpy(buf + 4, &status, 4);
  std::memcpy(buf + 8, &h.file_size, 8);
  std::memcpy(buf + 16, &h.count, 8);
  return WriteAll(fd, buf, sizeof(buf));
}

absl::StatusOr<StageResponseHeader> ReadResponseHeader(int fd, int timeout_ms) {
  char buf[24];
  if (absl::Status s = ReadAll(fd, buf, sizeof(buf), timeout_ms); !s.ok()) return s;
  uint32_t magic, status;
  std::memcpy(&magic, buf, 4);
  std::memcpy(&status, buf + 4, 4);
  if (magic != kStageMagic) return absl::DataLossError("bad response magic");
  StageResponseHeader h;
  h.status = static_cast<StageStatus>(status);
  std::memcpy(&h.file_size, buf + 8, 8);
  std::memcpy(&h.count, buf + 16, 8);
  return h;
}

bool IsServablePath(const std::string& path) {
  if (path.empty() || path[0] == '/' || absl::StrContains(path, "\\") ||
      absl::StrContains(path, std::string(1, '\0')) || absl::EndsWith(path, ".partial")) {
    return false;
  }
  for (const auto& part : std::filesystem::path(path)) {
    if (part.empty() || part == ".." || part == ".") return false;
  }
  return true;
}

absl::StatusOr<int> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve ", host, ": ", gai_strerror(rc)));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && errno != EINPROGRESS) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect ", host, ":", port, ": ", std::strerror(err)));
  }
  if (rc != 0) {
    pollfd pfd{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (poll(&pfd, 1, timeout_ms) <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
        err != 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("connect ", host, ":", port, ": ",
                                                 err ? std::strerror(err) : "timed out"));
    }
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace glm::stage
