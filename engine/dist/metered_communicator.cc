#include "engine/dist/metered_communicator.h"

#include <utility>

namespace glm::engine {
namespace {

// Times `call` on `clock` and records it under `channel` / `op` with `elements`; returns its
// status as is.
template <typename Call>
absl::Status Timed(const Clock* clock, CommMeter* meter, CommChannel channel, CommOp op,
                   uint64_t elements, Call&& call) {
  const Clock::TimePoint start = clock->Now();
  absl::Status s = call();
  meter->Record(channel, op, elements, (clock->Now() - start).count());
  return s;
}

}  // namespace

std::string_view CommOpName(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kSendRecv:
      return "sendrecv";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kBarrier:
      return "barrier";
  }
  return "unknown";
}

std::string_view CommChannelName(CommChannel channel) {
  switch (channel) {
    case CommChannel::kWorld:
      return "world";
    case CommChannel::kTp:
      return "tp";
    case CommChannel::kControl:
      return "control";
    case CommChannel::kResult:
      return "result";
  }
  return "unknown";
}

namespace {

void Add(const CommOpTotals& from, CommOpTotals* to) {
  to->calls += from.calls;
  to->elements += from.elements;
  to->nanos += from.nanos;
}

}  // namespace

CommOpTotals CommSnapshot::operator[](CommOp op) const {
  CommOpTotals t;
  for (const auto& channel : totals) Add(channel[static_cast<int>(op)], &t);
  return t;
}

CommOpTotals CommSnapshot::Total(CommChannel channel) const {
  CommOpTotals t;
  for (const CommOpTotals& o : totals[static_cast<int>(channel)]) Add(o, &t);
  return t;
}

CommOpTotals CommSnapshot::Total() const {
  CommOpTotals t;
  for (const auto& channel : totals) {
    for (const CommOpTotals& o : channel) Add(o, &t);
  }
  return t;
}

CommSnapshot CommSnapshot::Since(const CommSnapshot& earlier) const {
  CommSnapshot d;
  for (int c = 0; c < kNumCommChannels; ++c) {
    for (int i = 0; i < kNumCommOps; ++i) {
      const CommOpTotals& now = totals[c][i];
      const CommOpTotals& then = earlier.totals[c][i];
      d.totals[c][i] = {now.calls - then.calls, now.elements - then.elements,
                        now.nanos - then.nanos};
    }
  }
  return d;
}

void CommMeter::Record(CommChannel channel, CommOp op, uint64_t elements, int64_t nanos) {
  // Relaxed: readers only need each counter whole, not an order between them.
  Counters& c = counters_[static_cast<int>(channel)][static_cast<int>(op)];
  c.calls.fetch_add(1, std::memory_order_relaxed);
  c.elements.fetch_add(elements, std::memory_order_relaxed);
  c.nanos.fetch_add(nanos, std::memory_order_relaxed);
}

CommSnapshot CommMeter::Snapshot() const {
  CommSnapshot s;
  for (int c = 0; c < kNumCommChannels; ++c) {
    for (int i = 0; i < kNumCommOps; ++i) {
      const Counters& from = counters_[c][i];
      s.totals[c][i] = {from.calls.load(std::memory_order_relaxed),
                        from.elements.load(std::memory_order_relaxed),
                        from.nanos.load(std::memory_order_relaxed)};
    }
  }
  return s;
}

MeteredCommunicator::MeteredCommunicator(std::unique_ptr<Communicator> inner, CommMeter* meter,
                                         CommChannel channel, const Clock* clock)
    : inner_(std::move(inner)), meter_(meter), channel_(channel), clock_(clock) {}

absl::Status MeteredCommunicator::AllReduceSum(float* data, size_t count) {
  return Timed(clock_, meter_, channel_, CommOp::kAllReduce, count,
               [&] { return inner_->AllReduceSum(data, count); });
}

absl::Status MeteredCommunicator::Send(const float* data, size_t count, int peer) {
  return Timed(clock_, meter_, channel_, CommOp::kSend, count,
               [&] { return inner_->Send(data, count, peer); });
}

absl::Status MeteredCommunicator::Recv(float* data, size_t count, int peer) {
  return Timed(clock_, meter_, channel_, CommOp::kRecv, count,
               [&] { return inner_->Recv(data, count, peer); });
}

absl::Status MeteredCommunicator::SendRecv(const float* send, size_t send_count, int send_peer,
                                           float* recv, size_t recv_count, int recv_peer) {
  return Timed(clock_, meter_, channel_, CommOp::kSendRecv, send_count + recv_count, [&] {
    return inner_->SendRecv(send, send_count, send_peer, recv, recv_count, recv_peer);
  });
}

absl::Status MeteredCommunicator::Broadcast(float* data, size_t count, int root) {
  return Timed(clock_, meter_, channel_, CommOp::kBroadcast, count,
               [&] { return inner_->Broadcast(data, count, root); });
}

absl::Status MeteredCommunicator::Barrier() {
  return Timed(clock_, meter_, channel_, CommOp::kBarrier, 0, [&] { return inner_->Barrier(); });
}

}  // namespace glm::engine
