#include "engine/dist/gloo_communicator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_util.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace glm::engine {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Slots of our point-to-point messages: the top byte keeps them apart from Gloo's collectives
// (prefixes 0x01..0x08 in gloo/types.h); the probe slot is never received.
constexpr uint64_t kSendRecvSlotPrefix = 0x20;
constexpr uint64_t kProbeSlotPrefix = 0x21;

// Gloo's 32-bit tag for an operation of `count` floats: ranks whose counts differ use different
// slots, so their messages never match (exact below 2^32 elements).
uint32_t CountTag(size_t count) {
  const uint64_t c = count;
  return static_cast<uint32_t>(c ^ (c >> 32));
}

// The slot layout of gloo::Slot::build: prefix in bits 56..63, tag in bits 24..55.
uint64_t SendRecvSlot(size_t count) {
  return (kSendRecvSlotPrefix << 56) | (uint64_t{CountTag(count)} << 24);
}

// A gloo::rendezvous::Store over our Rendezvous. Gloo's API reports errors by exception: a
// failed Put or Get throws gloo::IoException and keeps the status (with its code) for Create.
class RendezvousStore : public gloo::rendezvous::Store {
 public:
  RendezvousStore(Rendezvous* rendezvous, std::string prefix, SteadyClock::time_point deadline)
      : rendezvous_(rendezvous), prefix_(std::move(prefix)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status status = rendezvous_->Put(Key(key), std::string(data.begin(), data.end()));
    if (!status.ok()) Throw(Annotate(status, absl::StrCat("publishing ", Describe(key))));
  }

  std::vector<char> get(const std::string& key) override {
    std::string value = Fetch(key, Remaining());
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, Remaining()); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) Fetch(key, std::min(timeout, Remaining()));
  }

  // The first error thrown, OK when none.
  const absl::Status& error() const { return error_; }

 private:
  std::string Key(const std::string& key) const { return absl::StrCat(prefix_, "/", key); }

  // Gloo's keys: "rank_<r>" holds rank r's host name, "<r>" its pair addresses.
  static std::string Describe(const std::string& key) {
    int rank = 0;
    if (absl::StartsWith(key, "rank_") &&
        absl::SimpleAtoi(ToAbsl(std::string_view(key).substr(5)), &rank)) {
      return absl::StrCat("the host name of rank ", rank);
    }
    if (absl::SimpleAtoi(ToAbsl(key), &rank)) return absl::StrCat("the address of rank ", rank);
    return absl::StrCat("key '", key, "'");
  }

  std::chrono::milliseconds Remaining() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ -
                                                                      SteadyClock::now());
    return std::max(left, std::chrono::milliseconds(0));
  }

  std::string Fetch(const std::string& key, std::chrono::milliseconds wait) {
    absl::StatusOr<std::string> value = rendezvous_->Get(Key(key), wait);
    if (!value.ok()) Throw(Annotate(value.status(), absl::StrCat("waiting for ", Describe(key))));
    return *std::move(value);
  }

  [[noreturn]] void Throw(absl::Status status) {
    if (error_.ok()) error_ = status;
    throw gloo::IoException(std::string(status.message()));
  }

  Rendezvous* rendezvous_;
  std::string prefix_;
  SteadyClock::time_point deadline_;
  absl::Status error_;
};

bool IsNumericIp(const std::string& host) {
  in_addr v4;
  in6_addr v6;
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

std::string RingPeers(int rank, int size) {
  // Gloo's ring: receives from rank + 1, sends to rank - 1.
  return absl::StrCat("ring: receives from rank ", (rank + 1) % size, ", sends to rank ",
                      (rank + size - 1) % size);
}

}  // namespace

GlooCommunicator::GlooCommunicator(GlooCommunicatorOptions options)
    : options_(std::move(options)) {}

