// A Communicator decorator that counts what passes through it: per operation kind, the calls,
// the fp32 elements (and bytes) and the wall time spent inside the wrapped communicator's call.
// Used by benchmarks (engine/bench/dist_bench.cc) to split a step into compute and
// communication; ShardTopology::comm_meter wraps a replica's communicators with it.
//
// What the time means: the wall time from entering the wrapped call to its return, measured on
// the injected clock. For GlooCommunicator (each call completes before it returns) that is the
// transfer plus any wait for the peers to arrive, e.g. a later pipeline stage's Recv waits for
// the earlier stages' compute. For NcclCommunicator (asynchronous) it is the enqueue time only.
//
// Elements per call: AllReduceSum / Send / Recv / Broadcast count `count`; SendRecv counts
// send_count + recv_count; Barrier counts 0. Bytes = elements * sizeof(float).
// Every call is recorded, failed ones included (the status passes through unchanged), under the
// channel its communicator was given: one meter can then tell a replica's communicators apart
// (engine/pipeline/stage_group.h: world, tp, control, result).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "common/clock.h"
#include "engine/dist/communicator.h"

namespace glm::engine {

enum class CommOp { kAllReduce = 0, kSend, kRecv, kSendRecv, kBroadcast, kBarrier };
inline constexpr int kNumCommOps = 6;
// "all_reduce", "send", "recv", "sendrecv", "broadcast", "barrier".
std::string_view CommOpName(CommOp op);

// Which of a replica's communicators a call went through (stage_group.h).
enum class CommChannel { kWorld = 0, kTp, kControl, kResult };
inline constexpr int kNumCommChannels = 4;
// "world", "tp", "control", "result".
std::string_view CommChannelName(CommChannel channel);

// Totals of one operation kind.
struct CommOpTotals {
  uint64_t calls = 0;
  uint64_t elements = 0;  // fp32 elements moved (see the header comment)
  int64_t nanos = 0;      // wall time inside the calls
  uint64_t bytes() const { return elements * sizeof(float); }
};

// A copy of a meter's counters at one moment; subtract two to get what happened in between.
struct CommSnapshot {
  // [channel][op]
  std::array<std::array<CommOpTotals, kNumCommOps>, kNumCommChannels> totals{};

  const CommOpTotals& At(CommChannel channel, CommOp op) const {
    return totals[static_cast<int>(channel)][static_cast<int>(op)];
  }
  // One kind over every channel.
  CommOpTotals operator[](CommOp op) const;
  // Every kind of one channel.
  CommOpTotals Total(CommChannel channel) const;
  // Everything.
  CommOpTotals Total() const;
  // this - earlier, per channel and kind.
  CommSnapshot Since(const CommSnapshot& earlier) const;
};

// The counters one or more MeteredCommunicators add to. Owned by the caller; must outlive the
// communicators that write to it. Record() and Snapshot() may be called from any thread at any
// time (every counter is an atomic; a pipeline head drives its communicators from three
// threads): each counter is read whole, the set of them is not (a call recorded during the read
// may be partly in the copy).
class CommMeter {
 public:
  CommMeter() = default;
  CommMeter(const CommMeter&) = delete;
  CommMeter& operator=(const CommMeter&) = delete;

  void Record(CommChannel channel, CommOp op, uint64_t elements, int64_t nanos);
  CommSnapshot Snapshot() const;

 private:
  struct Counters {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> elements{0};
    std::atomic<int64_t> nanos{0};
  };
  std::array<std::array<Counters, kNumCommOps>, kNumCommChannels> counters_;
};

class MeteredCommunicator : public Communicator {
 public:
  // Forwards to `inner` (owned) and records into `meter` (not owned, not null) under `channel`.
  // `clock` (not owned) times the calls; Clock::Real() by default.
  MeteredCommunicator(std::unique_ptr<Communicator> inner, CommMeter* meter, CommChannel channel,
                      const Clock* clock = Clock::Real());

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool DeviceMemory() const override { return inner_->DeviceMemory(); }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Send(const float* data, size_t count, int peer) override;
  absl::Status Recv(float* data, size_t count, int peer) override;
  absl::Status SendRecv(const float* send, size_t send_count, int send_peer, float* recv,
                        size_t recv_count, int recv_peer) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  absl::Status Barrier() override;
  // Forwarded, not recorded: it moves nothing (for Gloo it is a no-op).
  absl::Status Synchronize() override { return inner_->Synchronize(); }

  Communicator* inner() const { return inner_.get(); }

 private:
  std::unique_ptr<Communicator> inner_;
  CommMeter* meter_;
  CommChannel channel_;
  const Clock* clock_;
};

}  // namespace glm::engine
