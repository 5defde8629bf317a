#include "agent/preflight/path_mtu.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace glm::preflight {
namespace {

constexpr uint32_t kMagic = 0x504d4c47;  // "GLMP"
constexpr int kIpUdpHeaders = 28;        // IPv4 20 + UDP 8.
constexpr int kMaxDatagram = 65507;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<UdpEchoResponder>> UdpEchoResponder::Start(
    const std::string& address, uint16_t port, int max_datagram) {
  std::unique_ptr<UdpEchoResponder> r(new UdpEchoResponder());
  r->max_datagram_ = max_datagram;
  r->fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (r->fd_ < 0) return Errno("udp socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", address));
  }
  if (bind(r->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("bind ", address, ":", port));
  }
  socklen_t len = sizeof(addr);
  getsockname(r->fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  r->port_ = ntohs(addr.sin_port);
  if (pipe2(r->wake_fd_, O_CLOEXEC) != 0) return Errno("pipe");
  r->thread_ = std::thread([p = r.get()] { p->Serve(); });
  return r;
}

UdpEchoResponder::~UdpEchoResponder() {
  if (thread_.joinable()) {
    char c = 'x';
    (void)!write(wake_fd_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {fd_, wake_fd_[0], wake_fd_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void UdpEchoResponder::Serve() {
  std::vector<char> buf(kMaxDatagram + 1);
  while (true) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    sockaddr_in from{};
    socklen_t from_len = sizeof(from);
    ssize_t n = recvfrom(fd_, buf.data(), buf.size(), MSG_DONTWAIT,
                         reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 8) continue;
    uint32_t magic = 0;
    std::memcpy(&magic, buf.data(), 4);
    if (magic != kMagic) continue;
    if (max_datagram_ > 0 && n > max_datagram_) continue;
    uint32_t reply[3] = {kMagic, 0, static_cast<uint32_t>(n)};
    std::memcpy(&reply[1], buf.data() + 4, 4);
    sendto(fd_, reply, sizeof(reply), 0, reinterpret_cast<sockaddr*>(&from), from_len);
  }
}

absl::StatusOr<PathMtuResult> ProbePathMtu(const PathMtuOptions& o) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("udp socket");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  int pmtu = IP_PMTUDISC_DO;  // set DF; never fragment locally.
  if (setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu)) != 0) {
    return Errno("setsockopt IP_MTU_DISCOVER");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(o.port);
  if (inet_pton(AF_INET, o.host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", o.host));
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("connect ", o.host, ":", o.port));
  }

  PathMtuResult result;
  result.target_mtu = o.target_mtu;
  uint32_t seq = 0;
  std::vector<char> payload(kMaxDatagram, 0);
  // Does an IP packet of `mtu` bytes arrive?
  auto passes = [&](int mtu) {
    int size = mtu - kIpUdpHeaders;
    for (int attempt = 0; attempt < o.attempts; ++attempt) {
      ++result.probes;
      uint32_t my_seq = ++seq;
      std::memcpy(payload.data(), &kMagic, 4);
      std::memcpy(payload.data() + 4, &my_seq, 4);
      if (send(fd, payload.data(), size, 0) < 0) {
        // EMSGSIZE: larger than the local interface MTU or a PMTU learned from ICMP.
        if (errno == EMSGSIZE) return false;
        continue;  // ECONNREFUSED from an earlier ICMP, ENOBUFS: try again.
      }
      auto deadline = std::chrono::steady_clock::now() + o.timeout;
      while (true) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
        uint32_t reply[3];
        ssize_t n = recv(fd, reply, sizeof(reply), MSG_DONTWAIT);
        if (n == sizeof(reply) && reply[0] == kMagic && reply[1] == my_seq) {
          return reply[2] == static_cast<uint32_t>(size);
        }
      }
    }
    return false;
  };

  if (passes(o.target_mtu)) {
    result.largest_ok = o.target_mtu;
    return result;
  }
  if (!passes(o.min_mtu)) {
    return absl::UnavailableError(absl::StrCat(
        "no reply from ", o.host, ":", o.port, " even at ", o.min_mtu,
        " bytes; is the peer agent up and its UDP port reachable?"));
  }
  int lo = o.min_mtu, hi = o.target_mtu;  // lo passes, hi fails.
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (passes(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  result.largest_ok = lo;
  return result;
}

CheckResult PathMtuCheck(const std::string& peer, const absl::StatusOr<PathMtuResult>& result) {
  CheckResult r;
  r.id = "mtu.path";
  if (!result.ok()) {
    r.status = CheckStatus::kFail;
    r.message = absl::StrCat("path-MTU probe to ", peer, " failed: ", result.status().message());
    r.fix = absl::StrCat("check that the agent on ", peer,
                         " runs and that UDP to it is not filtered on the fabric");
    return r;
  }
  r.evidence = absl::StrCat("DF probes: ", result->probes, ", largest passing IP packet ",
                            result->largest_ok, " bytes");
  if (result->ok()) {
    r.status = CheckStatus::kPass;
    r.message = absl::StrCat("path to ", peer, " carries ", result->target_mtu,
                             "-byte packets unfragmented");
    return r;
  }
  r.status = CheckStatus::kFail;
  r.message = absl::StrCat("path to ", peer, " carries at most ", result->largest_ok,
                           "-byte packets with DF set; fabric.mtu is ", result->target_mtu);
  r.fix = absl::StrCat("raise the MTU to ", result->target_mtu,
                       " on every hop (both nodes' fabric netdevs and the switch ports), or set "
                       "fabric.mtu to ", result->largest_ok);
  return r;
}

}  // namespace glm::preflight