GlooCommunicator::~GlooCommunicator() {
  context_.reset();  // Closes the pairs before the device (its event loop) goes.
  device_.reset();
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    Rendezvous* rendezvous, GlooCommunicatorOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("GlooCommunicator: rank ", options.rank,
                                                   " is outside a group of size ", options.size));
  }
  if (rendezvous == nullptr) return absl::InvalidArgumentError("GlooCommunicator: no rendezvous");
  // A dead peer must surface as an error on this rank, not as SIGPIPE killing the process.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { ::signal(SIGPIPE, SIG_IGN); });
  if (!IsNumericIp(options.host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GlooCommunicator: host '", options.host,
        "' is not a numeric IP address; pass the IP of this node's fabric interface"));
  }
  if (options.connect_timeout.count() <= 0 || options.op_timeout.count() <= 0) {
    return absl::InvalidArgumentError("GlooCommunicator: connect_timeout and op_timeout must be > 0");
  }
  std::unique_ptr<GlooCommunicator> comm(new GlooCommunicator(std::move(options)));
  const GlooCommunicatorOptions& o = comm->options_;
  if (o.size == 1) return comm;

  RendezvousStore store(rendezvous, absl::StrCat(o.key_prefix, "/gloo"),
                        SteadyClock::now() + o.connect_timeout);
  absl::Status status;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(o.connect_timeout);  // Bounds the store waits and the connects.
    context->connectFullMesh(store, device);
    context->setTimeout(o.op_timeout);
    comm->device_ = std::move(device);
    comm->context_ = std::move(context);
  } catch (const std::exception& e) {
    if (!store.error().ok()) {
      status = store.error();
    } else if (absl::StrContains(e.what(), "Timed out")) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "connecting to the other ranks did not complete within ", o.connect_timeout.count(),
          " ms (a peer exited after publishing its address?): ", e.what()));
    } else if (absl::StrContains(e.what(), "Unable to find address")) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "cannot bind ", o.host, ": ", e.what(), "; is it an address of this node?"));
    } else {
      status = absl::UnavailableError(absl::StrCat("gloo: ", e.what()));
    }
  }
  if (!status.ok()) {
    return Annotate(status, absl::StrCat("GlooCommunicator setup on rank ", o.rank, " of ",
                                         o.size, " (host ", o.host, ", key prefix '",
                                         o.key_prefix, "')"));
  }
  return comm;
}

absl::Status GlooCommunicator::Usable() const {
  if (!poisoned_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Gloo communicator (rank ", options_.rank, ") failed earlier: ", poisoned_.message()));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::CheckPeer(int peer, const char* op) const {
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": peer ", peer,
                                                   " is not another rank of a group of size ",
                                                   options_.size, " (this is rank ",
                                                   options_.rank, ")"));
  }
  return absl::OkStatus();
}

std::vector<int> GlooCommunicator::BrokenPeers() {
  // A pair whose connection failed rethrows its error on any new operation. The probe (an empty
  // send on a slot nobody receives) is harmless on a healthy pair: the group is closed next.
  std::vector<int> broken;
  char byte = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> probe;
  try {
    probe = context_->createUnboundBuffer(&byte, 0);
  } catch (const std::exception&) {
    return broken;
  }
  for (int peer = 0; peer < options_.size; ++peer) {
    if (peer == options_.rank) continue;
    try {
      context_->getPair(peer)->send(probe.get(), kProbeSlotPrefix << 56, 0, 0);
    } catch (const std::exception&) {
      broken.push_back(peer);
    }
  }
  return broken;
}

