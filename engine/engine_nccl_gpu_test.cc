// TP over NCCL on real GPUs (needs 2; skips saying why otherwise): a replica of tp_size 2, one
// rank per GPU, its TP all-reduces through NCCL on the cuda backend's stream
// (engine/pipeline/tp_transport.h picks NCCL: both ranks on cuda, distinct GPUs, the library
// loaded), serves the golden fixtures' greedy tokens exactly as the single-GPU engine does; two
// ranks on one GPU take the host path; and a rank whose process is killed mid-generation fails
// the head's request within seconds (op_timeout), instead of hanging the stream.
//
// NCCL comes through the FunctionTable as the agent hands it over: GLM_NCCL_LIBRARY names
// libnccl.so.2 (tools/gpu/run_multigpu.sh finds torch's). The killed rank is a child process (this
// binary re-run with --gtest_filter on the child case), meeting the head through a rendezvous in
// a temporary directory.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/create_backend.h"
#include "engine/dist/in_process_rendezvous.h"
#include "engine/dist/rendezvous.h"
#include "engine/dist/testdata/nccl_table_dlopen.h"
#include "engine/engine.h"
#include "engine/golden_fixtures_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace glm::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr int kTokens = 24;
constexpr const char* kChildDirEnv = "GLM_NCCL_GPU_TEST_CHILD_DIR";

// A Rendezvous in a directory, for ranks in different processes of one machine: a key is a file
// named by its hex, written whole then renamed into place.
class DirRendezvous : public Rendezvous {
 public:
  explicit DirRendezvous(fs::path dir) : dir_(std::move(dir)) {}
  absl::Status Put(const std::string& key, std::string value) override {
    const fs::path final_path = Path(key);
    const fs::path tmp = final_path.string() + ".tmp" + std::to_string(getpid());
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out) return absl::InternalError(absl::StrCat("writing ", tmp.string()));
    }
    std::error_code ec;
    fs::rename(tmp, final_path, ec);
    if (ec) return absl::InternalError(absl::StrCat("rename ", tmp.string(), ": ", ec.message()));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    const fs::path path = Path(key);
    while (true) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
      }
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("rendezvous key ", key, " not set"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  fs::path Path(const std::string& key) const {
    std::string hex;
    for (unsigned char c : key) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
    return dir_ / hex;
  }
  fs::path dir_;
};

golden::Fixture FixtureNamed(const std::string& name) {
  for (auto& fx : golden::LoadFixtures()) {
    if (fx.name == name) return fx;
  }
  ADD_FAILURE() << "fixture " << name << " not found in " << golden::Dir();
  return {};
}

EngineOptions CudaOptions(const std::string& dir) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.backend = "cuda";
  eo.weight_dtype = "fp32";
  eo.kv_block_size = 4;
  eo.kv_num_blocks = 256;
  eo.max_num_batched_tokens = 7;  // chunked prefill, as engine_golden_test
  eo.max_num_seqs = 4;
  return eo;
}

// The loaded NCCL table (the process keeps the library open), or null with `why`.
const nccl::FunctionTable* Nccl(std::string* why) {
  static testing::DlopenedNccl lib;
  static std::string error;
  static const bool loaded = [] {
    const char* path = std::getenv("GLM_NCCL_LIBRARY");
    if (path == nullptr || *path == '\0') {
      error = "GLM_NCCL_LIBRARY is not set (tools/gpu/run_multigpu.sh sets it)";
      return false;
    }
    auto l = testing::DlopenNccl(path);
    if (!l.ok()) {
      error = std::string(l.status().message());
      return false;
    }
    lib = *l;
    return true;
  }();
  *why = error;
  return loaded ? &lib.table : nullptr;
}

// Skips unless NCCL loads and `want` GPUs are visible.
#define GLM_REQUIRE_GPUS(want)                                                            \
  do {                                                                                    \
    std::string why;                                                                      \
    if (Nccl(&why) == nullptr) GTEST_SKIP() << why;                                       \
    absl::StatusOr<int> n = CudaDeviceCount();                                            \
    if (!n.ok()) GTEST_SKIP() << n.status().message();                                    \
    if (*n < (want)) GTEST_SKIP() << "needs " << (want) << " GPUs, " << *n << " visible"; \
  } while (0)

