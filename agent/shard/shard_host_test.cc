// ShardHost on the transformers golden fixtures (tests/golden/tiny-*): whole-model and PP-split
// loads, idempotence, errors that name node/file/tensor, TP honesty, and the page cache during a
// load (per-range fadvise, periodic/adaptive drop_caches on a FakeClock, drop not permitted).
#include "agent/shard/shard_host.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "agent/pagecache/testing/fake_kernel_cache_ops.h"
#include "engine/backend/create_backend.h"
#include "engine/model/forward_batch.h"
#include "engine/model/glm_moe_dsa.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glm::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using std::chrono::seconds;

const std::string kGolden = GLM_GOLDEN_DIR;

// The meminfo of a machine with 25 GB, in kB.
pagecache::FakeMeminfo Meminfo(uint64_t available_kb, uint64_t cached_kb) {
  return pagecache::FakeMeminfo{25'000'000, available_kb, cached_kb};
}

// Reads every byte of `dir`'s files so they sit in the page cache.
void WarmPageCache(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::vector<char> buf(1 << 16);
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    }
  }
}

// Bytes of `path` in the page cache (mincore over a fresh mapping).
uint64_t ResidentBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  const uint64_t size = fs::file_size(path);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return size;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  uint64_t resident = 0;
  if (::mincore(map, size, vec.data()) == 0) {
    for (unsigned char v : vec) resident += (v & 1) ? page : 0;
  }
  ::munmap(map, size);
  return resident;
}

bool OnTmpfs(const std::string& path) {
  struct statfs s {};
  return statfs(path.c_str(), &s) == 0 && s.f_type == TMPFS_MAGIC;
}

// Sum of tensor bytes in a checkpoint directory's safetensors headers.
uint64_t HeaderTensorBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream in(e.path(), std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    const nlohmann::json entries = nlohmann::json::parse(header);
    for (const auto& [name, t] : entries.items()) {
      if (name == "__metadata__") continue;
      total += t.at("data_offsets").at(1).get<uint64_t>() -
               t.at("data_offsets").at(0).get<uint64_t>();
    }
  }
  return total;
}

// num_hidden_layers of a fixture's config.json.
int NumLayers(const std::string& dir) {
  return nlohmann::json::parse(std::ifstream(dir + "/config.json"))["num_hidden_layers"].get<int>();
}

class ShardHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("shard_host_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    proc_ = root_ / "proc";
    fs::create_directories(proc_ / "sys/vm");
    // 20 GB available.
    pagecache::WriteFakeMeminfo(proc_.string(), Meminfo(20'000'000, 5'000'000));
  }
  void TearDown() override { fs::remove_all(root_); }

  ShardHostOptions Options(const std::string& node = "node-1") {
    ShardHostOptions o;
    o.node = node;
    o.clock = &clock_;
    o.proc_root = proc_.string();
    o.tick_thread = false;  // the FakeClock drives the policy through the load loop
    o.num_threads = 1;
    // Each drop leaves 1 GB cached and `available_kb_` available.
    o.make_kernel_ops = [this] {
      return std::make_unique<pagecache::FakeKernelCacheOps>(&kernel_calls_, proc_.string(),
                                                             Meminfo(available_kb_, 1'000'000));
    };
    return o;
  }

  static glm::v1::LoadShardRequest Request(const std::string& dir, int first, int last,
                                           int64_t kv_bytes = 8 << 20) {
    glm::v1::LoadShardRequest r;
    r.set_model_dir(dir);
    r.set_layer_begin(first);
    r.set_layer_end(last + 1);
    r.set_kv_cache_bytes(kv_bytes);
    r.set_tp_size(1);
    r.set_pp_size(1);
    return r;
  }

  // Loads and returns the progress lines; fails the test on error.
  std::vector<glm::v1::Progress> MustLoad(ShardHost& host, const glm::v1::LoadShardRequest& r) {
    std::vector<glm::v1::Progress> lines;
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s = host.Load(r, [&](const glm::v1::Progress& p) { lines.push_back(p); });
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
    EXPECT_TRUE(s.ok()) << s;
    glm::v1::ShardStatus st = host.status();
    std::cout << "[ measure ] load " << fs::path(r.model_dir()).filename().string() << " layers "
              << r.layer_begin() << ".." << r.layer_end() << ": " << ms << " ms wall, "
              << st.bytes_loaded() << " B read, fadvise freed "
              << st.page_cache().fadvise_bytes_freed() << " B over "
              << st.page_cache().fadvise_ranges() << " ranges\n";
    return lines;
  }

  // Copies a fixture into the test's temp dir (to corrupt it).
  std::string CopyFixture(const std::string& name) {
    fs::path dst = root_ / name;
    fs::create_directories(dst);
    for (const auto& e : fs::directory_iterator(kGolden + "/" + name)) {
      fs::copy_file(e.path(), dst / e.path().filename());
      // Written back, so the page cache holds clean pages (as for a staged checkpoint).
      int fd = ::open((dst / e.path().filename()).c_str(), O_RDONLY);
      EXPECT_EQ(::fsync(fd), 0);
      ::close(fd);
    }
    return dst.string();
  }

  fs::path root_, proc_;
  FakeClock clock_;
  pagecache::KernelCacheCalls kernel_calls_;
  uint64_t available_kb_ = 20'000'000;
};

