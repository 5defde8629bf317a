#include "engine/dist/gloo_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/dist/in_process_rendezvous.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

using ::testing::HasSubstr;
using Comms = std::vector<std::unique_ptr<GlooCommunicator>>;

std::string UniquePrefix() {
  static std::atomic<int> next{0};
  return "test/group" + std::to_string(next++);
}

// Creates `n` ranks in threads (setup needs them all at once) on 127.0.0.1, port 0.
Comms MakeGroup(int n, std::chrono::milliseconds op_timeout = std::chrono::seconds(30)) {
  InProcessRendezvous rendezvous;
  std::string prefix = UniquePrefix();
  Comms comms(n);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GlooCommunicatorOptions options;
      options.rank = r;
      options.size = n;
      options.key_prefix = prefix;
      options.connect_timeout = std::chrono::seconds(20);
      options.op_timeout = op_timeout;
      auto comm = GlooCommunicator::Create(&rendezvous, options);
      statuses[r] = comm.status();
      if (comm.ok()) comms[r] = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  return comms;
}

// Runs fn(rank) on one thread per rank and waits for all.
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

std::vector<float> RandomData(int rank, size_t count) {
  std::mt19937 rng(1234 + rank);
  std::uniform_real_distribution<float> dist(-10.0f, 10.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

class AllReduceTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(AllReduceTest, BitIdenticalOnEveryRankAndEqualToTheSerialSum) {
  auto [n, count] = GetParam();
  Comms comms = MakeGroup(n);
  ASSERT_TRUE(comms[n - 1]);
  std::vector<std::vector<float>> data(n);
  for (int r = 0; r < n; ++r) data[r] = RandomData(r, count);
  // The serial loop ((x0 + x1) + x2) + ...; the ring sums in another order, so results agree
  // with it up to rounding (bounded by (n - 1) ulps of the sum of magnitudes).
  std::vector<float> expected = data[0], magnitude(count);
  for (size_t i = 0; i < count; ++i) magnitude[i] = std::fabs(data[0][i]);
  for (int r = 1; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      expected[i] += data[r][i];
      magnitude[i] += std::fabs(data[r][i]);
    }
  }
  std::vector<absl::Status> statuses(n);
  OnRanks(n, [&](int r) { statuses[r] = comms[r]->AllReduceSum(data[r].data(), count); });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(std::memcmp(data[r].data(), data[0].data(), count * sizeof(float)), 0)
        << "rank " << r << " differs from rank 0";
  }
  size_t off = 0;
  for (size_t i = 0; i < count; ++i) {
    float bound = static_cast<float>(n) * std::numeric_limits<float>::epsilon() * magnitude[i];
    if (std::fabs(data[0][i] - expected[i]) > bound) ++off;
  }
  EXPECT_EQ(off, 0u) << "elements further from the serial sum than rounding allows";

  // Small integers sum exactly in any order: the result is the serial sum bit for bit.
  std::vector<std::vector<float>> ints(n, std::vector<float>(count));
  std::vector<float> int_sum(count, 0.0f);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      ints[r][i] = static_cast<float>(static_cast<int>((i * 7 + r * 13) % 101) - 50);
      int_sum[i] += ints[r][i];
    }
  }
  OnRanks(n, [&](int r) { statuses[r] = comms[r]->AllReduceSum(ints[r].data(), count); });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(ints[r], int_sum) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndCounts, AllReduceTest,
                         ::testing::Combine(::testing::Values(2, 4),
                                            // Fewer elements than ranks, uneven chunks, and
                                            // more than Gloo's 1 MiB segment.
                                            ::testing::Values(size_t{1}, size_t{3}, size_t{1001},
                                                              size_t{300'007})));

TEST(GlooCommunicatorTest, SingleRankNeedsNoPeers) {
  Comms comms = MakeGroup(1);
  std::vector<float> v = {1, 2, 3};
  ASSERT_TRUE(comms[0]->AllReduceSum(v.data(), v.size()).ok());
  EXPECT_THAT(v, ::testing::ElementsAre(1, 2, 3));
  EXPECT_TRUE(comms[0]->Barrier().ok());
}

TEST(GlooCommunicatorTest, SendAndRecvBetweenTwoRanks) {
  Comms comms = MakeGroup(2);
  std::vector<float> sent = RandomData(0, 5000), got(5000, 0.0f);
  absl::Status s0, s1;
  OnRanks(2, [&](int r) {
    if (r == 0) s0 = comms[0]->Send(sent.data(), sent.size(), 1);
    if (r == 1) s1 = comms[1]->Recv(got.data(), got.size(), 0);
  });
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(got, sent);
}

TEST(GlooCommunicatorTest, RingSendRecvOfLargeBuffersDoesNotDeadlock) {
  // Every rank sends 4 MiB to the next while receiving from the previous: with blocking sends in
  // sequence this deadlocks once the socket buffers fill.
  constexpr int kRanks = 4;
  constexpr size_t kCount = 1 << 20;
  Comms comms = MakeGroup(kRanks);
  std::vector<std::vector<float>> out(kRanks), in(kRanks, std::vector<float>(kCount));
  for (int r = 0; r < kRanks; ++r) out[r] = RandomData(r, kCount);
  std::vector<absl::Status> statuses(kRanks);
  OnRanks(kRanks, [&](int r) {
    statuses[r] = comms[r]->SendRecv(out[r].data(), kCount, (r + 1) % kRanks, in[r].data(),
                                     kCount, (r + kRanks - 1) % kRanks);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(in[r], out[(r + kRanks - 1) % kRanks]) << "rank " << r;
  }
}

TEST(GlooCommunicatorTest, SendRecvRingWithSeparateCallsAndRepeatedCounts) {
  // Each rank passes a buffer to the next with Send and Recv (even ranks send first, odd ranks
  // receive first, so the blocking calls pair up), three rounds with the same count: messages of
  // equal size between the same ranks arrive in order.
  constexpr int kRanks = 4;
  constexpr size_t kCount = 4099;
  Comms comms = MakeGroup(kRanks);
  std::vector<std::vector<std::vector<float>>> got(
      kRanks, std::vector<std::vector<float>>(3, std::vector<float>(kCount)));
  std::vector<absl::Status> statuses(kRanks);
  OnRanks(kRanks, [&](int r) {
    const int next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
    for (int round = 0; round < 3 && statuses[r].ok(); ++round) {
      std::vector<float> mine = RandomData(r * 10 + round, kCount);
      if (r % 2 == 0) {
        statuses[r] = comms[r]->Send(mine.data(), kCount, next);
        if (statuses[r].ok()) statuses[r] = comms[r]->Recv(got[r][round].data(), kCount, prev);
      } else {
        statuses[r] = comms[r]->Recv(got[r][round].data(), kCount, prev);
        if (statuses[r].ok()) statuses[r] = comms[r]->Send(mine.data(), kCount, next);
      }
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    const int prev = (r + kRanks - 1) % kRanks;
    for (int round = 0; round < 3; ++round) {
      EXPECT_EQ(got[r][round], RandomData(prev * 10 + round, kCount))
          << "rank " << r << " round " << round;
    }
  }
}

TEST(GlooCommunicatorTest, BroadcastFromANonZeroRootAndBarrier) {
  constexpr int kRanks = 4;
  Comms comms = MakeGroup(kRanks);
  std::vector<std::vector<float>> data(kRanks);
  for (int r = 0; r < kRanks; ++r) data[r] = RandomData(r, 777);
  std::vector<float> root_data = data[2];
  std::vector<absl::Status> statuses(kRanks), barriers(kRanks);
  OnRanks(kRanks, [&](int r) {
    statuses[r] = comms[r]->Broadcast(data[r].data(), 777, 2);
    barriers[r] = comms[r]->Barrier();
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    ASSERT_TRUE(barriers[r].ok()) << barriers[r];
    EXPECT_EQ(data[r], root_data) << "rank " << r;
  }
}

TEST(GlooCommunicatorTest, MismatchedAllReduceCountsFailInsteadOfCorrupting) {
  Comms comms = MakeGroup(2, /*op_timeout=*/std::chrono::milliseconds(500));
  std::vector<float> a(10, 1.0f), b(12, 1.0f);
  absl::Status s0, s1;
  auto start = std::chrono::steady_clock::now();
  OnRanks(2, [&](int r) {
    if (r == 0) s0 = comms[0]->AllReduceSum(a.data(), a.size());
    if (r == 1) s1 = comms[1]->AllReduceSum(b.data(), b.size());
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  EXPECT_EQ(a, std::vector<float>(10, 1.0f)) << "rank 0's data changed";
  EXPECT_EQ(b, std::vector<float>(12, 1.0f)) << "rank 1's data changed";
  std::string both = std::string(s0.message()) + " | " + std::string(s1.message());
  EXPECT_THAT(both, HasSubstr("issued different operations or counts")) << both;
  EXPECT_THAT(both, HasSubstr("AllReduceSum on rank")) << both;
}

TEST(GlooCommunicatorTest, MismatchedSendAndRecvCountsFailInsteadOfCorrupting) {
  Comms comms = MakeGroup(2, /*op_timeout=*/std::chrono::milliseconds(500));
  std::vector<float> sent(12, 7.0f), got(10, 0.0f);
  absl::Status s0, s1;
  OnRanks(2, [&](int r) {
    if (r == 0) s0 = comms[0]->Send(sent.data(), sent.size(), 1);
    if (r == 1) s1 = comms[1]->Recv(got.data(), got.size(), 0);
  });
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  EXPECT_EQ(got, std::vector<float>(10, 0.0f)) << "the receiver's buffer was written";
  std::string both = std::string(s0.message()) + " | " + std::string(s1.message());
  EXPECT_THAT(both, ::testing::AnyOf(HasSubstr("Send on rank 0 of 2 (to rank 1)"),
                                     HasSubstr("Recv on rank 1 of 2 (from rank 0)")))
      << both;
}

TEST(GlooCommunicatorTest, ARankThatDiesFailsTheOthersAtOnceNotAtTheTimeout) {
  constexpr int kRanks = 4;
  Comms comms = MakeGroup(kRanks, /*op_timeout=*/std::chrono::seconds(60));
  comms[3].reset();  // Its process exits: every connection to it closes.
  std::vector<absl::Status> statuses(kRanks);
  auto start = std::chrono::steady_clock::now();
  OnRanks(kRanks - 1, [&](int r) {
    std::vector<float> v(1000, 1.0f);
    statuses[r] = comms[r]->AllReduceSum(v.data(), v.size());
  });
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(10)) << "failure waited for the 60 s timeout";
  bool someone_named_rank3 = false;
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kUnavailable) << statuses[r];
    EXPECT_THAT(statuses[r].message(),
                HasSubstr(absl::StrCat("AllReduceSum on rank ", r, " of 4")));
    EXPECT_THAT(statuses[r].message(), HasSubstr("group must be restarted"));
    someone_named_rank3 |=
        absl::StrContains(statuses[r].message(), "the connection to rank(s) [3] failed");
    // Poisoned: the next call reports the first error instead of touching the connections.
    std::vector<float> v(4);
    absl::Status again = comms[r]->AllReduceSum(v.data(), v.size());
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_THAT(again.message(), HasSubstr("failed earlier"));
    EXPECT_THAT(again.message(), HasSubstr(statuses[r].message()));
    EXPECT_EQ(comms[r]->Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(someone_named_rank3) << statuses[0] << "\n" << statuses[1] << "\n" << statuses[2];
}

TEST(GlooCommunicatorTest, ASilentRankFailsTheOthersAfterTheTimeout) {
  constexpr int kRanks = 4;
  Comms comms = MakeGroup(kRanks, /*op_timeout=*/std::chrono::milliseconds(300));
  std::vector<absl::Status> statuses(kRanks);
  auto start = std::chrono::steady_clock::now();
  OnRanks(kRanks - 1, [&](int r) {  // Rank 3 stays connected but never joins the all-reduce.
    std::vector<float> v(1000, 1.0f);
    statuses[r] = comms[r]->AllReduceSum(v.data(), v.size());
  });
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(10));
  // The first rank to time out closes its connections, so the others may see that first.
  int timed_out = 0;
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_THAT(statuses[r].code(), ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded,
                                                     absl::StatusCode::kUnavailable))
        << statuses[r];
    if (statuses[r].code() == absl::StatusCode::kDeadlineExceeded) {
      ++timed_out;
      EXPECT_THAT(statuses[r].message(), HasSubstr("no progress for 300 ms"));
    }
  }
  EXPECT_GE(timed_out, 1);
  // The silent rank finds the group closed when it finally calls.
  std::vector<float> v(1000, 1.0f);
  absl::Status late = comms[3]->AllReduceSum(v.data(), v.size());
  EXPECT_FALSE(late.ok());
}

TEST(GlooCommunicatorTest, SetupFailsWithinTheTimeoutWhenAPeerNeverStarts) {
  for (int rank : {0, 1}) {
    InProcessRendezvous rendezvous;
    GlooCommunicatorOptions options;
    options.rank = rank;
    options.size = 2;
    options.key_prefix = UniquePrefix();
    options.connect_timeout = std::chrono::milliseconds(200);
    auto start = std::chrono::steady_clock::now();
    auto comm = GlooCommunicator::Create(&rendezvous, options);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
    EXPECT_THAT(comm.status().message(), HasSubstr(absl::StrCat("of rank ", 1 - rank)));
    EXPECT_THAT(comm.status().message(), HasSubstr(absl::StrCat("rank ", rank, " of 2")));
  }
}

TEST(GlooCommunicatorTest, RejectsBadRanksPeersAndHosts) {
  InProcessRendezvous rendezvous;
  GlooCommunicatorOptions options;
  options.rank = 2;
  options.size = 2;
  EXPECT_EQ(GlooCommunicator::Create(&rendezvous, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  options.host = "localhost";
  auto named = GlooCommunicator::Create(&rendezvous, options);
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(named.status().message(), HasSubstr("not a numeric IP"));
  options.host = "192.0.2.1";  // TEST-NET-1: not an address of this machine.
  options.key_prefix = UniquePrefix();
  auto foreign = GlooCommunicator::Create(&rendezvous, options);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument) << foreign.status();
  EXPECT_THAT(foreign.status().message(), HasSubstr("is it an address of this node"));
  Comms comms = MakeGroup(2);
  float x = 0;
  EXPECT_EQ(comms[0]->Send(&x, 1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Recv(&x, 1, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Broadcast(&x, 1, 2).code(), absl::StatusCode::kInvalidArgument);
  // Argument errors do not poison the group.
  EXPECT_TRUE(comms[0]->Synchronize().ok());
}

// A figure, not an assertion: all-reduce bandwidth of 4 ranks over loopback on this machine.
TEST(GlooCommunicatorBench, AllReduceFourRanksLoopback) {
  constexpr int kRanks = 4;
  Comms comms = MakeGroup(kRanks);
  for (size_t count : {size_t{1} << 16, size_t{1} << 20, size_t{1} << 23}) {
    std::vector<std::vector<float>> data(kRanks, std::vector<float>(count, 1.0f));
    const int iters = count >= (size_t{1} << 23) ? 3 : 10;
    std::vector<double> seconds(kRanks);
    OnRanks(kRanks, [&](int r) {
      ASSERT_TRUE(comms[r]->AllReduceSum(data[r].data(), count).ok());  // Warm-up.
      ASSERT_TRUE(comms[r]->Barrier().ok());
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) ASSERT_TRUE(comms[r]->AllReduceSum(data[r].data(), count).ok());
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    double t = *std::max_element(seconds.begin(), seconds.end()) / iters;
    double bytes = static_cast<double>(count) * sizeof(float);
    double algbw = bytes / t / 1e9;
    std::printf("gloo allreduce ranks=%d bytes=%.0f KiB  time=%.3f ms  algbw=%.2f GB/s  "
                "busbw=%.2f GB/s\n",
                kRanks, bytes / 1024, t * 1e3, algbw, algbw * 2.0 * (kRanks - 1) / kRanks);
  }
}

}  // namespace
}  // namespace glm::engine
