#include "agent/stage/weight_stager.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "agent/stage/nccl_stage.h"
#include "agent/stage/stage_server.h"
#include "cluster/manifest/file_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace glm::stage {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

constexpr uint64_t kMiB = 1 << 20;

void WriteRandom(const fs::path& p, uint64_t size, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::string data(size, '\0');
  for (size_t i = 0; i + 8 <= size; i += 8) {
    uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << data;
}

void FlipByte(const fs::path& p, uint64_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x5a));
}

// Every regular file under `dir`, relative.
std::set<std::string> ListFiles(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), dir).generic_string());
  }
  return out;
}

class WeightStagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) / ("stage_" + std::to_string(getpid()));
    fs::remove_all(root_);
    src_ = root_ / "src";
    fs::create_directories(src_);
    std::ofstream(src_ / "config.json") << R"({"num_hidden_layers": 4, "hidden_size": 64})";
    std::ofstream(src_ / "tokenizer.json") << R"({"model": {"type": "BPE"}})";
    std::ofstream(src_ / "model.safetensors.index.json") << R"({
      "metadata": {"total_size": 1},
      "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00005.safetensors",
        "model.layers.0.self_attn.q_a_proj.weight": "model-00002-of-00005.safetensors",
        "model.layers.1.mlp.experts.0.up_proj.weight": "model-00002-of-00005.safetensors",
        "model.layers.2.self_attn.q_a_proj.weight": "model-00003-of-00005.safetensors",
        "model.layers.3.mlp.gate.weight": "model-00003-of-00005.safetensors",
        "model.norm.weight": "model-00004-of-00005.safetensors",
        "lm_head.weight": "model-00004-of-00005.safetensors",
        "model.layers.4.eh_proj.weight": "model-00005-of-00005.safetensors"
      }})";
    for (int i = 1; i <= 5; ++i) {
      WriteRandom(src_ / ("model-0000" + std::to_string(i) + "-of-00005.safetensors"),
                  3 * kMiB + 4096 * i + 17, 100 + i);
    }
    auto m = cluster::BuildManifest(src_.string());
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }
  void TearDown() override { fs::remove_all(root_); }

  std::unique_ptr<StageServer> Serve(const fs::path& dir) {
    fs::create_directories(dir);
    StageServer::Options o;
    o.root = dir.string();
    auto s = StageServer::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  PeerAddress Peer(const std::string& name, const StageServer& s) {
    return PeerAddress{name, "127.0.0.1", s.port()};
  }
  StageOptions Options(const fs::path& dest, std::vector<std::string> files,
                       std::vector<PeerAddress> peers) {
    StageOptions o;
    o.dest_dir = dest.string();
    o.manifest = manifest_;
    o.files = std::move(files);
    o.peers = std::move(peers);
    o.chunk_bytes = kMiB;
    o.io_timeout_ms = 5000;
    return o;
  }
  void ExpectExactlyVerified(const fs::path& dest, const std::vector<std::string>& plan) {
    EXPECT_EQ(ListFiles(dest), std::set<std::string>(plan.begin(), plan.end()));
    for (const std::string& f : plan) {
      auto h = cluster::HashFile((dest / f).string());
      ASSERT_TRUE(h.ok()) << f;
      EXPECT_EQ(h->xxh3_128, manifest_.Find(f)->xxh3_128) << f;
    }
  }

  fs::path root_, src_;
  cluster::Manifest manifest_;
};

TEST_F(WeightStagerTest, ProtocolRejectsUnsafePaths) {
  EXPECT_TRUE(IsServablePath("model-00001.safetensors"));
  EXPECT_TRUE(IsServablePath("sub/dir/file.json"));
  EXPECT_FALSE(IsServablePath("../secret"));
  EXPECT_FALSE(IsServablePath("/etc/passwd"));
  EXPECT_FALSE(IsServablePath("a/../../b"));
  EXPECT_FALSE(IsServablePath("x.safetensors.partial"));
  auto server = Serve(src_);
  StageOptions o = Options(root_ / "n", {}, {Peer("src", *server)});
  cluster::ManifestFile evil{"../src/config.json", 10, std::string(32, '0')};
  o.manifest.files.push_back(evil);
  std::sort(o.manifest.files.begin(), o.manifest.files.end(),
            [](const cluster::ManifestFile& a, const cluster::ManifestFile& b) {
              return a.path < b.path;
            });
  o.files = {"../src/config.json"};
  auto r = StageFiles(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("refused the request"));
}