TEST_F(ShardHostTest, LoadsEachFixtureWholeAndStreamsProgress) {
  for (const std::string name : {"tiny-dense", "tiny-sharded", "tiny-moe"}) {
    SCOPED_TRACE(name);
    const std::string dir = kGolden + "/" + name;
    ShardHost host(Options());
    EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_NONE);
    const int last = NumLayers(dir) - 1;
    std::vector<glm::v1::Progress> lines = MustLoad(host, Request(dir, 0, last));
    glm::v1::ShardStatus st = host.status();
    EXPECT_EQ(st.state(), glm::v1::SHARD_STATE_LOADED);
    EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_LOADED);
    ASSERT_NE(host.model(), nullptr);
    EXPECT_EQ(host.model()->config().num_hidden_layers, last + 1);
    // Every tensor of the checkpoint was read: bytes match the safetensors headers.
    EXPECT_EQ(static_cast<uint64_t>(st.bytes_loaded()), HeaderTensorBytes(dir));
    EXPECT_EQ(st.bytes_loaded(), st.bytes_total());
    EXPECT_EQ(st.tensors_loaded(), st.tensors_total());
    EXPECT_GT(st.tensors_loaded(), 10);
    EXPECT_GT(st.weight_memory_bytes(), 0);
    EXPECT_EQ(st.kv_cache_bytes() % (16 * 4), 0);
    EXPECT_GT(st.kv_capacity_tokens(), 0);
    EXPECT_LE(st.kv_cache_bytes(), 8 << 20);
    EXPECT_EQ(st.backend(), "cpu");
    EXPECT_TRUE(st.last_error().empty());
    // Progress: a first line with the total, byte progress, a final done line.
    ASSERT_GE(lines.size(), 3u);
    EXPECT_EQ(lines.front().total_bytes(), st.bytes_total());
    const std::string layers = "layers 0-" + std::to_string(last);
    EXPECT_THAT(lines.front().message(), HasSubstr(layers + " + embedding + norm/lm_head"));
    EXPECT_TRUE(lines.back().done());
    EXPECT_TRUE(lines.back().has_shard());
    EXPECT_EQ(lines.back().shard().state(), glm::v1::SHARD_STATE_LOADED);
    EXPECT_THAT(lines.back().message(), AllOf(HasSubstr("loaded " + layers), HasSubstr("KV cache"),
                                             HasSubstr("page cache")));
    for (size_t i = 1; i + 1 < lines.size(); ++i) {
      EXPECT_LE(lines[i].done_bytes(), lines[i].total_bytes());
      EXPECT_GE(lines[i].done_bytes(), lines[i - 1].done_bytes());
    }
  }
}

