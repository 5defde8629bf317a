#include "engine/dist/tcp_communicator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/dist/in_process_rendezvous.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

using ::testing::HasSubstr;
using Comms = std::vector<std::unique_ptr<TcpCommunicator>>;

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
      TcpCommunicatorOptions options;
      options.rank = r;
      options.size = n;
      options.key_prefix = prefix;
      options.connect_timeout = std::chrono::seconds(20);
      options.op_timeout = op_timeout;
      auto comm = TcpCommunicator::Create(&rendezvous, options);
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

TEST_P(AllReduceTest, EqualsTheSerialSumBitForBitOnEveryRank) {
  auto [n, count] = GetParam();
  Comms comms = MakeGroup(n);
  ASSERT_TRUE(comms[n - 1]);
  std::vector<std::vector<float>> data(n);
  for (int r = 0; r < n; ++r) data[r] = RandomData(r, count);
  // The serial loop every rank's result must equal exactly: ((x0 + x1) + x2) + ...
  std::vector<float> expected = data[0];
  for (int r = 1; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) expected[i] += data[r][i];
  }
  std::vector<absl::Status> statuses(n);
  OnRanks(n, [&](int r) { statuses[r] = comms[r]->AllReduceSum(data[r].data(), count); });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(std::memcmp(data[r].data(), expected.data(), count * sizeof(float)), 0)
        << "rank " << r << " differs from the serial sum";
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndCounts, AllReduceTest,
                         ::testing::Combine(::testing::Values(2, 4),
                                            // Fewer elements than ranks, uneven chunks, and
                                            // more than a socket buffer.
                                            ::testing::Values(size_t{1}, size_t{3}, size_t{1001},
                                                              size_t{300'007})));

TEST(TcpCommunicatorTest, SingleRankNeedsNoPeers) {
  Comms comms = MakeGroup(1);
  std::vector<float> v = {1, 2, 3};
  ASSERT_TRUE(comms[0]->AllReduceSum(v.data(), v.size()).ok());
  EXPECT_THAT(v, ::testing::ElementsAre(1, 2, 3));
  EXPECT_TRUE(comms[0]->Barrier().ok());
}

TEST(TcpCommunicatorTest, SendAndRecvBetweenTwoRanks) {
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

TEST(TcpCommunicatorTest, RingSendRecvOfLargeBuffersDoesNotDeadlock) {
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

TEST(TcpCommunicatorTest, BroadcastFromANonZeroRootAndBarrier) {
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

TEST(TcpCommunicatorTest, MismatchedCountsFailNamingBothInsteadOfCorrupting) {
  Comms comms = MakeGroup(2, std::chrono::seconds(5));
  std::vector<float> a(10, 1.0f), b(12, 1.0f);
  absl::Status s0, s1;
  OnRanks(2, [&](int r) {
    if (r == 0) s0 = comms[0]->AllReduceSum(a.data(), a.size());
    if (r == 1) s1 = comms[1]->AllReduceSum(b.data(), b.size());
  });
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  std::string both = std::string(s0.message()) + " | " + std::string(s1.message());
  EXPECT_THAT(both, HasSubstr("issued different collectives")) << both;
}

TEST(TcpCommunicatorTest, ARankThatDiesFailsTheOthersAtOnceNotAtTheTimeout) {
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
    EXPECT_THAT(statuses[r].message(), HasSubstr("closed the connection during AllReduceSum"));
    EXPECT_THAT(statuses[r].message(), HasSubstr("group must be restarted"));
    someone_named_rank3 |= absl::StrContains(statuses[r].message(), "rank 3 closed");
    // Poisoned: the next call reports the first error instead of touching the sockets.
    std::vector<float> v(4);
    absl::Status again = comms[r]->AllReduceSum(v.data(), v.size());
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_THAT(again.message(), HasSubstr("failed earlier"));
  }
  EXPECT_TRUE(someone_named_rank3);
}

TEST(TcpCommunicatorTest, ASilentRankFailsTheOthersAfterTheTimeout) {
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
  for (int r = 0; r < kRanks - 1; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kDeadlineExceeded) << statuses[r];
    EXPECT_THAT(statuses[r].message(), HasSubstr("waiting on rank(s) [3]"));
  }
}

TEST(TcpCommunicatorTest, SetupFailsWithinTheTimeoutWhenAPeerNeverStarts) {
  InProcessRendezvous rendezvous;
  TcpCommunicatorOptions options;
  options.rank = 1;
  options.size = 2;
  options.key_prefix = UniquePrefix();
  options.connect_timeout = std::chrono::milliseconds(200);
  auto start = std::chrono::steady_clock::now();
  auto comm = TcpCommunicator::Create(&rendezvous, options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(comm.status().message(), HasSubstr("address of rank 0"));
  EXPECT_THAT(comm.status().message(), HasSubstr("rank 1 of 2"));
}

TEST(TcpCommunicatorTest, AStrayConnectionDoesNotBreakSetup) {
  InProcessRendezvous rendezvous;
  std::string prefix = UniquePrefix();
  auto options = [&](int rank) {
    TcpCommunicatorOptions o;
    o.rank = rank;
    o.size = 2;
    o.key_prefix = prefix;
    o.connect_timeout = std::chrono::seconds(20);
    return o;
  };
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> rank0 = absl::UnknownError("not run");
  std::thread t0([&] { rank0 = TcpCommunicator::Create(&rendezvous, options(0)); });
  // Something else connects to rank 0 first and sends 16 bytes that are not a hello.
  auto address = rendezvous.Get(prefix + "/tcp/0", std::chrono::seconds(20));
  ASSERT_TRUE(address.ok()) << address.status();
  int stray = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address->substr(address->find(':') + 1))));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::connect(stray, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  char junk[16] = "GET / HTTP/1.0";
  ASSERT_EQ(::send(stray, junk, sizeof(junk), 0), 16);
  auto rank1 = TcpCommunicator::Create(&rendezvous, options(1));
  t0.join();
  ::close(stray);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  float a = 1, b = 2;
  absl::Status s0;
  std::thread t([&] { s0 = (*rank0)->AllReduceSum(&a, 1); });
  ASSERT_TRUE((*rank1)->AllReduceSum(&b, 1).ok());
  t.join();
  ASSERT_TRUE(s0.ok()) << s0;
  EXPECT_EQ(a, 3.0f);
  EXPECT_EQ(b, 3.0f);
}

TEST(TcpCommunicatorTest, RejectsBadRanksAndPeers) {
  InProcessRendezvous rendezvous;
  TcpCommunicatorOptions options;
  options.rank = 2;
  options.size = 2;
  EXPECT_EQ(TcpCommunicator::Create(&rendezvous, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  Comms comms = MakeGroup(2);
  float x = 0;
  EXPECT_EQ(comms[0]->Send(&x, 1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Recv(&x, 1, 5).code(), absl::StatusCode::kInvalidArgument);
}

// A figure, not an assertion: all-reduce bandwidth of 4 ranks over loopback on this machine.
TEST(TcpCommunicatorBench, AllReduceFourRanksLoopback) {
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
    std::printf("tcp allreduce ranks=%d bytes=%.0f KiB  time=%.3f ms  algbw=%.2f GB/s  "
                "busbw=%.2f GB/s\n",
                kRanks, bytes / 1024, t * 1e3, algbw, algbw * 2.0 * (kRanks - 1) / kRanks);
  }
}

}  // namespace
}  // namespace glm::engine