TEST_F(WeightStagerTest, SymlinksOutOfTheRootAndPartialFilesAreNotServed) {
  fs::path served = root_ / "served";
  fs::create_directories(served / "sub");
  std::ofstream(root_ / "secret.txt") << "not for peers";
  fs::create_symlink(root_ / "secret.txt", served / "leak.txt");
  fs::create_directory_symlink(root_, served / "sub" / "up");
  std::ofstream(served / "half.bin.partial") << "0123";
  fs::create_symlink(served / "half.bin.partial", served / "half.bin");
  std::ofstream(served / "ok.txt") << "fine";
  fs::create_symlink(served / "ok.txt", served / "alias.txt");  // inside the root: served
  auto server = Serve(served);
  auto fetch = [&](const std::string& path, uint64_t size) {
    StageOptions o = Options(root_ / "n", {}, {Peer("p", *server)});
    o.manifest.files = {cluster::ManifestFile{path, size, std::string(32, '0')}};
    o.files = {path};
    o.prune = false;
    o.rounds = 1;
    return StageFiles(o);
  };
  for (const char* p : {"leak.txt", "sub/up/secret.txt", "half.bin"}) {
    auto r = fetch(p, 13);
    ASSERT_FALSE(r.ok()) << p;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("refused the request")) << p;
  }
  // alias.txt is served (its bytes fail this fake hash, which proves they arrived).
  auto alias = fetch("alias.txt", 4);
  ASSERT_FALSE(alias.ok());
  EXPECT_THAT(std::string(alias.status().message()), HasSubstr("data failed verification"));
  EXPECT_EQ(server->bytes_served(), 4u);
}

// Every reading of this clock is 100 ms after the previous one.
class SteppingClock : public Clock {
 public:
  TimePoint Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += std::chrono::milliseconds(100);
    return now_;
  }

 private:
  mutable std::mutex mu_;
  mutable TimePoint now_{};
};

TEST_F(WeightStagerTest, ProgressIsThrottledAndTheFinalStateAlwaysReported) {
  const std::string big = "big.safetensors";
  WriteRandom(src_ / big, 24 * kMiB + 5, 3);
  manifest_ = *cluster::BuildManifest(src_.string());
  auto server = Serve(src_);
  auto run = [&](Clock::Duration interval) {
    fs::remove_all(root_ / "node");
    StageOptions o = Options(root_ / "node", {big}, {Peer("src", *server)});
    o.prune = false;
    SteppingClock clock;  // ~100 ms per chunk
    o.clock = &clock;
    o.progress_interval = interval;
    std::vector<StageProgress> progress;
    o.on_progress = [&](const StageProgress& p) { progress.push_back(p); };
    auto r = StageFiles(o);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(progress.empty());
    if (!progress.empty()) {
      EXPECT_EQ(progress.back().bytes_done, progress.back().bytes_total);
    }
    return progress.size();
  };
  size_t every_chunk = run(Clock::Duration(0));
  size_t throttled = run(std::chrono::milliseconds(250));
  EXPECT_GE(every_chunk, 25u);  // 25 chunks + the completed file
  // One report per ~3 chunks (each chunk is one clock step of 100 ms), plus the final one.
  EXPECT_LE(throttled, every_chunk / 2);
  EXPECT_GE(throttled, 5u);
}