TEST_F(ShardHostTest, PipelineSplitTwoHostsEachLoadHalfAndTogetherMatchTheWholeModel) {
  const std::string dir = kGolden + "/tiny-sharded";
  ShardHost whole(Options("whole")), first(Options("pp0")), second(Options("pp1"));
  MustLoad(whole, Request(dir, 0, 2));
  glm::v1::LoadShardRequest r0 = Request(dir, 0, 1), r1 = Request(dir, 2, 2);
  r0.mutable_shard()->set_pp_rank(0);
  r1.mutable_shard()->set_pp_rank(1);
  std::vector<glm::v1::Progress> l0 = MustLoad(first, r0);
  std::vector<glm::v1::Progress> l1 = MustLoad(second, r1);
  EXPECT_THAT(l0.front().message(), AllOf(HasSubstr("layers 0-1 + embedding"),
                                          ::testing::Not(HasSubstr("lm_head"))));
  EXPECT_THAT(l1.front().message(), AllOf(HasSubstr("layers 2-2 + norm/lm_head"),
                                          ::testing::Not(HasSubstr("embedding"))));
  glm::v1::ShardStatus s0 = first.status(), s1 = second.status(), sw = whole.status();
  EXPECT_EQ(s0.layer_begin(), 0);
  EXPECT_EQ(s0.layer_end(), 2);
  EXPECT_EQ(s1.pp_rank(), 1);
  // Disjoint halves that add up to the whole checkpoint.
  EXPECT_GT(s0.bytes_loaded(), 0);
  EXPECT_GT(s1.bytes_loaded(), 0);
  EXPECT_EQ(s0.bytes_loaded() + s1.bytes_loaded(), sw.bytes_loaded());
  EXPECT_EQ(s0.tensors_loaded() + s1.tensors_loaded(), sw.tensors_loaded());

  // The two stages run in sequence give the whole model's logits.
  auto slice = [](engine::SequenceSlice s) {
    s.seq_id = 1;
    s.token_ids = {3, 17, 42, 5, 99};
    s.start_pos = 0;
    s.block_table = {0};
    return s;
  };
  engine::ForwardBatch full_batch{{slice({})}};
  engine::ForwardResult full;
  ASSERT_TRUE(whole.model()->Forward(full_batch, &full).ok());
  engine::ForwardResult mid;
  ASSERT_TRUE(first.model()->Forward(full_batch, &mid).ok());
  ASSERT_TRUE(mid.seqs[0].logits.empty());
  engine::SequenceSlice next = slice({});
  next.input_residual = mid.seqs[0].residual;
  next.input_topk = mid.seqs[0].topk;
  engine::ForwardResult out;
  ASSERT_TRUE(second.model()->Forward(engine::ForwardBatch{{next}}, &out).ok());
  ASSERT_EQ(out.seqs[0].logits.size(), full.seqs[0].logits.size());
  ASSERT_FALSE(full.seqs[0].logits.empty());
  for (size_t i = 0; i < full.seqs[0].logits.size(); ++i) {
    EXPECT_NEAR(out.seqs[0].logits[i], full.seqs[0].logits[i], 1e-4) << i;
  }
}

TEST_F(ShardHostTest, SameRequestIsANoOpDifferentOneNeedsStopFirst) {
  const std::string dir = kGolden + "/tiny-dense";
  ShardHost host(Options());
  const glm::v1::LoadShardRequest r = Request(dir, 0, 2);
  MustLoad(host, r);
  engine::Model* model = host.model();
  std::vector<glm::v1::Progress> again;
  ASSERT_TRUE(host.Load(r, [&](const glm::v1::Progress& p) { again.push_back(p); }).ok());
  ASSERT_EQ(again.size(), 1u);
  EXPECT_THAT(again[0].message(), HasSubstr("already loaded"));
  EXPECT_EQ(host.model(), model);  // nothing reloaded

  absl::Status other = host.Load(Request(dir, 0, 1), nullptr);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.message()),
              AllOf(HasSubstr("node 'node-1'"), HasSubstr("already hosts a loaded shard"),
                    HasSubstr("layers [0, 3)"), HasSubstr("layers [0, 2)"), HasSubstr("Stop")));
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_LOADED);  // still the first one

  std::vector<glm::v1::Progress> stop;
  ASSERT_TRUE(host.Stop({}, [&](const glm::v1::Progress& p) { stop.push_back(p); }).ok());
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_STOPPED);
  EXPECT_EQ(host.model(), nullptr);
  EXPECT_EQ(host.status().kv_cache_bytes(), 0);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_THAT(stop[0].message(), HasSubstr("stopped: freed layers [0, 3)"));
  EXPECT_TRUE(host.Stop({}, nullptr).ok());  // idempotent
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_STOPPED);

  MustLoad(host, Request(dir, 0, 1));
  EXPECT_EQ(host.status().layer_end(), 2);
}

// The recorded greedy ids of a fixture (reference.json: prompt_ids, greedy_ids).
std::pair<std::vector<int32_t>, std::vector<int32_t>> GoldenGreedy(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  nlohmann::json j = nlohmann::json::parse(in);
  return {j["prompt_ids"].get<std::vector<int32_t>>(), j["greedy_ids"].get<std::vector<int32_t>>()};
}

glm::v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens) {
  glm::v1::GenerateRequest g;
  for (int32_t id : prompt) g.add_prompt_token_ids(id);
  g.set_max_tokens(max_tokens);
  return g;
}