std::string UniqueGroupKey() {
  static std::atomic<int> next{0};
  return absl::StrCat("nccl-gpu-test/", getpid(), "/replica", next++, "/epoch1");
}

ShardTopology TpRank(int tp_rank, int tp_size, Rendezvous* rendezvous, const std::string& key) {
  ShardTopology t;
  t.tp_rank = tp_rank;
  t.tp_size = tp_size;
  t.rendezvous = rendezvous;
  t.group_key = key;
  t.connect_timeout = std::chrono::seconds(120);
  t.op_timeout = std::chrono::seconds(5);
  std::string why;
  t.nccl = Nccl(&why);
  return t;
}

// tp_size ranks as threads of this process; rank r on GPU devices[r].
std::vector<std::unique_ptr<Engine>> StartTp(const EngineOptions& base,
                                             const std::vector<int>& devices,
                                             InProcessRendezvous* rendezvous) {
  const int n = static_cast<int>(devices.size());
  std::vector<std::unique_ptr<Engine>> ranks(n);
  const std::string key = UniqueGroupKey();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      EngineOptions eo = base;
      eo.device = devices[r];
      eo.shard = TpRank(r, n, rendezvous, key);
      auto engine = Engine::Create(eo);
      EXPECT_TRUE(engine.ok()) << "rank " << r << ": " << engine.status();
      if (engine.ok()) ranks[r] = *std::move(engine);
    });
  }
  for (auto& t : threads) t.join();
  return ranks;
}

std::vector<std::vector<int32_t>> Greedy(Engine& engine, const golden::Fixture& fx) {
  std::vector<RequestHandle> handles;
  for (const golden::Case& c : fx.cases) {
    auto h = engine.Submit(golden::GreedyRequest(c.prompt, kTokens));
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) handles.push_back(*h);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& h : handles) {
    TokenEvent last;
    out.push_back(h.stream->CollectTokens(&last));
    EXPECT_EQ(last.finish_reason, FinishReason::kLength) << last.error;
  }
  return out;
}

class EngineNcclGpuTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineNcclGpuTest, Tp2OverNcclEqualsTheSingleGpuGreedyTokens) {
  GLM_REQUIRE_GPUS(2);
  const golden::Fixture fx = FixtureNamed(GetParam());
  ASSERT_FALSE(fx.name.empty());
  std::vector<std::vector<int32_t>> single;
  {
    auto one = Engine::Create(CudaOptions(fx.dir));
    ASSERT_TRUE(one.ok()) << one.status();
    single = Greedy(**one, fx);
    EXPECT_EQ((*one)->tp_transport(), "");
  }
  InProcessRendezvous rendezvous;
  auto ranks = StartTp(CudaOptions(fx.dir), {0, 1}, &rendezvous);
  ASSERT_TRUE(ranks[0] != nullptr && ranks[1] != nullptr);
  EXPECT_EQ(ranks[0]->tp_transport(), "nccl");
  EXPECT_EQ(ranks[1]->tp_transport(), "nccl");
  const auto tp = Greedy(*ranks[0], fx);
  ASSERT_EQ(tp.size(), single.size());
  for (size_t i = 0; i < tp.size(); ++i) {
    EXPECT_EQ(tp[i], single[i]) << fx.name << " case " << i;
    const auto& ref = fx.cases[i].greedy;
    const size_t n = std::min<size_t>(kTokens, ref.size());
    EXPECT_EQ(std::vector<int32_t>(tp[i].begin(), tp[i].begin() + std::min(n, tp[i].size())),
              std::vector<int32_t>(ref.begin(), ref.begin() + n))
        << fx.name << " case " << i << " vs the transformers reference";
  }
  std::printf("%s: TP 2 over NCCL = single GPU on %zu cases x %d tokens\n", fx.name.c_str(),
              tp.size(), kTokens);
  ASSERT_TRUE(ranks[0]->Drain().ok());
  EXPECT_TRUE(ranks[1]->status().ok()) << ranks[1]->status();
}

