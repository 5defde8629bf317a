// The TP transport rule (tp_transport.h) as a pure function, its rendezvous record, and stage
// groups of two TP ranks formed over InProcessRendezvous (Gloo on 127.0.0.1): CPU ranks and ranks
// that share a GPU stay on Gloo with the reason published; ranks on distinct GPUs with NCCL get a
// NcclCommunicator, here over a fake libnccl reached through dlopen (testdata/fake_nccl_group.cc:
// host memory, fake streams) with a backend that claims device memory, so the model's TpGroup
// takes its device path, and a rank whose communicator dies fails the other's step at its
// TpGroup::Finish.
#include "engine/pipeline/tp_transport.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/dist/device_stream.h"
#include "engine/dist/in_process_rendezvous.h"
#include "engine/dist/nccl_communicator.h"
#include "engine/dist/testdata/nccl_table_dlopen.h"
#include "engine/model/tp.h"
#include "engine/pipeline/stage_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace glm::engine::pipeline {
namespace {

using ::testing::HasSubstr;

TpRankDevice Cuda(const std::string& uuid, int nccl = 23004) { return {"cuda", uuid, nccl}; }

TEST(ChooseTpTransportTest, AllRanksOnDistinctGpusWithNcclTakeNccl) {
  const TpTransportChoice c =
      ChooseTpTransport({Cuda("GPU-a"), Cuda("GPU-b"), Cuda("GPU-c"), Cuda("GPU-d")});
  EXPECT_TRUE(c.nccl());
  EXPECT_EQ(c.reason, "");
  EXPECT_EQ(c.Describe(), "nccl");
}

TEST(ChooseTpTransportTest, ACpuRankTakesGloo) {
  const TpTransportChoice c = ChooseTpTransport({Cuda("GPU-a"), {"cpu", "", 23004}});
  EXPECT_FALSE(c.nccl());
  EXPECT_EQ(c.Describe(), "gloo (rank 1 runs the cpu backend)");
  EXPECT_EQ(ChooseTpTransport({{"cpu", "", 0}, {"cpu", "", 0}}).Describe(),
            "gloo (rank 0 runs the cpu backend)");
}

TEST(ChooseTpTransportTest, ARankWithoutNcclTakesTheHostPath) {
  const TpTransportChoice c = ChooseTpTransport({Cuda("GPU-a"), Cuda("GPU-b", 0)});
  EXPECT_FALSE(c.nccl());
  EXPECT_EQ(c.Describe(), "gloo (host path: rank 1 has no NCCL library loaded)");
}

TEST(ChooseTpTransportTest, RanksSharingAGpuTakeTheHostPath) {
  const TpTransportChoice c =
      ChooseTpTransport({Cuda("GPU-a"), Cuda("GPU-b"), Cuda("GPU-c"), Cuda("GPU-b")});
  EXPECT_FALSE(c.nccl());
  EXPECT_EQ(c.Describe(), "gloo (host path: ranks 1 and 3 share GPU GPU-b)");
}

TEST(ChooseTpTransportTest, AnUnknownGpuOrDifferentNcclVersionsTakeTheHostPath) {
  EXPECT_EQ(ChooseTpTransport({Cuda("GPU-a"), Cuda("")}).Describe(),
            "gloo (host path: rank 1 reports no GPU id)");
  EXPECT_EQ(ChooseTpTransport({Cuda("GPU-a", 23004), Cuda("GPU-b", 22807)}).Describe(),
            "gloo (host path: ranks 0 and 1 hold different NCCL versions (23004 vs 22807))");
}

TEST(ChooseTpTransportTest, TheFirstReasonInRuleOrderWins) {
  // A cpu rank outranks a shared GPU and a missing library.
  EXPECT_EQ(ChooseTpTransport({Cuda("GPU-a", 0), Cuda("GPU-a"), {"cpu", "", 0}}).Describe(),
            "gloo (rank 2 runs the cpu backend)");
  EXPECT_EQ(ChooseTpTransport({Cuda("GPU-a"), Cuda("GPU-a", 0)}).Describe(),
            "gloo (host path: rank 1 has no NCCL library loaded)");
}

TEST(ChooseTpTransportTest, OneRankHasNothingToReduce) {
  EXPECT_FALSE(ChooseTpTransport({Cuda("GPU-a")}).nccl());
}

TEST(TpRankDeviceTest, RoundTripsThroughItsRendezvousRecord) {
  const TpRankDevice d = Cuda("GPU-0b1c2d3e-0000-1111-2222-333344445555", 22807);
  EXPECT_EQ(d.Encode(), "backend=cuda;gpu=GPU-0b1c2d3e-0000-1111-2222-333344445555;nccl=22807");
  absl::StatusOr<TpRankDevice> back = TpRankDevice::Decode(d.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->backend, d.backend);
  EXPECT_EQ(back->device_uuid, d.device_uuid);
  EXPECT_EQ(back->nccl_version, d.nccl_version);
  absl::StatusOr<TpRankDevice> cpu = TpRankDevice::Decode(TpRankDevice{"cpu", "", 0}.Encode());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->backend, "cpu");
  for (const char* bad : {"", "backend=cuda", "backend=;gpu=;nccl=0", "backend=cuda;gpu=x;nccl=z",
                          "backend=cuda;gpu=x;nccl=-1"}) {
    absl::StatusOr<TpRankDevice> d2 = TpRankDevice::Decode(bad);
    EXPECT_EQ(d2.status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

// ---- stage groups ------------------------------------------------------------------------------

// The fake libnccl, opened once for the process.
struct Fake {
  engine::testing::DlopenedNccl lib;
  void* (*stream_create)() = nullptr;
  void (*stream_destroy)(void*) = nullptr;
  int (*stream_query)(void*) = nullptr;
};

const Fake& GetFake() {
  static Fake* fake = [] {
    auto* f = new Fake;
    auto lib = engine::testing::DlopenNccl(GLM_FAKE_NCCL_GROUP);
    EXPECT_TRUE(lib.ok()) << lib.status();
    if (!lib.ok()) return f;
    f->lib = *lib;
    f->stream_create = reinterpret_cast<void* (*)()>(dlsym(f->lib.handle, "fake_nccl_stream_create"));
    f->stream_destroy =
        reinterpret_cast<void (*)(void*)>(dlsym(f->lib.handle, "fake_nccl_stream_destroy"));
    f->stream_query = reinterpret_cast<int (*)(void*)>(dlsym(f->lib.handle, "fake_nccl_stream_query"));
    return f;
  }();
  return *fake;
}

// A device stream on a named GPU, over the fake's streams.
class FakeGpuStream : public DeviceStream {
 public:
  explicit FakeGpuStream(std::string uuid)
      : uuid_(std::move(uuid)), stream_(GetFake().stream_create()) {}
  ~FakeGpuStream() override { GetFake().stream_destroy(stream_); }
  nccl::Stream handle() const override { return stream_; }
  absl::StatusOr<bool> Query() override { return GetFake().stream_query(stream_) == 1; }
  absl::Status MakeCurrent() override {
    ++made_current;
    return absl::OkStatus();
  }
  std::string device_uuid() const override { return uuid_; }
  std::atomic<int> made_current{0};

 private:
  std::string uuid_;
  void* stream_;
};

// The CPU backend claiming device memory (the fake NCCL reduces host memory), so TpGroup takes
// the path it takes on cuda.
class FakeDeviceBackend : public CpuBackend {
 public:
  FakeDeviceBackend() : CpuBackend(1) {}
  std::string name() const override { return "cuda"; }
  bool HostMemory() const override { return false; }
};

ModelConfig TwoLayerConfig() {
  ModelConfig c;
  c.vocab_size = 5;
  c.hidden_size = 4;
  c.num_hidden_layers = 2;
  c.index_topk = 2;
  c.indexer_types = {IndexerType::kFull, IndexerType::kFull};
  c.max_position_embeddings = 64;
  return c;
}

std::string UniqueGroupKey() {
  static std::atomic<int> next{0};
  return absl::StrCat("tp-transport-test/replica", next++, "/epoch1");
}

struct Stage {
  InProcessRendezvous rendezvous;
  std::string key = UniqueGroupKey();
  std::vector<std::unique_ptr<StageGroup>> ranks;
  std::vector<absl::Status> create_status;
};

// Forms one stage of two TP ranks, each with devices[r] and (when `nccl`) the fake library.
std::unique_ptr<Stage> FormStage(const std::vector<StageDevice>& devices, bool nccl,
                                 std::chrono::milliseconds op_timeout = std::chrono::seconds(5)) {
  auto stage = std::make_unique<Stage>();
  const int n = static_cast<int>(devices.size());
  stage->ranks.resize(n);
  stage->create_status.resize(n);
  const ModelConfig config = TwoLayerConfig();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ShardTopology t;
      t.tp_rank = r;
      t.tp_size = n;
      t.rendezvous = &stage->rendezvous;
      t.group_key = stage->key;
      t.connect_timeout = std::chrono::seconds(20);
      t.op_timeout = op_timeout;
      if (nccl) t.nccl = &GetFake().lib.table;
      auto g = StageGroup::Create(t, config, devices[r]);
      stage->create_status[r] = g.status();
      if (g.ok()) stage->ranks[r] = *std::move(g);
    });
  }
  for (auto& th : threads) th.join();
  return stage;
}