TEST_F(WeightStagerTest, RepairsCorruptAndTruncatedFilesFromSeveralPeersAndPrunes) {
  const std::string f2 = "model-00002-of-00005.safetensors";
  const std::string f3 = "model-00003-of-00005.safetensors";
  const std::string f5 = "model-00005-of-00005.safetensors";
  // Peer B holds a corrupted copy of f3 (same size) and nothing else useful.
  fs::path b = root_ / "peer_b";
  fs::create_directories(b);
  fs::copy_file(src_ / f3, b / f3);
  FlipByte(b / f3, 2 * kMiB + 5);
  // The node: f2 corrupted in place, f3 truncated to 1 MiB, f5 present but not in its plan.
  fs::path dest = root_ / "node";
  fs::create_directories(dest);
  fs::copy_file(src_ / f2, dest / f2);
  FlipByte(dest / f2, 100);
  fs::copy_file(src_ / f3, dest / f3);
  fs::resize_file(dest / f3, kMiB);
  fs::copy_file(src_ / f5, dest / f5);
  fs::copy_file(src_ / "config.json", dest / "config.json");

  auto src_server = Serve(src_);
  auto b_server = Serve(b);
  std::vector<std::string> plan =
      cluster::FilesForShard(manifest_, cluster::ShardSpec{0, 4, true, true, false});
  ASSERT_EQ(plan.size(), 7u);  // all but the MTP file
  // f3 is plan[3]: the stager starts it at peers[(3 + 0) % 2] = b, whose copy is corrupt.
  StageOptions o = Options(dest, plan, {Peer("src", *src_server), Peer("b", *b_server)});
  FakeClock clock;
  o.clock = &clock;
  std::vector<StageProgress> progress;
  o.on_progress = [&](const StageProgress& p) {
    clock.Advance(std::chrono::milliseconds(100));
    progress.push_back(p);
  };
  auto r = StageFiles(o);
  ASSERT_TRUE(r.ok()) << r.status();

  ExpectExactlyVerified(dest, plan);
  EXPECT_THAT(r->already_present, ElementsAre("config.json"));
  EXPECT_THAT(r->discarded, ElementsAre(f2));
  EXPECT_THAT(r->removed, ElementsAre(f5));
  EXPECT_EQ(r->bytes_resumed, kMiB);                // f3's first MiB was kept
  EXPECT_GE(r->peer_failures, 1);                   // b's corrupt f3 (resumed from b) failed
  EXPECT_EQ(r->fetched.size(), 6u);

  ASSERT_FALSE(progress.empty());
  const StageProgress& last = progress.back();
  EXPECT_EQ(last.bytes_total, manifest_.TotalBytes(plan));
  EXPECT_EQ(last.bytes_done, last.bytes_total);
  EXPECT_GT(last.rate_bytes_per_s, 0);
  EXPECT_EQ(last.eta_s, 0);
  const StageProgress& mid = progress[progress.size() / 2];
  EXPECT_GT(mid.eta_s, 0);

  // A second run finds everything in place and fetches nothing.
  auto again = StageFiles(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->bytes_fetched, 0u);
  EXPECT_EQ(again->already_present.size(), plan.size());
}

TEST_F(WeightStagerTest, FourNodesFanOutEachGetsExactlyItsPlan) {
  // TP2 × PP2: nodes 0,1 = stage 0 (layers 0-1), nodes 2,3 = stage 1 (layers 2-3 + MTP).
  auto src_server = Serve(src_);
  std::vector<fs::path> dests;
  std::vector<std::unique_ptr<StageServer>> servers;
  for (int i = 0; i < 4; ++i) {
    dests.push_back(root_ / ("node" + std::to_string(i)));
    servers.push_back(Serve(dests.back()));  // each node serves what it holds
  }
  uint64_t fetched_total = 0;
  for (int i = 0; i < 4; ++i) {
    cluster::ShardSpec shard = i < 2 ? cluster::ShardSpec{0, 2, true, false, true}
                                     : cluster::ShardSpec{2, 4, false, true, true};
    std::vector<std::string> plan = cluster::FilesForShard(manifest_, shard);
    std::vector<PeerAddress> peers;
    for (int j = 0; j < i; ++j) peers.push_back(Peer("node" + std::to_string(j), *servers[j]));
    peers.push_back(Peer("src", *src_server));
    auto r = StageFiles(Options(dests[i], plan, peers));
    ASSERT_TRUE(r.ok()) << "node" << i << ": " << r.status();
    ExpectExactlyVerified(dests[i], plan);
    fetched_total += r->bytes_fetched;
  }
  // The source served less than everything: node 1 and node 3 fetched from their twins.
  EXPECT_LT(src_server->bytes_served(), fetched_total);
  EXPECT_GT(servers[0]->bytes_served() + servers[2]->bytes_served(), 0u);
}