TEST_P(EngineNcclGpuTest, TwoRanksOnOneGpuTakeTheHostPathWithTheSameTokens) {
  GLM_REQUIRE_GPUS(1);
  const golden::Fixture fx = FixtureNamed(GetParam());
  ASSERT_FALSE(fx.name.empty());
  InProcessRendezvous rendezvous;
  auto ranks = StartTp(CudaOptions(fx.dir), {0, 0}, &rendezvous);
  ASSERT_TRUE(ranks[0] != nullptr && ranks[1] != nullptr);
  EXPECT_THAT(ranks[0]->tp_transport(), HasSubstr("gloo (host path: ranks 0 and 1 share GPU GPU-"));
  const auto tp = Greedy(*ranks[0], fx);
  for (size_t i = 0; i < tp.size(); ++i) {
    const auto& ref = fx.cases[i].greedy;
    const size_t n = std::min<size_t>(kTokens, ref.size());
    EXPECT_EQ(std::vector<int32_t>(tp[i].begin(), tp[i].begin() + std::min(n, tp[i].size())),
              std::vector<int32_t>(ref.begin(), ref.begin() + n))
        << fx.name << " case " << i;
  }
  ASSERT_TRUE(ranks[0]->Drain().ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineNcclGpuTest,
                         ::testing::Values("tiny-moe", "tiny-sparse", "tiny-mtp"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

// The child half of AKilledRankFailsTheHeadWithinSeconds: tp rank 1 on GPU 1, in its own
// process; it SIGKILLs itself once the parent writes <dir>/die (mid-generation).
TEST(EngineNcclGpuKillTest, ChildRank) {
  const char* dir = std::getenv(kChildDirEnv);
  if (dir == nullptr) GTEST_SKIP() << "runs only as the child of AKilledRankFails...";
  DirRendezvous rendezvous{fs::path(dir)};
  EngineOptions eo = CudaOptions((fs::path(dir) / "model").string());
  {
    std::ifstream in(fs::path(dir) / "model_dir");
    std::getline(in, eo.model_dir);
  }
  std::string key;
  {
    std::ifstream in(fs::path(dir) / "group_key");
    std::getline(in, key);
  }
  eo.device = 1;
  eo.shard = TpRank(1, 2, &rendezvous, key);
  auto engine = Engine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  while (!fs::exists(fs::path(dir) / "die")) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  raise(SIGKILL);  // no destructors, no goodbye on any socket the kernel does not close
}

TEST(EngineNcclGpuKillTest, AKilledRankFailsTheHeadWithinSeconds) {
  GLM_REQUIRE_GPUS(2);
  const golden::Fixture fx = FixtureNamed("tiny-moe");
  ASSERT_FALSE(fx.name.empty());
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("glm-nccl-kill-", getpid());
  fs::create_directories(dir);
  const std::string key = UniqueGroupKey();
  std::ofstream(dir / "model_dir") << fx.dir << "\n";
  std::ofstream(dir / "group_key") << key << "\n";

  // The child: this binary, only the child case, with the directory in its environment.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(absl::StrCat(kChildDirEnv, "=", dir.string()));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=EngineNcclGpuKillTest.ChildRank";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);

  DirRendezvous rendezvous(dir);
  EngineOptions eo = CudaOptions(fx.dir);
  eo.device = 0;
  eo.shard = TpRank(0, 2, &rendezvous, key);
  auto head = Engine::Create(eo);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ((*head)->tp_transport(), "nccl");

  // A long generation; the child dies after its first token.
  auto h = (*head)->Submit(golden::GreedyRequest(fx.main().prompt, 100000));
  ASSERT_TRUE(h.ok()) << h.status();
  TokenEvent ev;
  ASSERT_TRUE(h->stream->Next(&ev));
  std::ofstream(dir / "die") << "now\n";
  const auto killed = Clock::now();
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << "child status " << wstatus;
  TokenEvent last;
  h->stream->CollectTokens(&last);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  std::printf("the head's request ended %.2f s after tp rank 1 was killed: %s\n", seconds,
              last.error.ToString().c_str());
  EXPECT_EQ(last.finish_reason, FinishReason::kError);
  EXPECT_FALSE(last.error.ok());
  EXPECT_LT(seconds, 15.0);  // op_timeout 5 s, plus the failure's way to the request
  EXPECT_FALSE((*head)->status().ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace glm::engine