TpRankDevice Published(Stage& stage, int tp_rank) {
  auto v = stage.rendezvous.Get(absl::StrCat(stage.key, "/pipeline/tp0/device/", tp_rank),
                                std::chrono::milliseconds(0));
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return {};
  auto d = TpRankDevice::Decode(*v);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : TpRankDevice{};
}

TEST(StageGroupTpTransportTest, CpuRanksStayOnGlooAndPublishWhy) {
  auto stage = FormStage({StageDevice{}, StageDevice{}}, /*nccl=*/true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stage->create_status[r].ok()) << "rank " << r << ": " << stage->create_status[r];
    const StageGroup& g = *stage->ranks[r];
    EXPECT_FALSE(g.tp_transport().nccl());
    EXPECT_EQ(g.tp_transport().Describe(), "gloo (rank 0 runs the cpu backend)");
    ASSERT_NE(g.tp_comm(), nullptr);
    EXPECT_FALSE(g.tp_comm()->DeviceMemory());
    const TpRankDevice d = Published(*stage, r);
    EXPECT_EQ(d.backend, "cpu");
    EXPECT_EQ(d.device_uuid, "");
    EXPECT_EQ(d.nccl_version, 23004);  // the library is there; the backend rules NCCL out
  }
  // The Gloo group works: each rank adds its rank + 1.
  std::vector<float> sums(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      float v = static_cast<float>(r + 1);
      EXPECT_TRUE(stage->ranks[r]->tp_comm()->AllReduceSum(&v, 1).ok());
      sums[r] = v;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(sums, (std::vector<float>{3.0f, 3.0f}));
}

