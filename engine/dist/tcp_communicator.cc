#include "engine/dist/tcp_communicator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"

namespace glm::engine {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x474c4d48;  // "GLMH"
constexpr uint32_t kFrameMagic = 0x474c4d46;  // "GLMF"
constexpr uint32_t kProtocolVersion = 1;

enum Op : uint32_t {
  kOpReduceScatter = 1,
  kOpAllGather = 2,
  kOpSend = 3,
  kOpBroadcast = 4,
  kOpBarrier = 5,
};

const char* OpName(uint32_t op) {
  switch (op) {
    case kOpReduceScatter: return "AllReduceSum/reduce-scatter";
    case kOpAllGather: return "AllReduceSum/all-gather";
    case kOpSend: return "Send";
    case kOpBroadcast: return "Broadcast";
    case kOpBarrier: return "Barrier";
    default: return "unknown";
  }
}

struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t rank;
  uint32_t size;
};

struct Frame {
  uint32_t magic;
  uint32_t op;
  uint64_t count;
};
static_assert(sizeof(Frame) == 16);

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

absl::Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(Errno("fcntl(O_NONBLOCK)"));
  }
  return absl::OkStatus();
}

int RemainingMs(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Writes or reads exactly `len` bytes on a non-blocking socket before `deadline`.
absl::Status IoExact(int fd, char* buf, size_t len, bool write, SteadyClock::time_point deadline,
                     const std::string& what) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = write ? ::send(fd, buf + done, len - done, MSG_NOSIGNAL)
                      : ::recv(fd, buf + done, len - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError(absl::StrCat(what, ": the peer closed the connection"));
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
    }
    pollfd p{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    int ms = RemainingMs(deadline);
    if (ms == 0 || ::poll(&p, 1, ms) == 0) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<sockaddr_in> ParseAddress(const std::string& text) {
  size_t colon = text.rfind(':');
  uint32_t port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos ||
      inet_pton(AF_INET, text.substr(0, colon).c_str(), &addr.sin_addr) != 1 ||
      !absl::SimpleAtoi(ToAbsl(std::string_view(text).substr(colon + 1)), &port) ||
      port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not an IPv4 address:port"));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// [begin, end) of chunk `part` of `count` elements split `parts` ways.
size_t ChunkBegin(size_t count, int parts, int part) {
  // floor(count * part / parts) without overflow.
  const size_t n = static_cast<size_t>(parts), p = static_cast<size_t>(part);
  return count / n * p + count % n * p / n;
}

}  // namespace

TcpCommunicator::TcpCommunicator(TcpCommunicatorOptions options)
    : options_(std::move(options)), fds_(options_.size, -1) {}

TcpCommunicator::~TcpCommunicator() { CloseAll(); }

void TcpCommunicator::CloseAll() {
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

absl::StatusOr<std::unique_ptr<TcpCommunicator>> TcpCommunicator::Create(
    Rendezvous* rendezvous, TcpCommunicatorOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("TcpCommunicator: rank ", options.rank,
                                                   " is outside a group of size ", options.size));
  }
  if (rendezvous == nullptr) return absl::InvalidArgumentError("TcpCommunicator: no rendezvous");
  std::unique_ptr<TcpCommunicator> comm(new TcpCommunicator(std::move(options)));
  absl::Status status = comm->Connect(rendezvous);
  if (!status.ok()) {
    return Annotate(status, absl::StrCat("TcpCommunicator setup on rank ", comm->rank(), " of ",
                                         comm->size()));
  }
  return comm;
}

absl::Status TcpCommunicator::Connect(Rendezvous* rendezvous) {
  const int rank = options_.rank, size = options_.size;
  if (size == 1) return absl::OkStatus();
  const auto deadline = SteadyClock::now() + options_.connect_timeout;
  auto key = [&](int r) { return absl::StrCat(options_.key_prefix, "/tcp/", r); };

  // Listen first, then publish: a peer that reads the address can connect at once.
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return absl::InternalError(Errno("socket"));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{listener};
  GLM_ASSIGN_OR_RETURN(sockaddr_in bind_addr, ParseAddress(options_.host + ":1"));
  bind_addr.sin_port = 0;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&bind_addr), sizeof(bind_addr)) != 0) {
    return absl::UnavailableError(absl::StrCat(Errno("bind"), " on ", options_.host,
                                               "; is it an address of this node?"));
  }
  if (::listen(listener, size) != 0) return absl::InternalError(Errno("listen"));
  socklen_t len = sizeof(bind_addr);
  if (::getsockname(listener, reinterpret_cast<sockaddr*>(&bind_addr), &len) != 0) {
    return absl::InternalError(Errno("getsockname"));
  }
  GLM_RETURN_IF_ERROR(SetNonBlocking(listener));
  GLM_RETURN_IF_ERROR(
      rendezvous->Put(key(rank), absl::StrCat(options_.host, ":", ntohs(bind_addr.sin_port))));

  auto configure = [](int fd) -> absl::Status {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return SetNonBlocking(fd);
  };

  // Connect to every lower rank and introduce ourselves.
  for (int peer = 0; peer < rank; ++peer) {
    auto wait = std::chrono::milliseconds(RemainingMs(deadline));
    absl::StatusOr<std::string> text = rendezvous->Get(key(peer), wait);
    if (!text.ok()) return Annotate(text.status(), absl::StrCat("address of rank ", peer));
    GLM_ASSIGN_OR_RETURN(sockaddr_in addr, ParseAddress(*text));
    int fd = -1;
    while (true) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return absl::InternalError(Errno("socket"));
      GLM_RETURN_IF_ERROR(configure(fd));
      int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int ms = RemainingMs(deadline);
        if (ms == 0 || ::poll(&p, 1, ms) == 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t elen = sizeof(err);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
        }
      }
      if (err == 0) break;
      ::close(fd);
      fd = -1;
      if (err != ECONNREFUSED || RemainingMs(deadline) == 0) {
        return absl::UnavailableError(absl::StrCat("connecting to rank ", peer, " at ", *text,
                                                   ": ", std::strerror(err)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    fds_[peer] = fd;
    Hello hello{kHelloMagic, kProtocolVersion, static_cast<uint32_t>(rank),
                static_cast<uint32_t>(size)};
    GLM_RETURN_IF_ERROR(IoExact(fd, reinterpret_cast<char*>(&hello), sizeof(hello), true,
                                deadline, absl::StrCat("hello to rank ", peer)));
  }

  // Accept every higher rank; each names itself in its hello. A connection that does not say a
  // valid, new rank of this group is closed and remembered for the timeout message.
  std::string rejected;
  int accepted = 0;
  while (accepted < size - 1 - rank) {
    pollfd p{listener, POLLIN, 0};
    int ms = RemainingMs(deadline);
    if (ms == 0 || ::poll(&p, 1, ms) == 0) {
      std::vector<int> missing;
      for (int r = rank + 1; r < size; ++r) {
        if (fds_[r] < 0) missing.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "ranks [", absl::StrJoin(missing, ","), "] did not connect within ",
          options_.connect_timeout.count(), " ms",
          rejected.empty() ? "" : absl::StrCat("; rejected a connection: ", rejected,
                                               " (two groups share a key prefix?)")));
    }
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      return absl::InternalError(Errno("accept"));
    }
    Hello hello{};
    absl::Status read = configure(fd);
    if (read.ok()) {
      // A short bound per connection, so a silent stray connection cannot hold up setup.
      auto hello_deadline = std::min(deadline, SteadyClock::now() + std::chrono::seconds(5));
      read = IoExact(fd, reinterpret_cast<char*>(&hello), sizeof(hello), false, hello_deadline,
                     "hello from a connecting rank");
    }
    if (!read.ok()) {
      ::close(fd);
      rejected = std::string(read.message());
      continue;
    }
    if (hello.magic != kHelloMagic || hello.version != kProtocolVersion ||
        hello.size != static_cast<uint32_t>(size) || hello.rank <= static_cast<uint32_t>(rank) ||
        hello.rank >= static_cast<uint32_t>(size) || fds_[hello.rank] >= 0) {
      ::close(fd);
      rejected = absl::StrCat("hello (magic ", hello.magic, ", version ", hello.version,
                              ", rank ", hello.rank, ", size ", hello.size,
                              ") is not a new rank in (", rank, ", ", size, ") speaking version ",
                              kProtocolVersion);
      continue;
    }
    fds_[hello.rank] = fd;
    ++accepted;
  }
  return absl::OkStatus();
}

