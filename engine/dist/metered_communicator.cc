#include "engine/dist/metered_communicator.h"

#include <utility>

namespace glm::engine {
namespace {

// Times `call` on `clock` and records it under `op` with `elements`; returns its status as is.
template <typename Call>
absl::Status Timed(const Clock* clock, CommMeter* meter, CommOp op, uint64_t elements,
                   Call&& call) {
  const Clock::TimePoint start = clock->Now();
  absl::Status s = call();
  meter->Record(op, elements, (clock->Now() - start).count());
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

CommOpTotals CommSnapshot::Total() const {
  CommOpTotals t;
  for (const CommOpTotals& o : ops) {
    t.calls += o.calls;
    t.elements += o.elements;
    t.nanos += o.nanos;
  }
  return t;
}

CommSnapshot CommSnapshot::Since(const CommSnapshot& earlier) const {
  CommSnapshot d;
  for (int i = 0; i < kNumCommOps; ++i) {
    d.ops[i].calls = ops[i].calls - earlier.ops[i].calls;
    d.ops[i].elements = ops[i].elements - earlier.ops[i].elements;
    d.ops[i].nanos = ops[i].nanos - earlier.ops[i].nanos;
  }
  return d;
}

void CommMeter::Record(CommOp op, uint64_t elements, int64_t nanos) {
  // One writer: relaxed increments are enough; readers only need each counter whole.
  Counters& c = ops_[static_cast<int>(op)];
  c.calls.fetch_add(1, std::memory_order_relaxed);
  c.elements.fetch_add(elements, std::memory_order_relaxed);
  c.nanos.fetch_add(nanos, std::memory_order_relaxed);
}

CommSnapshot CommMeter::Snapshot() const {
  CommSnapshot s;
  for (int i = 0; i < kNumCommOps; ++i) {
    s.ops[i].calls = ops_[i].calls.load(std::memory_order_relaxed);
    s.ops[i].elements = ops_[i].elements.load(std::memory_order_relaxed);
    s.ops[i].nanos = ops_[i].nanos.load(std::memory_order_relaxed);
  }
  return s;
}

MeteredCommunicator::MeteredCommunicator(std::unique_ptr<Communicator> inner, CommMeter* meter,
                                         const Clock* clock)
    : inner_(std::move(inner)), meter_(meter), clock_(clock) {}

absl::Status MeteredCommunicator::AllReduceSum(float* data, size_t count) {
  return Timed(clock_, meter_, CommOp::kAllReduce, count,
               [&] { return inner_->AllReduceSum(data, count); });
}

absl::Status MeteredCommunicator::Send(const float* data, size_t count, int peer) {
  return Timed(clock_, meter_, CommOp::kSend, count,
               [&] { return inner_->Send(data, count, peer); });
}

absl::Status MeteredCommunicator::Recv(float* data, size_t count, int peer) {
  return Timed(clock_, meter_, CommOp::kRecv, count,
               [&] { return inner_->Recv(data, count, peer); });
}

absl::Status MeteredCommunicator::SendRecv(const float* send, size_t send_count, int send_peer,
                                           float* recv, size_t recv_count, int recv_peer) {
  return Timed(clock_, meter_, CommOp::kSendRecv, send_count + recv_count, [&] {
    return inner_->SendRecv(send, send_count, send_peer, recv, recv_count, recv_peer);
  });
}

absl::Status MeteredCommunicator::Broadcast(float* data, size_t count, int root) {
  return Timed(clock_, meter_, CommOp::kBroadcast, count,
               [&] { return inner_->Broadcast(data, count, root); });
}

absl::Status MeteredCommunicator::Barrier() {
  return Timed(clock_, meter_, CommOp::kBarrier, 0, [&] { return inner_->Barrier(); });
}

}  // namespace glm::engine