TEST_F(WeightStagerTest, NoPeerHasTheFileNamesItAndEveryPeer) {
  auto empty = Serve(root_ / "empty");
  auto r = StageFiles(Options(root_ / "node", {"config.json"}, {Peer("empty", *empty)}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("could not stage config.json"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("empty: does not have the file"));
  auto bad = StageFiles(Options(root_ / "node", {"nope.bin"}, {}));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("plan file 'nope.bin' is not in the manifest"));
}

// A peer process serving the source; killed with SIGKILL mid-transfer.
class ChildPeer {
 public:
  explicit ChildPeer(const fs::path& root) {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::string bin = GLM_STAGE_SERVE_BIN, root_s = root.string();
    char* argv[] = {bin.data(), const_cast<char*>("--root"), root_s.data(), nullptr};
    EXPECT_EQ(posix_spawn(&pid_, bin.c_str(), &actions, nullptr, argv, environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    FILE* f = fdopen(out[0], "r");
    unsigned port = 0;
    EXPECT_EQ(fscanf(f, "port %u", &port), 1);  // blocks until the child listens
    fclose(f);
    port_ = static_cast<uint16_t>(port);
  }
  ~ChildPeer() { Kill(); }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

TEST_F(WeightStagerTest, PeerKilledMidTransferResumesFromAnotherPeer) {
  const std::string big = "big.safetensors";
  const uint64_t kSize = 96 * kMiB + 12345;
  WriteRandom(src_ / big, kSize, 7);
  manifest_ = *cluster::BuildManifest(src_.string());
  fs::path mirror = root_ / "mirror";
  fs::create_directories(mirror);
  fs::copy_file(src_ / big, mirror / big);

  ChildPeer child(src_);
  auto mirror_server = Serve(mirror);
  fs::path dest = root_ / "node";
  StageOptions o = Options(dest, {big}, {PeerAddress{"child", "127.0.0.1", child.port()},
                                         Peer("mirror", *mirror_server)});
  o.prune = false;
  bool killed = false;
  o.on_progress = [&](const StageProgress& p) {
    if (!killed && p.bytes_fetched >= 2 * kMiB) {
      child.Kill();
      killed = true;
    }
  };
  auto r = StageFiles(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(killed);
  ExpectExactlyVerified(dest, {big});
  EXPECT_EQ(r->peer_failures, 1);
  // The mirror sent only the rest: the bytes from the killed child were kept.
  EXPECT_LT(mirror_server->bytes_served(), kSize);
  EXPECT_GE(kSize - mirror_server->bytes_served(), 2 * kMiB);
  EXPECT_EQ(r->bytes_fetched, kSize);
}

TEST_F(WeightStagerTest, ResumesFromPartialFile) {
  const std::string f1 = "model-00001-of-00005.safetensors";
  fs::path dest = root_ / "node";
  fs::create_directories(dest);
  fs::copy_file(src_ / f1, dest / (f1 + ".partial"));
  fs::resize_file(dest / (f1 + ".partial"), 2 * kMiB);
  auto server = Serve(src_);
  StageOptions o = Options(dest, {f1}, {Peer("src", *server)});
  o.prune = false;
  auto r = StageFiles(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_resumed, 2 * kMiB);
  EXPECT_EQ(r->bytes_fetched, manifest_.Find(f1)->size - 2 * kMiB);
  EXPECT_EQ(server->bytes_served(), manifest_.Find(f1)->size - 2 * kMiB);
  ExpectExactlyVerified(dest, {f1});
}

TEST_F(WeightStagerTest, BadPartialPrefixIsDetectedAndRefetched) {
  const std::string f1 = "model-00001-of-00005.safetensors";
  fs::path dest = root_ / "node";
  fs::create_directories(dest);
  WriteRandom(dest / (f1 + ".partial"), kMiB, 999);  // garbage prefix
  auto server = Serve(src_);
  StageOptions o = Options(dest, {f1}, {Peer("src", *server)});
  o.prune = false;
  auto r = StageFiles(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peer_failures, 1);
  ExpectExactlyVerified(dest, {f1});
}

TEST_F(WeightStagerTest, NcclLibraryStagedFromAPeer) {
  // The source serves a directory holding the pinned NCCL build.
  fs::path served = root_ / "served";
  fs::create_directories(served / "nccl");
  fs::copy_file(GLM_FAKE_NCCL_23004, served / "nccl/libnccl.so.2");
  auto hash = cluster::HashFile((served / "nccl/libnccl.so.2").string());
  ASSERT_TRUE(hash.ok());
  auto server = Serve(served);
  NcclStageOptions o;
  o.dest_path = (root_ / "node/opt/libnccl.so.2").string();
  o.expected_version = "2.30.4";
  o.expected_hash = hash->xxh3_128;
  o.fetch = FetchFromPeers({Peer("src", *server)},
                           cluster::ManifestFile{"nccl/libnccl.so.2", hash->size, hash->xxh3_128});
  auto r = StageAndLoadNccl(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->copied);
  EXPECT_EQ(r->library->version(), "2.30.4");
  EXPECT_EQ(r->library->table().GetVersion != nullptr, true);
  EXPECT_EQ(ListFiles(root_ / "node"), std::set<std::string>{"opt/libnccl.so.2"});
}

TEST_F(WeightStagerTest, NcclLibraryFetchedFromAPeersOwnLibrary) {
  // The peer holds the pinned build at its nccl.library (here behind a versioned symlink, as
  // NCCL installs it); the node asks for "your NCCL library", not for a stage-root path.
  fs::path peer = root_ / "peer";
  fs::create_directories(peer / "lib");
  fs::copy_file(GLM_FAKE_NCCL_23004, peer / "lib/libnccl.so.2.30.4");
  fs::create_symlink("libnccl.so.2.30.4", peer / "lib/libnccl.so.2");
  auto hash = cluster::HashFile((peer / "lib/libnccl.so.2").string());
  ASSERT_TRUE(hash.ok());
  StageServer::Options so;
  so.root = (root_ / "empty").string();
  so.nccl_library = (peer / "lib/libnccl.so.2").string();
  auto server = StageServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  NcclStageOptions o;
  o.dest_path = (root_ / "node/opt/libnccl.so.2").string();
  o.expected_version = "2.30.4";
  o.expected_hash = hash->xxh3_128;
  std::vector<StageProgress> progress;
  o.fetch = FetchFromPeers({Peer("peer", **server)},
                           cluster::ManifestFile{"", hash->size, hash->xxh3_128}, nullptr,
                           [&](const StageProgress& p) { progress.push_back(p); });
  auto r = StageAndLoadNccl(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->copied);
  EXPECT_EQ(r->library->version(), "2.30.4");
  EXPECT_EQ(ListFiles(root_ / "node"), std::set<std::string>{"opt/libnccl.so.2"});
  EXPECT_EQ((*server)->bytes_served(), hash->size);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().bytes_done, hash->size);

  // A peer whose copy differs from the pinned hash: the fetched bytes are refused.
  fs::remove(o.dest_path);
  o.expected_hash = std::string(32, 'a');
  o.fetch = FetchFromPeers({Peer("peer", **server)},
                           cluster::ManifestFile{"", hash->size, o.expected_hash});
  auto bad = StageAndLoadNccl(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("data failed verification"));
  EXPECT_FALSE(fs::exists(o.dest_path));
}

// Bench mode (--gtest_also_run_disabled_tests): one 1 GiB file over loopback gRPC, written,
// flushed, dropped from the page cache and verified as in production. Prints the rate.
TEST_F(WeightStagerTest, DISABLED_LoopbackThroughput) {
  const std::string big = "bench.safetensors";
  WriteRandom(src_ / big, uint64_t{1} << 30, 11);
  manifest_ = *cluster::BuildManifest(src_.string());
  auto server = Serve(src_);
  StageOptions o = Options(root_ / "node", {big}, {Peer("src", *server)});
  o.prune = false;
  o.chunk_bytes = 4 * kMiB;
  auto start = std::chrono::steady_clock::now();
  auto r = StageFiles(o);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("loopback gRPC staging: %.2f GiB in %.2f s = %.0f MiB/s (incl. hash + fsync)\n",
              static_cast<double>(r->bytes_fetched) / (1 << 30), seconds,
              static_cast<double>(r->bytes_fetched) / (1 << 20) / seconds);
}

}  // namespace
}  // namespace glm::stage