absl::Status TcpCommunicator::Usable() const {
  if (!poisoned_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TCP communicator (rank ", options_.rank, ") failed earlier: ", poisoned_.message()));
  }
  return absl::OkStatus();
}

absl::Status TcpCommunicator::CheckPeer(int peer, const char* op) const {
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": peer ", peer,
                                                   " is not another rank of a group of size ",
                                                   options_.size, " (this is rank ",
                                                   options_.rank, ")"));
  }
  return absl::OkStatus();
}

absl::Status TcpCommunicator::Fail(absl::Status status) {
  poisoned_ = status;
  CloseAll();  // Peers blocked on us see the close at once instead of waiting out a timeout.
  return status;
}

absl::Status TcpCommunicator::Run(const std::vector<Transfer>& transfers, const char* op_name) {
  struct State {
    const Transfer* t;
    Frame frame;
    size_t done = 0;  // Bytes of frame + payload moved.
    size_t total() const { return sizeof(Frame) + t->count * sizeof(float); }
  };
  const int size = options_.size;
  std::vector<std::optional<State>> sends(size), recvs(size);
  for (const Transfer& t : transfers) {
    auto& slot = t.is_send ? sends[t.peer] : recvs[t.peer];
    slot = State{&t, Frame{kFrameMagic, t.op, t.count}};
  }
  auto pending_peers = [&] {
    std::vector<int> peers;
    for (int p = 0; p < size; ++p) {
      if ((sends[p] && sends[p]->done < sends[p]->total()) ||
          (recvs[p] && recvs[p]->done < recvs[p]->total())) {
        peers.push_back(p);
      }
    }
    return peers;
  };
  auto closed = [&](int peer, const std::string& detail) {
    return Fail(absl::UnavailableError(absl::StrCat(
        "rank ", peer, " closed the connection during ", op_name, " (seen by rank ",
        options_.rank, detail.empty() ? "" : ": ", detail,
        "); the peer exited or failed; the group must be restarted")));
  };
  // Moves bytes of one transfer; returns an error status to fail with, OK otherwise.
  auto step = [&](int peer, State& s) -> absl::Status {
    while (s.done < s.total()) {
      char* base;
      size_t offset, len;
      if (s.done < sizeof(Frame)) {
        base = reinterpret_cast<char*>(&s.frame);
        offset = s.done;
        len = sizeof(Frame) - s.done;
      } else {
        base = s.t->data;
        offset = s.done - sizeof(Frame);
        len = s.total() - s.done;
      }
      ssize_t n = s.t->is_send ? ::send(fds_[peer], base + offset, len, MSG_NOSIGNAL)
                               : ::recv(fds_[peer], base + offset, len, 0);
      if (n == 0) return closed(peer, "");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        if (errno == EPIPE || errno == ECONNRESET) return closed(peer, std::strerror(errno));
        return Fail(absl::UnavailableError(absl::StrCat(op_name, " with rank ", peer,
                                                        " on rank ", options_.rank, ": ",
                                                        std::strerror(errno))));
      }
      size_t before = s.done;
      s.done += static_cast<size_t>(n);
      if (!s.t->is_send && before < sizeof(Frame) && s.done >= sizeof(Frame)) {
        if (s.frame.magic != kFrameMagic || s.frame.op != s.t->op ||
            s.frame.count != s.t->count) {
          return Fail(absl::FailedPreconditionError(absl::StrCat(
              "rank ", options_.rank, " expected ", OpName(s.t->op), " of ", s.t->count,
              " floats from rank ", peer, " but got ",
              s.frame.magic == kFrameMagic ? OpName(s.frame.op) : "a corrupt frame", " of ",
              s.frame.count, " floats: the ranks issued different collectives (a bug in the "
              "caller; every rank must issue the same sequence)")));
        }
      }
    }
    return absl::OkStatus();
  };

  auto last_progress = SteadyClock::now();
  std::vector<pollfd> pfds;
  std::vector<int> pfd_peer;
  while (true) {
    pfds.clear();
    pfd_peer.clear();
    for (int p = 0; p < size; ++p) {
      short events = 0;
      if (sends[p] && sends[p]->done < sends[p]->total()) events |= POLLOUT;
      if (recvs[p] && recvs[p]->done < recvs[p]->total()) events |= POLLIN;
      if (events == 0) continue;
      pfds.push_back(pollfd{fds_[p], events, 0});
      pfd_peer.push_back(p);
    }
    if (pfds.empty()) return absl::OkStatus();
    auto deadline = last_progress + options_.op_timeout;
    int ms = RemainingMs(deadline);
    int ready = ms == 0 ? 0 : ::poll(pfds.data(), pfds.size(), ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Fail(absl::InternalError(Errno("poll")));
    if (ready == 0) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          op_name, " on rank ", options_.rank, " of ", size, " made no progress for ",
          options_.op_timeout.count(), " ms waiting on rank(s) [",
          absl::StrJoin(pending_peers(), ","),
          "]; a peer is stuck or dead; the group must be restarted")));
    }
    for (size_t i = 0; i < pfds.size(); ++i) {
      int p = pfd_peer[i];
      short rev = pfds[i].revents;
      if (rev == 0) continue;
      size_t moved_before = (sends[p] ? sends[p]->done : 0) + (recvs[p] ? recvs[p]->done : 0);
      if ((rev & (POLLIN | POLLHUP | POLLERR)) && recvs[p]) GLM_RETURN_IF_ERROR(step(p, *recvs[p]));
      if ((rev & (POLLOUT | POLLHUP | POLLERR)) && sends[p]) GLM_RETURN_IF_ERROR(step(p, *sends[p]));
      if ((rev & (POLLHUP | POLLERR)) && !recvs[p] && !sends[p]) return closed(p, "");
      size_t moved_after = (sends[p] ? sends[p]->done : 0) + (recvs[p] ? recvs[p]->done : 0);
      if (moved_after != moved_before) last_progress = SteadyClock::now();
    }
  }
}