TEST_F(ShardHostTest, StartGenerateDrainOnASingleRankReplica) {
  const std::string dir = kGolden + "/tiny-sparse";
  ShardHost host(Options());
  EXPECT_EQ(host.Start({}, nullptr).code(), absl::StatusCode::kFailedPrecondition);  // not loaded
  std::vector<glm::v1::TokenEvent> none;
  absl::Status early = host.Generate(Greedy({1, 2}, 2), [&](auto& e) { none.push_back(e); return true; }, nullptr);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(early.message()), HasSubstr("not Running"));

  MustLoad(host, Request(dir, 0, NumLayers(dir) - 1));
  std::vector<glm::v1::Progress> lines;
  ASSERT_TRUE(host.Start({}, [&](const glm::v1::Progress& p) { lines.push_back(p); }).ok());
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back().message(), AllOf(HasSubstr("running"), HasSubstr("head")));
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_RUNNING);
  EXPECT_EQ(host.model(), nullptr);  // the engine owns it now
  EXPECT_TRUE(host.status().head());

  const auto [prompt, greedy] = GoldenGreedy(dir);
  std::vector<int32_t> got;
  glm::v1::TokenEvent last;
  ASSERT_TRUE(host.Generate(Greedy(prompt, 12), [&](const glm::v1::TokenEvent& e) {
                    got.insert(got.end(), e.token_ids().begin(), e.token_ids().end());
                    last = e;
                    return true;
                  }, nullptr).ok());
  EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.begin() + 12));
  EXPECT_TRUE(last.finished());
  EXPECT_EQ(last.finish_reason(), "length");
  EXPECT_EQ(last.completion_tokens(), 12);
  EXPECT_EQ(last.prompt_tokens(), static_cast<int>(prompt.size()));

  // Logprobs: one entry per token; greedy picks the row's most likely token, so it leads the
  // top list and its logprob is the list's first. Asking for them changes no token.
  glm::v1::GenerateRequest with_logprobs = Greedy(prompt, 6);
  with_logprobs.set_return_logprobs(true);
  with_logprobs.set_top_logprobs(3);
  got.clear();
  int num_entries = 0;
  ASSERT_TRUE(host.Generate(with_logprobs, [&](const glm::v1::TokenEvent& e) {
                    EXPECT_EQ(e.logprobs_size(), e.token_ids_size());
                    for (int i = 0; i < e.token_ids_size() && i < e.logprobs_size(); ++i) {
                      const glm::v1::TokenLogprob& lp = e.logprobs(i);
                      EXPECT_LT(lp.logprob(), 0.0f);
                      EXPECT_EQ(lp.top_ids_size(), 3);
                      EXPECT_EQ(lp.top_logprobs_size(), 3);
                      if (lp.top_ids_size() == 3 && lp.top_logprobs_size() == 3) {
                        EXPECT_EQ(lp.top_ids(0), e.token_ids(i));
                        EXPECT_EQ(lp.top_logprobs(0), lp.logprob());
                        EXPECT_GE(lp.top_logprobs(1), lp.top_logprobs(2));
                      }
                      ++num_entries;
                    }
                    got.insert(got.end(), e.token_ids().begin(), e.token_ids().end());
                    return true;
                  }, nullptr).ok());
  EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.begin() + 6));
  EXPECT_EQ(num_entries, 6);
  // Without return_logprobs the events carry none.
  ASSERT_TRUE(host.Generate(Greedy(prompt, 2), [&](const glm::v1::TokenEvent& e) {
                    EXPECT_EQ(e.logprobs_size(), 0);
                    return true;
                  }, nullptr).ok());
  // min_tokens reaches the engine: the stop token (greedy[2]) cannot end the request before
  // 5 tokens, so the third token differs from the greedy one and the request runs on.
  glm::v1::GenerateRequest stop_early = Greedy(prompt, 8);
  stop_early.add_stop_token_ids(greedy[2]);
  got.clear();
  ASSERT_TRUE(host.Generate(stop_early, [&](const glm::v1::TokenEvent& e) {
                    got.insert(got.end(), e.token_ids().begin(), e.token_ids().end());
                    return true;
                  }, nullptr).ok());
  EXPECT_EQ(got.size(), 3u);
  stop_early.set_min_tokens(5);
  stop_early.set_ignore_eos(true);
  got.clear();
  ASSERT_TRUE(host.Generate(stop_early, [&](const glm::v1::TokenEvent& e) {
                    got.insert(got.end(), e.token_ids().begin(), e.token_ids().end());
                    return true;
                  }, nullptr).ok());
  ASSERT_GE(got.size(), 5u);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 2),
            std::vector<int32_t>(greedy.begin(), greedy.begin() + 2));
  EXPECT_NE(got[2], greedy[2]);
  // Out of range: INVALID_ARGUMENT naming the field.
  for (int bad : {-1, 21}) {
    glm::v1::GenerateRequest r = with_logprobs;
    r.set_top_logprobs(bad);
    absl::Status st = host.Generate(r, [](auto&) { return true; }, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("top_logprobs")) << st;
  }
  glm::v1::GenerateRequest no_flag = Greedy(prompt, 2);
  no_flag.set_top_logprobs(2);
  EXPECT_EQ(host.Generate(no_flag, [](auto&) { return true; }, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  glm::v1::GenerateRequest too_few = Greedy(prompt, 2);
  too_few.set_min_tokens(3);
  absl::Status min_status = host.Generate(too_few, [](auto&) { return true; }, nullptr);
  EXPECT_EQ(min_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(min_status.message()), HasSubstr("min_tokens"));

  // A writer that goes away after two tokens aborts the request; the engine serves on.
  int writes = 0;
  absl::Status gone = host.Generate(Greedy(prompt, 200), [&](const glm::v1::TokenEvent&) {
    return ++writes < 2;
  }, nullptr);
  EXPECT_EQ(gone.code(), absl::StatusCode::kCancelled);
  // A cancelled client aborts too.
  absl::Status cancelled = host.Generate(Greedy(prompt, 200), [](auto&) { return true; },
                                         [] { return true; });
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  // The heartbeat: steps served reach the status.
  const auto deadline = std::chrono::steady_clock::now() + seconds(5);
  while (host.status().steps() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(host.status().steps(), 0);

  glm::v1::DrainShardRequest drain;
  drain.set_timeout_ms(5000);
  std::vector<glm::v1::Progress> drained;
  ASSERT_TRUE(host.Drain(drain, [&](const glm::v1::Progress& p) { drained.push_back(p); }).ok());
  EXPECT_THAT(drained.back().message(), HasSubstr("drained"));
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_DRAINING);
  absl::Status refused = host.Generate(Greedy(prompt, 2), [](auto&) { return true; }, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(host.Stop({}, nullptr).ok());
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_STOPPED);
}

TEST_F(ShardHostTest, TensorParallelRankPreparesAndReadsItsSliceWhenTheGroupStarts) {
  ShardHost host(Options());
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
  r.set_tp_size(4);
  r.mutable_shard()->set_tp_rank(2);
  std::vector<glm::v1::Progress> lines = MustLoad(host, r);
  glm::v1::ShardStatus st = host.status();
  EXPECT_EQ(st.state(), glm::v1::SHARD_STATE_LOADED);
  EXPECT_FALSE(st.tp_replicated());
  EXPECT_EQ(st.tp_size(), 4);
  EXPECT_EQ(st.tp_rank(), 2);
  EXPECT_EQ(st.bytes_loaded(), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.bytes_total()), HeaderTensorBytes(kGolden + "/tiny-dense"));
  EXPECT_EQ(host.model(), nullptr);
  EXPECT_THAT(lines.back().message(), AllOf(HasSubstr("prepared"), HasSubstr("tp 2/4")));
  // A group needs the controller's rendezvous.
  glm::v1::StartShardRequest start_request;
  start_request.mutable_shard()->set_tp_rank(2);
  absl::Status start = host.Start(start_request, nullptr);
  EXPECT_EQ(start.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(start.message()), HasSubstr("rendezvous_address"));
}

