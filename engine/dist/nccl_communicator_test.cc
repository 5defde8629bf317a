// NcclCommunicator against a fake libnccl (testdata/fake_nccl_group.cc) reached only through
// dlopen + a FunctionTable: this binary does not link any NCCL, so every call the tests observe
// went through the table.
#include "engine/dist/nccl_communicator.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "engine/dist/in_process_rendezvous.h"
#include "engine/dist/testdata/nccl_table_dlopen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine {
namespace {

using ::testing::HasSubstr;

// The fake library, opened once for the process.
struct Fake {
  testing::DlopenedNccl lib;
  void* (*stream_create)() = nullptr;
  void (*stream_destroy)(void*) = nullptr;
  int (*stream_query)(void*) = nullptr;
  int* calls = nullptr;
  int* group_calls = nullptr;
  int* init_calls = nullptr;         // ncclCommInitRank
  int* init_config_calls = nullptr;  // ncclCommInitRankConfig
  int* aborts = nullptr;             // ncclCommAbort
};

const Fake& GetFake() {
  static Fake* fake = [] {
    auto* f = new Fake;
    auto lib = testing::DlopenNccl(GLM_FAKE_NCCL_GROUP);
    EXPECT_TRUE(lib.ok()) << lib.status();
    if (!lib.ok()) return f;
    f->lib = *lib;
    f->stream_create = reinterpret_cast<void* (*)()>(dlsym(f->lib.handle, "fake_nccl_stream_create"));
    f->stream_destroy =
        reinterpret_cast<void (*)(void*)>(dlsym(f->lib.handle, "fake_nccl_stream_destroy"));
    f->stream_query = reinterpret_cast<int (*)(void*)>(dlsym(f->lib.handle, "fake_nccl_stream_query"));
    f->calls = static_cast<int*>(dlsym(f->lib.handle, "fake_nccl_calls"));
    f->group_calls = static_cast<int*>(dlsym(f->lib.handle, "fake_nccl_group_calls"));
    f->init_calls = static_cast<int*>(dlsym(f->lib.handle, "fake_nccl_init_calls"));
    f->init_config_calls = static_cast<int*>(dlsym(f->lib.handle, "fake_nccl_init_config_calls"));
    f->aborts = static_cast<int*>(dlsym(f->lib.handle, "fake_nccl_aborts"));
    return f;
  }();
  return *fake;
}

int Load(int* counter) { return __atomic_load_n(counter, __ATOMIC_SEQ_CST); }

// A DeviceStream over the fake's streams (cudaStreamQuery's role).
class FakeStream : public DeviceStream {
 public:
  FakeStream() : stream_(GetFake().stream_create()) {}
  ~FakeStream() override { GetFake().stream_destroy(stream_); }
  nccl::Stream handle() const override { return stream_; }
  absl::StatusOr<bool> Query() override { return GetFake().stream_query(stream_) == 1; }

 private:
  void* stream_;
};

std::string UniquePrefix() {
  static std::atomic<int> next{0};
  return "nccl-test/group" + std::to_string(next++);
}

struct Group {
  std::vector<std::unique_ptr<FakeStream>> streams;
  std::vector<float> scratch;
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
};

// `n` ranks created in threads (init completes once all have joined).
std::unique_ptr<Group> MakeGroup(int n,
                                 const std::function<void(NcclCommunicatorOptions&)>& tweak = {},
                                 const nccl::FunctionTable& table = GetFake().lib.table) {
  auto g = std::make_unique<Group>();
  InProcessRendezvous rendezvous;
  std::string prefix = UniquePrefix();
  g->scratch.assign(n, 0.0f);
  g->comms.resize(n);
  for (int r = 0; r < n; ++r) g->streams.push_back(std::make_unique<FakeStream>());
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      NcclCommunicatorOptions options;
      options.rank = r;
      options.size = n;
      options.key_prefix = prefix;
      options.rendezvous_timeout = std::chrono::seconds(10);
      options.init_timeout = std::chrono::seconds(10);
      options.op_timeout = std::chrono::seconds(30);
      options.barrier_scratch = &g->scratch[r];
      if (tweak) tweak(options);
      auto comm = NcclCommunicator::Create(table, g->streams[r].get(), &rendezvous, options);
      statuses[r] = comm.status();
      if (comm.ok()) g->comms[r] = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  return g;
}

void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

std::vector<float> RandomData(int rank, size_t count) {
  std::mt19937 rng(99 + rank);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

class NcclAllReduceTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclAllReduceTest, GoesThroughTheTableAndSumsOnEveryRank) {
  const int n = GetParam();
  constexpr size_t kCount = 4099;
  const int inits_before = Load(GetFake().init_calls);
  const int config_inits_before = Load(GetFake().init_config_calls);
  auto g = MakeGroup(n);
  ASSERT_TRUE(g->comms[n - 1]);
  // Non-blocking init (the fake then returns ncclInProgress from every enqueue, and refuses a
  // call made before the previous one was polled to completion).
  EXPECT_EQ(Load(GetFake().init_config_calls) - config_inits_before, n);
  EXPECT_EQ(Load(GetFake().init_calls) - inits_before, 0);
  std::vector<std::vector<float>> data(n);
  for (int r = 0; r < n; ++r) data[r] = RandomData(r, kCount);
  std::vector<float> expected = data[0];
  for (int r = 1; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) expected[i] += data[r][i];
  }
  const int calls_before = Load(GetFake().calls);
  std::vector<absl::Status> issued(n), synced(n);
  OnRanks(n, [&](int r) {
    issued[r] = g->comms[r]->AllReduceSum(data[r].data(), kCount);
    synced[r] = g->comms[r]->Synchronize();
  });
  EXPECT_EQ(Load(GetFake().calls) - calls_before, n) << "one ncclAllReduce per rank, via the table";
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(issued[r].ok()) << issued[r];
    ASSERT_TRUE(synced[r].ok()) << synced[r];
    EXPECT_EQ(std::memcmp(data[r].data(), expected.data(), kCount * sizeof(float)), 0)
        << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclAllReduceTest, ::testing::Values(1, 2, 4));

