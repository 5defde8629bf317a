// Weight staging across four "nodes", each in its own network namespace on a private bridge
// (in a fifth, "switch" namespace), as on a real fabric: node 0 is the source with ~200 MB of
// fake shards; nodes 1-3 stage their PP stage's files from each other and the source (fan-out);
// one node starts with a corrupted and a truncated file; a peer process is SIGKILLed
// mid-transfer. Each node must end with exactly its plan's files, all verified.
// Creates and removes its namespaces; addresses exist only inside them. Skips unless root with
// `ip netns`.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "agent/stage/stage_server.h"
#include "agent/stage/weight_stager.h"
#include "cluster/manifest/file_hash.h"
#include "gtest/gtest.h"

extern char** environ;

namespace glm::stage {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1 << 20;

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

void WriteRandom(const fs::path& p, uint64_t size, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::ofstream out(p, std::ios::binary);
  std::vector<uint64_t> block(kMiB / 8);
  for (uint64_t done = 0; done < size;) {
    for (uint64_t& v : block) v = rng();
    uint64_t n = std::min<uint64_t>(kMiB, size - done);
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n));
    done += n;
  }
}

std::set<std::string> ListFiles(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), dir).generic_string());
  }
  return out;
}

class FourNodeFabric : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (Sh("command -v ip") != 0) GTEST_SKIP() << "no `ip` command (iproute2)";
    id_ = std::to_string(getpid());
    sw_ = "glm_stg_sw_" + id_;
    if (Sh("ip netns add " + sw_) != 0) GTEST_SKIP() << "`ip netns add` failed (no CAP_SYS_ADMIN?)";
    namespaces_.push_back(sw_);
    ASSERT_EQ(Sh("ip -n " + sw_ + " link add br0 type bridge"), 0);
    ASSERT_EQ(Sh("ip -n " + sw_ + " link set br0 up"), 0);
    for (int i = 0; i < 4; ++i) {
      std::string ns = "glm_stg_n" + std::to_string(i) + "_" + id_;
      namespaces_.push_back(ns);
      nodes_.push_back(ns);
      std::string a = "gs" + std::to_string(i) + "a" + id_, b = "gs" + std::to_string(i) + "b" + id_;
      ASSERT_EQ(Sh("ip netns add " + ns), 0);
      ASSERT_EQ(Sh("ip link add " + a + " netns " + ns + " type veth peer name " + b + " netns " + sw_), 0);
      // Every hop at 9000: a 1500 switch port would black-hole non-GSO frames above 1500
      // (the very pitfall mtu.path exists for).
      ASSERT_EQ(Sh("ip -n " + sw_ + " link set " + b + " mtu 9000 master br0 up"), 0);
      ASSERT_EQ(Sh("ip -n " + ns + " addr add " + Ip(i) + "/24 dev " + a), 0);
      ASSERT_EQ(Sh("ip -n " + ns + " link set " + a + " mtu 9000 up"), 0);
      Sh("ip -n " + ns + " link set lo up");
    }
    root_ = fs::path(testing::TempDir()) / ("stage_netns_" + id_);
    fs::remove_all(root_);
  }
  void TearDown() override {
    for (const std::string& ns : namespaces_) Sh("ip netns del " + ns);
    if (!root_.empty()) fs::remove_all(root_);
  }

  static std::string Ip(int i) { return "10.232.0." + std::to_string(i + 1); }

  void InNamespace(const std::string& ns, const std::function<void()>& fn) {
    std::thread t([&] {
      int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(setns(fd, CLONE_NEWNET), 0);
      close(fd);
      fn();
    });
    t.join();
  }

  std::string id_, sw_;
  std::vector<std::string> namespaces_, nodes_;
  fs::path root_;
};