TEST_F(ShardHostTest, CorruptFileFailsNamingNodeFileAndFix) {
  const std::string dir = CopyFixture("tiny-dense");
  {
    std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = uint64_t{1} << 40;  // header length past the end of the file
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  ShardHost host(Options("spark-3"));
  absl::Status s = host.Load(Request(dir, 0, 2), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 'spark-3'"), HasSubstr(dir + "/model.safetensors"),
                    HasSubstr("Fix: re-stage")));
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_FAILED);
  EXPECT_EQ(host.status().last_error(), std::string(s.message()));
  EXPECT_EQ(host.model(), nullptr);
  // A failed shard can be stopped (clears it) and loaded again from a good copy.
  EXPECT_TRUE(host.Stop({}, nullptr).ok());
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_STOPPED);
  MustLoad(host, Request(kGolden + "/tiny-dense", 0, 2));
}

TEST_F(ShardHostTest, TensorMissingFromItsShardIsNamed) {
  const std::string dir = CopyFixture("tiny-sharded");
  // The index sends a tensor to the shard that does not hold it.
  nlohmann::json index = nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  const std::string tensor = "model.layers.2.input_layernorm.weight";
  const std::string was = index["weight_map"][tensor];
  index["weight_map"][tensor] = was == "model-00001-of-00002.safetensors"
                                    ? "model-00002-of-00002.safetensors"
                                    : "model-00001-of-00002.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
  ShardHost host(Options());
  absl::Status s = host.Load(Request(dir, 2, 2), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("node 'node-1'"), HasSubstr(tensor),
                                              HasSubstr(".safetensors"), HasSubstr("Fix:")));
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_FAILED);
}