TEST(NcclCommunicatorTest, IssuedWorkIsAsynchronousUntilSynchronize) {
  auto g = MakeGroup(2);
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  ASSERT_TRUE(g->comms[0]->AllReduceSum(a.data(), a.size()).ok());
  // Rank 1 has not issued its part: the work is enqueued, not done.
  EXPECT_EQ(*g->streams[0]->Query(), false);
  EXPECT_EQ(a[0], 1.0f);
  ASSERT_TRUE(g->comms[1]->AllReduceSum(b.data(), b.size()).ok());
  ASSERT_TRUE(g->comms[0]->Synchronize().ok());
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_EQ(b[7], 3.0f);
}

TEST(NcclCommunicatorTest, EnqueuesInProgressArePolledBeforeTheNextCall) {
  // On a non-blocking communicator the fake returns ncclInProgress from each enqueue and fails
  // the next call (ncclInvalidUsage) unless ncclCommGetAsyncError was polled to ncclSuccess.
  auto g = MakeGroup(2);
  std::vector<std::vector<float>> data(2, std::vector<float>(4, 1.0f));
  std::vector<absl::Status> statuses(2);
  OnRanks(2, [&](int r) {
    absl::Status s;
    for (int i = 0; i < 3 && s.ok(); ++i) s = g->comms[r]->AllReduceSum(data[r].data(), 4);
    statuses[r] = s.ok() ? g->comms[r]->Synchronize() : s;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(data[r], std::vector<float>(4, 8.0f)) << "rank " << r;  // 1 -> 2 -> 4 -> 8
  }
}

TEST(NcclCommunicatorTest, SendRecvRingIsGroupedAndDelivers) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = 1000;
  auto g = MakeGroup(kRanks);
  std::vector<std::vector<float>> out(kRanks), in(kRanks, std::vector<float>(kCount));
  for (int r = 0; r < kRanks; ++r) out[r] = RandomData(r, kCount);
  const int groups_before = Load(GetFake().group_calls);
  std::vector<absl::Status> statuses(kRanks);
  OnRanks(kRanks, [&](int r) {
    absl::Status s = g->comms[r]->SendRecv(out[r].data(), kCount, (r + 1) % kRanks, in[r].data(),
                                           kCount, (r + kRanks - 1) % kRanks);
    statuses[r] = s.ok() ? g->comms[r]->Synchronize() : s;
  });
  EXPECT_EQ(Load(GetFake().group_calls) - groups_before, kRanks) << "ncclGroupStart per SendRecv";
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(in[r], out[(r + kRanks - 1) % kRanks]) << "rank " << r;
  }
}

