#include "agent/stage/stage_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/stage/stage_protocol.h"

namespace glm::stage {

absl::StatusOr<std::unique_ptr<StageServer>> StageServer::Start(Options options) {
  std::unique_ptr<StageServer> s(new StageServer(std::move(options)));
  s->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(s->options_.port);
  if (inet_pton(AF_INET, s->options_.bind_address.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", s->options_.bind_address));
  }
  if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(s->listen_fd_, 64) != 0) {
    return absl::UnavailableError(absl::StrCat("listen ", s->options_.bind_address, ":",
                                               s->options_.port, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = ntohs(addr.sin_port);
  if (pipe2(s->wake_fd_, O_CLOEXEC) != 0) return absl::UnavailableError("pipe");
  s->accept_thread_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

StageServer::~StageServer() {
  Stop();
  for (int fd : {listen_fd_, wake_fd_[0], wake_fd_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void StageServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
  }
  char c = 'x';
  (void)!write(wake_fd_[1], &c, 1);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return active_workers_ == 0; });
}

void StageServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    open_fds_.insert(fd);
    ++active_workers_;
    std::thread([this, fd] { Serve(fd); }).detach();
  }
}

void StageServer::Serve(int fd) {
  absl::StatusOr<StageRequest> req = ReadRequest(fd, options_.io_timeout_ms);
  StageResponseHeader header;
  int file_fd = -1;
  if (!req.ok() || !IsServablePath(req->path)) {
    header.status = StageStatus::kBadRequest;
  } else {
    std::string path = absl::StrCat(options_.root, "/", req->path);
    file_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (file_fd < 0 || fstat(file_fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      header.status = StageStatus::kNotFound;
    } else {
      header.file_size = static_cast<uint64_t>(st.st_size);
      if (req->offset > header.file_size) {
        header.status = StageStatus::kBadOffset;
      } else {
        uint64_t left = header.file_size - req->offset;
        header.count = req->length == 0 ? left : std::min(left, req->length);
      }
    }
  }
  if (SendResponseHeader(fd, header).ok() && header.status == StageStatus::kOk) {
    off_t offset = static_cast<off_t>(req->offset);
    uint64_t left = header.count;
    while (left > 0) {
      ssize_t n = sendfile(fd, file_fd, &offset, std::min<uint64_t>(left, 1 << 20));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      left -= static_cast<uint64_t>(n);
      bytes_served_ += static_cast<uint64_t>(n);
    }
    // The bytes read for serving are not this node's working set.
    posix_fadvise(file_fd, static_cast<off_t>(req->offset), static_cast<off_t>(header.count),
                  POSIX_FADV_DONTNEED);
  }
  if (file_fd >= 0) close(file_fd);
  std::lock_guard<std::mutex> lock(mu_);
  open_fds_.erase(fd);
  close(fd);
  --active_workers_;
  idle_.notify_all();  // under the lock: Stop() cannot return before we release it.
}

}  // namespace glm::stage