TEST_F(ShardHostTest, BackendAndWeightDtypeFromThePlanReachTheEngine) {
  ShardHost host(Options());
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
  r.set_backend("cpu");
  r.set_weight_dtype("bf16");
  MustLoad(host, r);
  glm::v1::ShardStatus st = host.status();
  EXPECT_EQ(st.backend(), "cpu");
  EXPECT_EQ(st.weight_dtype(), "bf16");
  // The model stores its Linear weights as asked.
  ASSERT_NE(host.model(), nullptr);
  std::optional<engine::ModelWeightMemory> bf16 = engine::WeightMemoryOf(*host.model());
  ASSERT_TRUE(bf16.has_value());
  EXPECT_GT(bf16->num_linear_bf16, 0);
  EXPECT_EQ(bf16->num_linear_f32, 0);
  // Unset: the agent's choice, fp32 on the cpu backend.
  ShardHost defaults(Options());
  MustLoad(defaults, Request(kGolden + "/tiny-dense", 0, 2));
  if (defaults.status().backend() == "cpu") {
    EXPECT_EQ(defaults.status().weight_dtype(), "fp32");
    std::optional<engine::ModelWeightMemory> fp32 = engine::WeightMemoryOf(*defaults.model());
    ASSERT_TRUE(fp32.has_value());
    EXPECT_EQ(fp32->num_linear_bf16, 0);
    EXPECT_EQ(fp32->num_linear_f32, bf16->num_linear_bf16);
  }
}

TEST_F(ShardHostTest, BackendCudaWithoutAUsableGpuFailsNamingNodeFieldAndFix) {
  if (engine::CudaBackendAvailable().ok()) {
    GTEST_SKIP() << "a CUDA device is usable here; the refusal is not reachable";
  }
  // A tensor-parallel rank too: without the check it would "prepare" and fail only at Start.
  for (int tp_size : {1, 2}) {
    SCOPED_TRACE(tp_size);
    ShardHost host(Options("spark-4"));
    glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
    r.set_tp_size(tp_size);
    r.set_backend("cuda");
    absl::Status s = host.Load(r, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("node 'spark-4'"), HasSubstr("model.backend: cuda"),
                      HasSubstr("CUDA is not usable"), HasSubstr("Fix: check the node's GPU"),
                      HasSubstr("model.backend to auto or cpu")));
    EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_FAILED);
    EXPECT_EQ(host.status().tensors_loaded(), 0);
    EXPECT_EQ(host.model(), nullptr);
  }
}

TEST_F(ShardHostTest, NegativeGpuOrdinalFailsNamingNodeFieldAndFix) {
  ShardHost host(Options("spark-6"));
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
  r.set_gpu(-1);
  absl::Status s = host.Load(r, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 'spark-6'"), HasSubstr("gpu = -1"),
                    HasSubstr("nodes[].gpu"), HasSubstr("Fix: set nodes[].gpu of node 'spark-6'")));
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_FAILED);
}

TEST_F(ShardHostTest, GpuOrdinalPastTheDeviceCountFailsNamingTheCount) {
  absl::StatusOr<int> devices = engine::CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << "no CUDA device here: " << devices.status().message();
  ShardHost host(Options("spark-6"));
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
  r.set_gpu(*devices);  // one past the last device
  r.set_backend("cuda");
  absl::Status s = host.Load(r, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 'spark-6'"), HasSubstr("nodes[].gpu = " + std::to_string(*devices)),
                    HasSubstr(std::to_string(*devices) + " CUDA device(s)")));
}

TEST_F(ShardHostTest, UnknownBackendOrWeightDtypeIsRefused) {
  ShardHost host(Options("spark-5"));
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
  r.set_backend("tpu");
  absl::Status s = host.Load(r, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 'spark-5'"), HasSubstr("model.backend: tpu"),
                    HasSubstr("auto, cpu or cuda")));
  EXPECT_TRUE(host.Stop({}, nullptr).ok());
  r.set_backend("cpu");
  r.set_weight_dtype("fp8");
  s = host.Load(r, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("model.weight_dtype: fp8"), HasSubstr("auto, bf16 or fp32")));
}