absl::Status TcpCommunicator::AllReduceSum(float* data, size_t count) {
  GLM_RETURN_IF_ERROR(Usable());
  const int n = options_.size, me = options_.rank;
  if (n == 1 || count == 0) return absl::OkStatus();
  const size_t my_begin = ChunkBegin(count, n, me);
  const size_t my_len = ChunkBegin(count, n, me + 1) - my_begin;
  // scratch_ = [n, my_len]: row p is rank p's copy of my chunk.
  if (scratch_.size() < static_cast<size_t>(n) * my_len) scratch_.resize(n * my_len);
  float* rows = scratch_.data();

  // Reduce-scatter: chunk p of my buffer goes to rank p; every rank's copy of mine comes here.
  std::vector<Transfer> transfers;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    size_t begin = ChunkBegin(count, n, p), len = ChunkBegin(count, n, p + 1) - begin;
    transfers.push_back({p, true, kOpReduceScatter, reinterpret_cast<char*>(data + begin), len});
    transfers.push_back(
        {p, false, kOpReduceScatter, reinterpret_cast<char*>(rows + p * my_len), my_len});
  }
  GLM_RETURN_IF_ERROR(Run(transfers, "AllReduceSum"));

  // Sum in rank order, the order of a serial loop: ((x0 + x1) + x2) + ...
  float* mine = data + my_begin;
  std::copy(mine, mine + my_len, rows + me * my_len);
  std::copy(rows, rows + my_len, mine);
  for (int p = 1; p < n; ++p) {
    const float* row = rows + p * my_len;
    for (size_t i = 0; i < my_len; ++i) mine[i] += row[i];
  }

  // All-gather: my summed chunk to everyone; theirs into place.
  transfers.clear();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    size_t begin = ChunkBegin(count, n, p), len = ChunkBegin(count, n, p + 1) - begin;
    transfers.push_back({p, true, kOpAllGather, reinterpret_cast<char*>(mine), my_len});
    transfers.push_back({p, false, kOpAllGather, reinterpret_cast<char*>(data + begin), len});
  }
  return Run(transfers, "AllReduceSum");
}