TEST(NcclCommunicatorTest, SendRecvBroadcastAndBarrier) {
  auto g = MakeGroup(3);
  std::vector<float> sent = RandomData(0, 64), got(64);
  std::vector<std::vector<float>> bcast(3);
  for (int r = 0; r < 3; ++r) bcast[r] = RandomData(10 + r, 32);
  std::vector<float> root_data = bcast[1];
  std::vector<absl::Status> statuses(3);
  OnRanks(3, [&](int r) {
    absl::Status s;
    if (r == 0) s = g->comms[0]->Send(sent.data(), sent.size(), 2);
    if (r == 2) s = g->comms[2]->Recv(got.data(), got.size(), 0);
    if (s.ok()) s = g->comms[r]->Broadcast(bcast[r].data(), 32, 1);
    if (s.ok()) s = g->comms[r]->Barrier();
    statuses[r] = s;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(bcast[r], root_data) << "rank " << r;
  }
  EXPECT_EQ(got, sent);
}

TEST(NcclCommunicatorTest, APeerThatAbortsFailsTheOthersFastWithTheNcclError) {
  constexpr int kRanks = 4;
  // Rank 3 gives up quickly on a send nobody receives and aborts its communicator, as a rank
  // whose process is failing does; the others would wait 60 s.
  auto g = MakeGroup(kRanks, [](NcclCommunicatorOptions& o) {
    o.op_timeout = o.rank == 3 ? std::chrono::milliseconds(100) : std::chrono::seconds(60);
  });
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(16, 1.0f));
  std::vector<absl::Status> statuses(kRanks);
  auto start = std::chrono::steady_clock::now();
  OnRanks(kRanks, [&](int r) {
    absl::Status s = r == 3 ? g->comms[r]->Send(data[r].data(), 16, 0)
                            : g->comms[r]->AllReduceSum(data[r].data(), 16);
    statuses[r] = s.ok() ? g->comms[r]->Synchronize() : s;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(statuses[3].code(), absl::StatusCode::kDeadlineExceeded) << statuses[3];
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kUnavailable) << statuses[r];
    EXPECT_THAT(statuses[r].message(), HasSubstr("ncclRemoteError"));
    EXPECT_THAT(statuses[r].message(), HasSubstr("group must be restarted"));
    float x = 0;
    EXPECT_EQ(g->comms[r]->AllReduceSum(&x, 1).code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(NcclCommunicatorTest, ASilentPeerFailsTheOthersAfterTheTimeout) {
  constexpr int kRanks = 3;
  auto g = MakeGroup(kRanks, [](NcclCommunicatorOptions& o) {
    o.op_timeout = std::chrono::milliseconds(200);
  });
  std::vector<absl::Status> statuses(kRanks);
  auto start = std::chrono::steady_clock::now();
  OnRanks(kRanks - 1, [&](int r) {  // Rank 2 never issues its part.
    std::vector<float> v(16, 1.0f);
    absl::Status s = g->comms[r]->AllReduceSum(v.data(), v.size());
    statuses[r] = s.ok() ? g->comms[r]->Synchronize() : s;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  int timed_out = 0;
  for (int r = 0; r < kRanks - 1; ++r) {
    // The first to time out aborts, which the other may see as ncclRemoteError first.
    EXPECT_THAT(statuses[r].code(), ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded,
                                                     absl::StatusCode::kUnavailable))
        << statuses[r];
    if (statuses[r].code() == absl::StatusCode::kDeadlineExceeded) {
      ++timed_out;
      EXPECT_THAT(statuses[r].message(), HasSubstr("did not complete within 200 ms"));
    }
  }
  EXPECT_GE(timed_out, 1);
}

TEST(NcclCommunicatorTest, APeerThatNeverJoinsFailsInitWithinInitTimeout) {
  // Rank 2 of 3 never calls Create (its process died before init). The fake's bootstrap would
  // give up after 10 s (NCCL's after minutes); init_timeout ends it after 1 s.
  constexpr int kRanks = 3, kJoined = 2;
  constexpr auto kInitTimeout = std::chrono::milliseconds(1000);
  InProcessRendezvous rendezvous;
  const std::string prefix = UniquePrefix();
  std::vector<std::unique_ptr<FakeStream>> streams;
  for (int r = 0; r < kJoined; ++r) streams.push_back(std::make_unique<FakeStream>());
  const int aborts_before = Load(GetFake().aborts);
  std::vector<absl::Status> statuses(kJoined);
  const auto start = std::chrono::steady_clock::now();
  OnRanks(kJoined, [&](int r) {
    NcclCommunicatorOptions options;
    options.rank = r;
    options.size = kRanks;
    options.key_prefix = prefix;
    options.rendezvous_timeout = std::chrono::seconds(10);
    options.init_timeout = kInitTimeout;
    statuses[r] =
        NcclCommunicator::Create(GetFake().lib.table, streams[r].get(), &rendezvous, options)
            .status();
  });
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, kInitTimeout);
  EXPECT_LT(took, std::chrono::seconds(5)) << "well before the bootstrap's 10 s";
  for (int r = 0; r < kJoined; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kDeadlineExceeded) << statuses[r];
    EXPECT_THAT(statuses[r].message(), HasSubstr("NCCL rank " + std::to_string(r) + " of 3"));
    EXPECT_THAT(statuses[r].message(), HasSubstr("within 1000 ms"));
    EXPECT_THAT(statuses[r].message(), HasSubstr("a peer never joined NCCL's bootstrap"));
  }
  EXPECT_EQ(Load(GetFake().aborts) - aborts_before, kJoined) << "each half-made comm aborted";
}

TEST(NcclCommunicatorTest, AnInitErrorIsUnavailableNamingTheNcclError) {
  // The two ranks disagree on the group size: whichever joins NCCL's group second gets
  // ncclInvalidUsage from ncclCommInitRankConfig; the first then waits out its init_timeout.
  InProcessRendezvous rendezvous;
  const std::string prefix = UniquePrefix();
  FakeStream s0, s1;
  std::vector<absl::Status> statuses(2);
  OnRanks(2, [&](int r) {
    NcclCommunicatorOptions options;
    options.rank = r;
    options.size = r == 0 ? 2 : 3;
    options.key_prefix = prefix;
    options.init_timeout = std::chrono::milliseconds(200);
    statuses[r] =
        NcclCommunicator::Create(GetFake().lib.table, r == 0 ? &s0 : &s1, &rendezvous, options)
            .status();
  });
  int unavailable = 0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(statuses[r].ok()) << "rank " << r;
    if (statuses[r].code() == absl::StatusCode::kUnavailable) {
      ++unavailable;
      EXPECT_THAT(statuses[r].message(), HasSubstr("ncclCommInitRankConfig failed on rank"));
      EXPECT_THAT(statuses[r].message(), HasSubstr("ncclInvalidUsage"));
    } else {
      EXPECT_EQ(statuses[r].code(), absl::StatusCode::kDeadlineExceeded) << statuses[r];
    }
  }
  EXPECT_EQ(unavailable, 1);
}

TEST(NcclCommunicatorTest, WithoutInitRankConfigInitIsTheBlockingOne) {
  // NCCL < 2.14: the loader leaves CommInitRankConfig null; init is ncclCommInitRank.
  nccl::FunctionTable table = GetFake().lib.table;
  table.CommInitRankConfig = nullptr;
  const int inits_before = Load(GetFake().init_calls);
  const int config_inits_before = Load(GetFake().init_config_calls);
  auto g = MakeGroup(2, {}, table);
  ASSERT_TRUE(g->comms[0] && g->comms[1]);
  EXPECT_EQ(Load(GetFake().init_calls) - inits_before, 2);
  EXPECT_EQ(Load(GetFake().init_config_calls) - config_inits_before, 0);
  std::vector<float> a(5, 1.0f), b(5, 4.0f);
  std::vector<absl::Status> statuses(2);
  OnRanks(2, [&](int r) {
    std::vector<float>& v = r == 0 ? a : b;
    absl::Status s = g->comms[r]->AllReduceSum(v.data(), v.size());
    statuses[r] = s.ok() ? g->comms[r]->Synchronize() : s;
  });
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r];
  EXPECT_EQ(a, std::vector<float>(5, 5.0f));
  EXPECT_EQ(b, std::vector<float>(5, 5.0f));
}

TEST(NcclCommunicatorTest, ARankWithoutRankZeroFailsAtRendezvous) {
  InProcessRendezvous rendezvous;
  FakeStream stream;
  NcclCommunicatorOptions options;
  options.rank = 1;
  options.size = 2;
  options.key_prefix = UniquePrefix();
  options.rendezvous_timeout = std::chrono::milliseconds(100);
  auto comm = NcclCommunicator::Create(GetFake().lib.table, &stream, &rendezvous, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(comm.status().message(), HasSubstr("rank 0's NCCL unique id"));
}

TEST(NcclCommunicatorTest, RejectsBadOptionsAndAnIncompleteTable) {
  InProcessRendezvous rendezvous;
  FakeStream stream;
  NcclCommunicatorOptions options;
  options.rank = 3;
  options.size = 2;
  EXPECT_EQ(NcclCommunicator::Create(GetFake().lib.table, &stream, &rendezvous, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  nccl::FunctionTable empty{};
  auto comm = NcclCommunicator::Create(empty, &stream, &rendezvous, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(comm.status().message(), HasSubstr("NcclLibrary::Load"));
}

}  // namespace
}  // namespace glm::engine