TEST_F(ShardHostTest, NotEnoughMemoryForThePlanFailsBeforeLoading) {
  pagecache::WriteFakeMeminfo(proc_.string(), Meminfo(4'000, 1'000));  // 4 MB available
  ShardHost host(Options("spark-2"));
  absl::Status s = host.Load(Request(kGolden + "/tiny-dense", 0, 2, 64 << 20), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 'spark-2'"), HasSubstr("not enough memory for the plan"),
                    HasSubstr("MemAvailable is 3.91 MiB"), HasSubstr("Fix: lower model.kv_cache_bytes")));
  EXPECT_EQ(host.state(), glm::v1::SHARD_STATE_FAILED);
  EXPECT_EQ(host.status().tensors_loaded(), 0);

  pagecache::WriteFakeMeminfo(proc_.string(), Meminfo(20'000'000, 1'000));
  absl::Status tiny_kv = host.Load(Request(kGolden + "/tiny-dense", 0, 2, 100), nullptr);
  EXPECT_EQ(tiny_kv.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(tiny_kv.message()),
              AllOf(HasSubstr("holds no block"), HasSubstr("Fix: raise model.kv_cache_bytes")));
}

TEST_F(ShardHostTest, EveryLoadedRangeIsReleasedFromThePageCache) {
  for (const std::string name : {"tiny-dense", "tiny-sharded", "tiny-moe"}) {
    SCOPED_TRACE(name);
    // A private copy: nobody else maps it (a mapped page is never evicted).
    const std::string dir = CopyFixture(name);
    WarmPageCache(dir);
    ShardHost host(Options());
    MustLoad(host, Request(dir, 0, NumLayers(dir) - 1));
    glm::v1::ShardStatus st = host.status();
    // One fadvise per tensor read (no block scales in these bf16/fp32 fixtures).
    EXPECT_EQ(st.page_cache().fadvise_ranges(), st.tensors_loaded());
    EXPECT_EQ(st.page_cache().policy(), "off");
    EXPECT_EQ(st.page_cache().drop_caches_count(), 0);
    if (!OnTmpfs(dir)) {
      // The files were resident; their loaded ranges are gone from the cache now. (Freed bytes
      // may exceed the file: a later read's readahead brings released pages back, and they are
      // released again.)
      EXPECT_GT(st.page_cache().fadvise_bytes_freed(), st.bytes_loaded() / 2);
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".safetensors") continue;
        EXPECT_LT(ResidentBytes(e.path().string()), fs::file_size(e.path()) / 10) << e.path();
      }
    }
  }
}