TEST_F(FourNodeFabric, FanOutWithCorruptionTruncationAndAKilledPeer) {
  // The checkpoint: 4 decoder layers in 4 × 40 MiB shards + embedding/head/MTP shards.
  fs::path src = root_ / "node0";
  fs::create_directories(src);
  std::ofstream(src / "config.json") << R"({"num_hidden_layers": 4})";
  std::ofstream(src / "model.safetensors.index.json") << R"({"weight_map": {
    "model.embed_tokens.weight": "embed.safetensors",
    "model.layers.0.mlp.gate.weight": "layers-0.safetensors",
    "model.layers.1.mlp.gate.weight": "layers-1.safetensors",
    "model.layers.2.mlp.gate.weight": "layers-2.safetensors",
    "model.layers.3.mlp.gate.weight": "layers-3.safetensors",
    "model.norm.weight": "head.safetensors", "lm_head.weight": "head.safetensors",
    "model.layers.4.eh_proj.weight": "mtp.safetensors"}})";
  const char* shards[] = {"layers-0.safetensors", "layers-1.safetensors", "layers-2.safetensors",
                          "layers-3.safetensors"};
  for (int i = 0; i < 4; ++i) WriteRandom(src / shards[i], 40 * kMiB + 777 * i, 10 + i);
  WriteRandom(src / "embed.safetensors", 12 * kMiB, 20);
  WriteRandom(src / "head.safetensors", 12 * kMiB + 3, 21);
  WriteRandom(src / "mtp.safetensors", 8 * kMiB, 22);
  auto manifest = cluster::BuildManifest(src.string());
  ASSERT_TRUE(manifest.ok()) << manifest.status();

  // PP2 × TP2: nodes 0,1 = stage 0; nodes 2,3 = stage 1.
  auto plan_for = [&](int node) {
    const cluster::ShardSpec shard = node < 2 ? cluster::ShardSpec{0, 2, true, false, true}
                                              : cluster::ShardSpec{2, 4, false, true, true};
    return cluster::FilesForShard(*manifest, shard);
  };

  // Node 2 starts with a corrupted layers-2 and a truncated layers-3.
  fs::path n2 = root_ / "node2";
  fs::create_directories(n2);
  fs::copy_file(src / "layers-2.safetensors", n2 / "layers-2.safetensors");
  {
    std::fstream f(n2 / "layers-2.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17 * kMiB);
    f.put('\x42');
  }
  fs::copy_file(src / "layers-3.safetensors", n2 / "layers-3.safetensors");
  fs::resize_file(n2 / "layers-3.safetensors", 9 * kMiB);

  // Every node serves its directory on its fabric IP.
  std::vector<std::unique_ptr<StageServer>> servers(4);
  for (int i = 0; i < 4; ++i) {
    fs::create_directories(root_ / ("node" + std::to_string(i)));
    InNamespace(nodes_[i], [&] {
      StageServer::Options o;
      o.root = (root_ / ("node" + std::to_string(i))).string();
      o.bind_address = Ip(i);
      auto s = StageServer::Start(o);
      ASSERT_TRUE(s.ok()) << s.status();
      servers[i] = std::move(*s);
    });
  }
  // A second source process in node 0's namespace, killed mid-transfer.
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string ip_bin = "/usr/sbin/ip";
  if (!fs::exists(ip_bin)) ip_bin = "/sbin/ip";
  std::string serve = GLM_STAGE_SERVE_BIN, src_s = src.string(), bind = Ip(0);
  char* argv[] = {ip_bin.data(), const_cast<char*>("netns"), const_cast<char*>("exec"),
                  nodes_[0].data(), serve.data(), const_cast<char*>("--root"), src_s.data(),
                  const_cast<char*>("--bind"), bind.data(), nullptr};
  pid_t child = -1;
  ASSERT_EQ(posix_spawn(&child, ip_bin.c_str(), &actions, nullptr, argv, environ), 0);
  struct Reaper {
    pid_t* pid;
    ~Reaper() {
      if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, nullptr, 0);
        *pid = -1;
      }
    }
  } reaper{&child};
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  unsigned child_port = 0;
  ASSERT_EQ(fscanf(f, "port %u", &child_port), 1);
  fclose(f);

  for (int i = 1; i < 4; ++i) {
    std::vector<std::string> plan = plan_for(i);
    StageOptions o;
    o.dest_dir = (root_ / ("node" + std::to_string(i))).string();
    o.manifest = *manifest;
    o.files = plan;
    o.chunk_bytes = kMiB;
    o.io_timeout_ms = 5000;
    bool killed = false;
    if (i == 1) {
      // Node 1 pulls from the doomed process first.
      o.peers.push_back({"node0-extra", Ip(0), static_cast<uint16_t>(child_port)});
      o.on_progress = [&](const StageProgress& p) {
        if (!killed && p.bytes_fetched >= 5 * kMiB) {
          kill(child, SIGKILL);
          waitpid(child, nullptr, 0);
          child = -1;
          killed = true;
        }
      };
    }
    for (int j = i - 1; j >= 0; --j) {
      o.peers.push_back({"node" + std::to_string(j), Ip(j), servers[j]->port()});
    }
    absl::StatusOr<StageReport> r = absl::UnknownError("not run");
    InNamespace(nodes_[i], [&] { r = StageFiles(o); });
    ASSERT_TRUE(r.ok()) << "node" << i << ": " << r.status();
    if (i == 1) {
      EXPECT_TRUE(killed);
      EXPECT_GE(r->peer_failures, 1);
    }
    if (i == 2) {
      EXPECT_EQ(r->discarded, std::vector<std::string>{"layers-2.safetensors"});
      EXPECT_EQ(r->bytes_resumed, 9 * kMiB);
    }
    EXPECT_EQ(ListFiles(o.dest_dir), std::set<std::string>(plan.begin(), plan.end())) << "node" << i;
    for (const std::string& file : plan) {
      auto h = cluster::HashFile(o.dest_dir + "/" + file);
      ASSERT_TRUE(h.ok());
      EXPECT_EQ(h->xxh3_128, manifest->Find(file)->xxh3_128) << "node" << i << " " << file;
    }
  }
  // Fan-out: the source did not serve everything the other nodes fetched.
  EXPECT_GT(servers[1]->bytes_served() + servers[2]->bytes_served(), 0u);
}

}  // namespace
}  // namespace glm::stage