absl::Status GlooCommunicator::Run(const char* op, const std::string& peers,
                                   absl::FunctionRef<void()> body) {
  std::string what;
  bool io_error = false;
  try {
    body();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    what = e.what();
    io_error = true;
  } catch (const std::exception& e) {
    what = e.what();
  }
  const bool timed_out = absl::StrContains(what, "Timed out");
  std::string cause;
  absl::StatusCode code;
  if (timed_out) {
    code = absl::StatusCode::kDeadlineExceeded;
    cause = absl::StrCat("no progress for ", options_.op_timeout.count(),
                         " ms: a peer is stuck or dead, or the ranks issued different operations "
                         "or counts (every rank must issue the same sequence)");
  } else if (io_error) {
    code = absl::StatusCode::kUnavailable;
    std::vector<int> broken = BrokenPeers();
    cause = broken.empty()
                ? std::string("a connection failed")
                : absl::StrCat("the connection to rank(s) [", absl::StrJoin(broken, ","),
                               "] failed: the peer exited, failed or gave up on the group");
  } else {
    code = absl::StatusCode::kInternal;
    cause = "Gloo rejected the operation";
  }
  absl::Status status(code, absl::StrCat(op, " on rank ", options_.rank, " of ", options_.size,
                                         " (", peers, ") failed: ", cause, " (gloo: ", what,
                                         "); the group must be restarted"));
  poisoned_ = status;
  try {
    context_->closeConnections();  // Peers blocked on us fail at once instead of timing out.
  } catch (const std::exception&) {
    // Already closed; nothing else to release.
  }
  return status;
}

absl::Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  GLM_RETURN_IF_ERROR(Usable());
  if (options_.size == 1 || count == 0) return absl::OkStatus();
  return Run("AllReduceSum", RingPeers(options_.rank, options_.size), [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(CountTag(count));
    opts.setTimeout(options_.op_timeout);
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::Send(const float* data, size_t count, int peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(peer, "Send"));
  if (count == 0) return absl::OkStatus();
  return Run("Send", absl::StrCat("to rank ", peer), [&] {
    auto buffer = context_->createUnboundBuffer(const_cast<float*>(data), count * sizeof(float));
    buffer->send(peer, SendRecvSlot(count));
    buffer->waitSend(options_.op_timeout);
  });
}

absl::Status GlooCommunicator::Recv(float* data, size_t count, int peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(peer, "Recv"));
  if (count == 0) return absl::OkStatus();
  return Run("Recv", absl::StrCat("from rank ", peer), [&] {
    auto buffer = context_->createUnboundBuffer(data, count * sizeof(float));
    buffer->recv(peer, SendRecvSlot(count));
    buffer->waitRecv(options_.op_timeout);
  });
}

absl::Status GlooCommunicator::SendRecv(const float* send, size_t send_count, int send_peer,
                                        float* recv, size_t recv_count, int recv_peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(send_peer, "SendRecv"));
  GLM_RETURN_IF_ERROR(CheckPeer(recv_peer, "SendRecv"));
  return Run("SendRecv", absl::StrCat("to rank ", send_peer, ", from rank ", recv_peer), [&] {
    // Both are posted before waiting on either, so ranks exchanging with each other progress.
    std::unique_ptr<gloo::transport::UnboundBuffer> in, out;
    if (recv_count > 0) {
      in = context_->createUnboundBuffer(recv, recv_count * sizeof(float));
      in->recv(recv_peer, SendRecvSlot(recv_count));
    }
    if (send_count > 0) {
      out = context_->createUnboundBuffer(const_cast<float*>(send), send_count * sizeof(float));
      out->send(send_peer, SendRecvSlot(send_count));
    }
    if (in) in->waitRecv(options_.op_timeout);
    if (out) out->waitSend(options_.op_timeout);
  });
}

absl::Status GlooCommunicator::Broadcast(float* data, size_t count, int root) {
  GLM_RETURN_IF_ERROR(Usable());
  if (root < 0 || root >= options_.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " outside a group of size ", options_.size));
  }
  if (options_.size == 1 || count == 0) return absl::OkStatus();
  return Run("Broadcast", absl::StrCat("root rank ", root), [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, count);
    opts.setRoot(root);
    opts.setTag(CountTag(count));
    opts.setTimeout(options_.op_timeout);
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() {
  GLM_RETURN_IF_ERROR(Usable());
  if (options_.size == 1) return absl::OkStatus();
  return Run("Barrier", "all ranks", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(options_.op_timeout);
    gloo::barrier(opts);
  });
}

absl::Status GlooCommunicator::Synchronize() { return Usable(); }

}  // namespace glm::engine
