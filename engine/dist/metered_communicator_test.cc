#include "engine/dist/metered_communicator.h"

#include <chrono>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

// Records every call's arguments, advances the clock by a per-call amount while "inside" the
// call, and returns `status`.
class RecordingCommunicator : public Communicator {
 public:
  struct Call {
    CommOp op;
    const void* data;
    size_t count;
    int peer;
  };

  RecordingCommunicator(FakeClock* clock, std::chrono::nanoseconds per_call)
      : clock_(clock), per_call_(per_call) {}

  int rank() const override { return 3; }
  int size() const override { return 4; }
  absl::Status AllReduceSum(float* data, size_t count) override {
    return Note({CommOp::kAllReduce, data, count, -1});
  }
  absl::Status Send(const float* data, size_t count, int peer) override {
    return Note({CommOp::kSend, data, count, peer});
  }
  absl::Status Recv(float* data, size_t count, int peer) override {
    return Note({CommOp::kRecv, data, count, peer});
  }
  absl::Status SendRecv(const float* send, size_t send_count, int send_peer, float* recv,
                        size_t recv_count, int recv_peer) override {
    calls.push_back({CommOp::kSendRecv, send, send_count, send_peer});
    return Note({CommOp::kSendRecv, recv, recv_count, recv_peer});
  }
  absl::Status Broadcast(float* data, size_t count, int root) override {
    return Note({CommOp::kBroadcast, data, count, root});
  }
  absl::Status Barrier() override { return Note({CommOp::kBarrier, nullptr, 0, -1}); }
  absl::Status Synchronize() override {
    ++num_synchronize;
    return status;
  }

  std::vector<Call> calls;
  int num_synchronize = 0;
  absl::Status status;

 private:
  absl::Status Note(Call c) {
    calls.push_back(c);
    clock_->Advance(per_call_);
    return status;
  }
  FakeClock* clock_;
  std::chrono::nanoseconds per_call_;
};

struct Fixture {
  FakeClock clock;
  CommMeter meter;
  RecordingCommunicator* inner;
  std::unique_ptr<MeteredCommunicator> comm;

  explicit Fixture(std::chrono::nanoseconds per_call = std::chrono::microseconds(5)) {
    auto r = std::make_unique<RecordingCommunicator>(&clock, per_call);
    inner = r.get();
    comm = std::make_unique<MeteredCommunicator>(std::move(r), &meter, CommChannel::kControl,
                                                 &clock);
  }
};

TEST(MeteredCommunicatorTest, ForwardsEveryCallWithItsArguments) {
  Fixture f;
  float a[8] = {};
  float b[3] = {};
  EXPECT_EQ(f.comm->rank(), 3);
  EXPECT_EQ(f.comm->size(), 4);
  ASSERT_TRUE(f.comm->AllReduceSum(a, 8).ok());
  ASSERT_TRUE(f.comm->Send(a, 7, 1).ok());
  ASSERT_TRUE(f.comm->Recv(b, 3, 2).ok());
  ASSERT_TRUE(f.comm->SendRecv(a, 8, 0, b, 3, 1).ok());
  ASSERT_TRUE(f.comm->Broadcast(b, 2, 0).ok());
  ASSERT_TRUE(f.comm->Barrier().ok());
  ASSERT_TRUE(f.comm->Synchronize().ok());

  const std::vector<RecordingCommunicator::Call>& c = f.inner->calls;
  ASSERT_EQ(c.size(), 7u);
  EXPECT_EQ(c[0].op, CommOp::kAllReduce);
  EXPECT_EQ(c[0].data, a);
  EXPECT_EQ(c[0].count, 8u);
  EXPECT_EQ(c[1].op, CommOp::kSend);
  EXPECT_EQ(c[1].data, a);
  EXPECT_EQ(c[1].count, 7u);
  EXPECT_EQ(c[1].peer, 1);
  EXPECT_EQ(c[2].op, CommOp::kRecv);
  EXPECT_EQ(c[2].data, b);
  EXPECT_EQ(c[2].count, 3u);
  EXPECT_EQ(c[2].peer, 2);
  EXPECT_EQ(c[3].op, CommOp::kSendRecv);  // the send half
  EXPECT_EQ(c[3].data, a);
  EXPECT_EQ(c[3].count, 8u);
  EXPECT_EQ(c[3].peer, 0);
  EXPECT_EQ(c[4].op, CommOp::kSendRecv);  // the receive half
  EXPECT_EQ(c[4].data, b);
  EXPECT_EQ(c[4].count, 3u);
  EXPECT_EQ(c[4].peer, 1);
  EXPECT_EQ(c[5].op, CommOp::kBroadcast);
  EXPECT_EQ(c[5].count, 2u);
  EXPECT_EQ(c[5].peer, 0);
  EXPECT_EQ(c[6].op, CommOp::kBarrier);
  EXPECT_EQ(f.inner->num_synchronize, 1);
}