TEST(StageGroupTpTransportTest, RanksSharingAGpuTakeTheHostPath) {
  FakeGpuStream s0("GPU-shared"), s1("GPU-shared");
  auto stage = FormStage({StageDevice{"cuda", &s0}, StageDevice{"cuda", &s1}}, /*nccl=*/true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stage->create_status[r].ok()) << "rank " << r << ": " << stage->create_status[r];
    EXPECT_EQ(stage->ranks[r]->tp_transport().Describe(),
              "gloo (host path: ranks 0 and 1 share GPU GPU-shared)");
    EXPECT_FALSE(stage->ranks[r]->tp_comm()->DeviceMemory());
    EXPECT_EQ(Published(*stage, r).device_uuid, "GPU-shared");
  }
  EXPECT_EQ(s0.made_current.load(), 0);  // no NCCL communicator was made
}

TEST(StageGroupTpTransportTest, GpuRanksWithoutTheLibraryTakeTheHostPath) {
  FakeGpuStream s0("GPU-0"), s1("GPU-1");
  auto stage = FormStage({StageDevice{"cuda", &s0}, StageDevice{"cuda", &s1}}, /*nccl=*/false);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stage->create_status[r].ok()) << "rank " << r << ": " << stage->create_status[r];
    EXPECT_EQ(stage->ranks[r]->tp_transport().Describe(),
              "gloo (host path: rank 0 has no NCCL library loaded)");
  }
}