absl::Status TcpCommunicator::Send(const float* data, size_t count, int peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(peer, "Send"));
  return Run({{peer, true, kOpSend, const_cast<char*>(reinterpret_cast<const char*>(data)), count}},
             "Send");
}

absl::Status TcpCommunicator::Recv(float* data, size_t count, int peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(peer, "Recv"));
  return Run({{peer, false, kOpSend, reinterpret_cast<char*>(data), count}}, "Recv");
}

absl::Status TcpCommunicator::SendRecv(const float* send, size_t send_count, int send_peer,
                                       float* recv, size_t recv_count, int recv_peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(send_peer, "SendRecv"));
  GLM_RETURN_IF_ERROR(CheckPeer(recv_peer, "SendRecv"));
  return Run({{send_peer, true, kOpSend, const_cast<char*>(reinterpret_cast<const char*>(send)),
               send_count},
              {recv_peer, false, kOpSend, reinterpret_cast<char*>(recv), recv_count}},
             "SendRecv");
}

absl::Status TcpCommunicator::Broadcast(float* data, size_t count, int root) {
  GLM_RETURN_IF_ERROR(Usable());
  if (root < 0 || root >= options_.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " outside a group of size ", options_.size));
  }
  std::vector<Transfer> transfers;
  if (options_.rank == root) {
    for (int p = 0; p < options_.size; ++p) {
      if (p != root) transfers.push_back({p, true, kOpBroadcast, reinterpret_cast<char*>(data), count});
    }
  } else {
    transfers.push_back({root, false, kOpBroadcast, reinterpret_cast<char*>(data), count});
  }
  return Run(transfers, "Broadcast");
}

absl::Status TcpCommunicator::Barrier() {
  GLM_RETURN_IF_ERROR(Usable());
  std::vector<Transfer> transfers;
  for (int p = 0; p < options_.size; ++p) {
    if (p == options_.rank) continue;
    transfers.push_back({p, true, kOpBarrier, nullptr, 0});
    transfers.push_back({p, false, kOpBarrier, nullptr, 0});
  }
  return Run(transfers, "Barrier");
}

absl::Status TcpCommunicator::Synchronize() { return Usable(); }

}  // namespace glm::engine