TEST_F(ShardHostTest, PeriodicPolicyDropsCachesDuringTheLoadOnly) {
  ShardHostOptions o = Options();
  o.on_tensor = [this](const std::string&) { clock_.Advance(seconds(10)); };
  ShardHost host(o);
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-moe", 0, 4);
  r.mutable_page_cache()->set_policy("periodic");
  r.mutable_page_cache()->set_interval_s(30);
  MustLoad(host, r);
  glm::v1::ShardStatus st = host.status();
  // 10 s per tensor, a drop every 30 s of load.
  const int expected = static_cast<int>(st.tensors_loaded() * 10 / 30);
  EXPECT_GE(kernel_calls_.drops, expected - 1);
  EXPECT_LE(kernel_calls_.drops, expected);
  EXPECT_GT(kernel_calls_.drops, 3);
  EXPECT_EQ(st.page_cache().drop_caches_count(), kernel_calls_.drops);
  EXPECT_EQ(st.page_cache().last_drop_reason(), "periodic");
  EXPECT_EQ(st.page_cache().policy(), "periodic");
  EXPECT_GT(st.page_cache().drop_caches_bytes_freed(), 0);  // ΔCached of the first drop
  EXPECT_FALSE(st.page_cache().drop_not_permitted());
  EXPECT_EQ(st.load_time_ms(), st.tensors_loaded() * 10'000);  // the FakeClock's time
  // The load is over: the policy no longer runs.
  int after = kernel_calls_.drops;
  clock_.Advance(seconds(300));
  EXPECT_EQ(kernel_calls_.drops, after);
}

TEST_F(ShardHostTest, AdaptivePolicyDropsWhenMemAvailableIsLowAndOnAStall) {
  // MemAvailable 2 GB (enough for the load) under a 4 GB threshold: drops at most every 5 s.
  available_kb_ = 2'000'000;
  pagecache::WriteFakeMeminfo(proc_.string(), Meminfo(available_kb_, 1'500'000));
  ShardHostOptions o = Options();
  o.on_tensor = [this](const std::string&) { clock_.Advance(seconds(1)); };
  {
    ShardHost host(o);
    glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
    r.mutable_page_cache()->set_policy("adaptive");
    r.mutable_page_cache()->set_min_available_bytes(int64_t{4'000'000} * 1024);
    MustLoad(host, r);
    glm::v1::ShardStatus st = host.status();
    EXPECT_GE(kernel_calls_.drops, st.tensors_loaded() / 5 - 1);
    EXPECT_LE(kernel_calls_.drops, st.tensors_loaded() / 5 + 1);
    EXPECT_EQ(st.page_cache().drop_caches_count(), kernel_calls_.drops);
    EXPECT_THAT(st.page_cache().last_drop_reason(),
                HasSubstr("MemAvailable 2000000 kB < threshold 4000000 kB"));
  }
  // Plenty available, but one tensor read takes 25 s: a stall drop.
  kernel_calls_ = {};
  available_kb_ = 20'000'000;
  pagecache::WriteFakeMeminfo(proc_.string(), Meminfo(available_kb_, 1'500'000));
  int n = 0;
  o.on_tensor = [&](const std::string&) { clock_.Advance(seconds(++n == 7 ? 25 : 1)); };
  ShardHost host(o);
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
  r.mutable_page_cache()->set_policy("adaptive");
  r.mutable_page_cache()->set_min_available_bytes(int64_t{1} << 30);
  MustLoad(host, r);
  EXPECT_EQ(kernel_calls_.drops, 1);
  EXPECT_THAT(host.status().page_cache().last_drop_reason(), HasSubstr("load progress stalled"));
}

TEST_F(ShardHostTest, DropCachesNotPermittedIsReportedOnceAndTheLoadCarriesOn) {
  // A directory where drop_caches should be: the write fails like on a read-only /proc/sys.
  fs::create_directories(proc_ / "sys/vm/drop_caches");
  ShardHostOptions o = Options();
  o.make_kernel_ops = nullptr;  // the real operations, under the fake proc root
  o.on_tensor = [this](const std::string&) { clock_.Advance(seconds(2)); };
  ShardHost host(o);
  glm::v1::LoadShardRequest r = Request(kGolden + "/tiny-dense", 0, 2);
  r.mutable_page_cache()->set_policy("periodic");
  r.mutable_page_cache()->set_interval_s(1);
  std::vector<glm::v1::Progress> lines = MustLoad(host, r);
  glm::v1::ShardStatus st = host.status();
  EXPECT_EQ(st.state(), glm::v1::SHARD_STATE_LOADED);
  EXPECT_TRUE(st.page_cache().drop_not_permitted());
  EXPECT_THAT(st.page_cache().drop_not_permitted_message(),
              AllOf(HasSubstr("drop_caches"), HasSubstr("Fix: run glm-agent as root")));
  EXPECT_EQ(st.page_cache().drop_caches_count(), 0);
  EXPECT_EQ(st.page_cache().fadvise_ranges(), st.tensors_loaded());  // fadvise carried on
  EXPECT_THAT(lines.back().message(), HasSubstr("drop_caches not permitted"));
}

TEST_F(ShardHostTest, StatusCallbackSeesLoadingThenLoaded) {
  std::vector<glm::v1::ShardStatus> seen;
  ShardHostOptions o = Options();
  o.on_status = [&](const glm::v1::ShardStatus& s) { seen.push_back(s); };
  ShardHost host(o);
  MustLoad(host, Request(kGolden + "/tiny-dense", 0, 2));
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(seen.front().state(), glm::v1::SHARD_STATE_LOADING);
  EXPECT_EQ(seen.back().state(), glm::v1::SHARD_STATE_LOADED);
  bool partial = false;
  for (const auto& s : seen) {
    partial |= s.state() == glm::v1::SHARD_STATE_LOADING && s.bytes_loaded() > 0 &&
               s.bytes_loaded() < s.bytes_total();
  }
  EXPECT_TRUE(partial) << "no status with partial progress while loading";
  host.Stop({}, nullptr).IgnoreError();
  EXPECT_EQ(seen.back().state(), glm::v1::SHARD_STATE_STOPPED);
}

}  // namespace
}  // namespace glm::agent