TEST(StageGroupTpTransportTest, DistinctGpusWithNcclAllReduceOnTheBackendStream) {
  FakeGpuStream s0("GPU-0"), s1("GPU-1");
  auto stage = FormStage({StageDevice{"cuda", &s0}, StageDevice{"cuda", &s1}}, /*nccl=*/true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stage->create_status[r].ok()) << "rank " << r << ": " << stage->create_status[r];
    EXPECT_EQ(stage->ranks[r]->tp_transport().Describe(), "nccl");
    ASSERT_NE(stage->ranks[r]->tp_comm(), nullptr);
    EXPECT_TRUE(stage->ranks[r]->tp_comm()->DeviceMemory());
  }
  EXPECT_EQ(s0.made_current.load(), 1);  // before ncclCommInitRank
  EXPECT_EQ(s1.made_current.load(), 1);

  // The model's side: each rank's TpGroup reduces "device" memory in place, enqueued on its
  // stream; Finish waits for it. One thread is enough: the fake completes the collective when
  // the last rank enqueues it.
  FakeDeviceBackend b0, b1;
  TpGroup tp0(0, 2, stage->ranks[0]->tp_comm()), tp1(1, 2, stage->ranks[1]->tp_comm());
  std::vector<float> x0(6, 1.0f), x1(6, 2.0f);
  MatView v0{x0.data(), 2, 3, 3}, v1{x1.data(), 2, 3, 3};  // [2, 3] each
  tp0.AllReduce(&b0, v0);
  tp1.AllReduce(&b1, v1);
  ASSERT_TRUE(tp0.Finish().ok()) << tp0.status();
  ASSERT_TRUE(tp1.Finish().ok()) << tp1.status();
  EXPECT_EQ(x0, std::vector<float>(6, 3.0f));
  EXPECT_EQ(x1, std::vector<float>(6, 3.0f));

  // Rank 1 dies with rank 0's next all-reduce enqueued: rank 0's step fails at Finish, at once
  // (NCCL's asynchronous error), not after op_timeout.
  tp0.AllReduce(&b0, v0);
  dynamic_cast<NcclCommunicator*>(stage->ranks[1]->tp_comm())->Abort();
  const auto start = std::chrono::steady_clock::now();
  const absl::Status st = tp0.Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(st.message(), HasSubstr("TP all-reduce on rank 0 of 2"));
  EXPECT_THAT(st.message(), HasSubstr("a peer died"));
}

TEST(StageGroupTpTransportTest, AStuckPeerFailsTheStepAfterOpTimeout) {
  FakeGpuStream s0("GPU-0"), s1("GPU-1");
  auto stage = FormStage({StageDevice{"cuda", &s0}, StageDevice{"cuda", &s1}}, /*nccl=*/true,
                         std::chrono::milliseconds(300));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stage->create_status[r].ok()) << "rank " << r << ": " << stage->create_status[r];
  }
  // Rank 1 never issues its all-reduce (alive but stuck): rank 0 gives up after op_timeout.
  FakeDeviceBackend b0;
  TpGroup tp0(0, 2, stage->ranks[0]->tp_comm());
  std::vector<float> x0(4, 1.0f);
  tp0.AllReduce(&b0, MatView{x0.data(), 1, 4, 4});  // [1, 4]
  const absl::Status st = tp0.Finish();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(st.message(), HasSubstr("did not complete within 300 ms"));
}

}  // namespace
}  // namespace glm::engine::pipeline