TEST(MeteredCommunicatorTest, CountsCallsElementsBytesAndTimePerKind) {
  Fixture f(std::chrono::microseconds(5));
  std::vector<float> a(100), b(40);
  ASSERT_TRUE(f.comm->AllReduceSum(a.data(), 100).ok());
  ASSERT_TRUE(f.comm->AllReduceSum(a.data(), 60).ok());
  ASSERT_TRUE(f.comm->Send(a.data(), 10, 1).ok());
  ASSERT_TRUE(f.comm->Recv(b.data(), 40, 1).ok());
  ASSERT_TRUE(f.comm->SendRecv(a.data(), 30, 0, b.data(), 20, 0).ok());
  ASSERT_TRUE(f.comm->Broadcast(b.data(), 4, 0).ok());
  ASSERT_TRUE(f.comm->Barrier().ok());
  ASSERT_TRUE(f.comm->Synchronize().ok());  // moves nothing: not recorded

  const CommSnapshot s = f.meter.Snapshot();
  EXPECT_EQ(s[CommOp::kAllReduce].calls, 2u);
  EXPECT_EQ(s[CommOp::kAllReduce].elements, 160u);
  EXPECT_EQ(s[CommOp::kAllReduce].bytes(), 640u);
  EXPECT_EQ(s[CommOp::kAllReduce].nanos, 10'000);
  EXPECT_EQ(s[CommOp::kSend].calls, 1u);
  EXPECT_EQ(s[CommOp::kSend].elements, 10u);
  EXPECT_EQ(s[CommOp::kRecv].elements, 40u);
  EXPECT_EQ(s[CommOp::kSendRecv].calls, 1u);
  EXPECT_EQ(s[CommOp::kSendRecv].elements, 50u);
  EXPECT_EQ(s[CommOp::kSendRecv].nanos, 5'000);
  EXPECT_EQ(s[CommOp::kBroadcast].elements, 4u);
  EXPECT_EQ(s[CommOp::kBarrier].calls, 1u);
  EXPECT_EQ(s[CommOp::kBarrier].elements, 0u);
  EXPECT_EQ(s[CommOp::kBarrier].nanos, 5'000);

  const CommOpTotals total = s.Total();
  EXPECT_EQ(total.calls, 7u);
  EXPECT_EQ(s.Total(CommChannel::kControl).calls, 7u);  // the fixture's channel
  EXPECT_EQ(s.Total(CommChannel::kWorld).calls, 0u);
  EXPECT_EQ(total.elements, 160u + 10 + 40 + 50 + 4);
  EXPECT_EQ(total.nanos, 7 * 5'000);
}

TEST(MeteredCommunicatorTest, ZeroCountCallsAreCounted) {
  Fixture f;
  ASSERT_TRUE(f.comm->AllReduceSum(nullptr, 0).ok());
  const CommSnapshot s = f.meter.Snapshot();
  EXPECT_EQ(s[CommOp::kAllReduce].calls, 1u);
  EXPECT_EQ(s[CommOp::kAllReduce].elements, 0u);
}

TEST(MeteredCommunicatorTest, ErrorsPassThroughUnchangedAndAreStillRecorded) {
  Fixture f;
  f.inner->status = absl::DeadlineExceededError("gloo: rank 1 silent for 30 s");
  float a[4] = {};
  absl::Status s = f.comm->AllReduceSum(a, 4);
  EXPECT_EQ(s, f.inner->status);
  EXPECT_EQ(f.comm->Send(a, 4, 1), f.inner->status);
  EXPECT_EQ(f.comm->Recv(a, 4, 1), f.inner->status);
  EXPECT_EQ(f.comm->SendRecv(a, 2, 1, a + 2, 2, 1), f.inner->status);
  EXPECT_EQ(f.comm->Broadcast(a, 4, 0), f.inner->status);
  EXPECT_EQ(f.comm->Barrier(), f.inner->status);
  EXPECT_EQ(f.comm->Synchronize(), f.inner->status);
  EXPECT_EQ(f.meter.Snapshot().Total().calls, 6u);
  EXPECT_EQ(f.meter.Snapshot()[CommOp::kAllReduce].elements, 4u);
}

TEST(MeteredCommunicatorTest, CallsAreRecordedUnderTheirCommunicatorsChannel) {
  FakeClock clock;
  CommMeter meter;
  MeteredCommunicator world(
      std::make_unique<RecordingCommunicator>(&clock, std::chrono::microseconds(1)), &meter,
      CommChannel::kWorld, &clock);
  MeteredCommunicator tp(
      std::make_unique<RecordingCommunicator>(&clock, std::chrono::microseconds(2)), &meter,
      CommChannel::kTp, &clock);
  float a[6] = {};
  ASSERT_TRUE(world.Send(a, 6, 1).ok());
  ASSERT_TRUE(world.AllReduceSum(a, 1).ok());
  ASSERT_TRUE(tp.AllReduceSum(a, 6).ok());
  ASSERT_TRUE(tp.AllReduceSum(a, 6).ok());
  const CommSnapshot s = meter.Snapshot();
  EXPECT_EQ(s.At(CommChannel::kWorld, CommOp::kSend).calls, 1u);
  EXPECT_EQ(s.At(CommChannel::kWorld, CommOp::kSend).nanos, 1'000);
  EXPECT_EQ(s.At(CommChannel::kWorld, CommOp::kAllReduce).elements, 1u);
  EXPECT_EQ(s.At(CommChannel::kTp, CommOp::kAllReduce).calls, 2u);
  EXPECT_EQ(s.At(CommChannel::kTp, CommOp::kAllReduce).elements, 12u);
  EXPECT_EQ(s.At(CommChannel::kTp, CommOp::kAllReduce).nanos, 4'000);
  EXPECT_EQ(s.At(CommChannel::kTp, CommOp::kSend).calls, 0u);
  EXPECT_EQ(s.At(CommChannel::kControl, CommOp::kSend).calls, 0u);
  // Summed over channels, and per channel.
  EXPECT_EQ(s[CommOp::kAllReduce].calls, 3u);
  EXPECT_EQ(s[CommOp::kAllReduce].elements, 13u);
  EXPECT_EQ(s.Total(CommChannel::kWorld).calls, 2u);
  EXPECT_EQ(s.Total(CommChannel::kTp).nanos, 4'000);
  EXPECT_EQ(s.Total(CommChannel::kResult).calls, 0u);
  EXPECT_EQ(s.Total().calls, 4u);
}

TEST(MeteredCommunicatorTest, SinceSubtractsPerKind) {
  Fixture f;
  float a[10] = {};
  ASSERT_TRUE(f.comm->AllReduceSum(a, 10).ok());
  const CommSnapshot before = f.meter.Snapshot();
  ASSERT_TRUE(f.comm->AllReduceSum(a, 3).ok());
  ASSERT_TRUE(f.comm->Send(a, 2, 0).ok());
  const CommSnapshot d = f.meter.Snapshot().Since(before);
  EXPECT_EQ(d[CommOp::kAllReduce].calls, 1u);
  EXPECT_EQ(d[CommOp::kAllReduce].elements, 3u);
  EXPECT_EQ(d[CommOp::kSend].elements, 2u);
  EXPECT_EQ(d.Total().calls, 2u);
}

// Snapshot() from another thread while writers record (a pipeline head records from three
// threads): every counter read is one a writer stored (never torn), and the final read sees
// every call.
TEST(MeteredCommunicatorTest, SnapshotWhileThreadsRecord) {
  CommMeter meter;
  constexpr int kCalls = 20000;
  constexpr int kWriters = 3;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) meter.Record(CommChannel::kTp, CommOp::kAllReduce, 3, 7);
    });
  }
  uint64_t last_calls = 0;
  for (int i = 0; i < 1000; ++i) {
    const CommOpTotals t = meter.Snapshot().At(CommChannel::kTp, CommOp::kAllReduce);
    EXPECT_GE(t.calls, last_calls);
    EXPECT_EQ(t.elements % 3, 0u);
    EXPECT_EQ(t.nanos % 7, 0);
    last_calls = t.calls;
  }
  for (std::thread& w : writers) w.join();
  const CommOpTotals t = meter.Snapshot().At(CommChannel::kTp, CommOp::kAllReduce);
  EXPECT_EQ(t.calls, static_cast<uint64_t>(kWriters * kCalls));
  EXPECT_EQ(t.elements, 3u * kWriters * kCalls);
  EXPECT_EQ(t.nanos, 7 * kWriters * kCalls);
  EXPECT_EQ(meter.Snapshot().Total().calls, static_cast<uint64_t>(kWriters * kCalls));
}

TEST(MeteredCommunicatorTest, Names) {
  EXPECT_EQ(CommOpName(CommOp::kAllReduce), "all_reduce");
  EXPECT_EQ(CommOpName(CommOp::kSendRecv), "sendrecv");
  EXPECT_EQ(CommOpName(CommOp::kBarrier), "barrier");
  EXPECT_EQ(CommChannelName(CommChannel::kWorld), "world");
  EXPECT_EQ(CommChannelName(CommChannel::kResult), "result");
}

}  // namespace
}  // namespace glm::engine
