// Fuzzes every RPC of glm.v1.Agent (AgentService) with hostile requests: one input is one call
// (proto/rpc/testing/service_fuzz.h has the encoding; seeds in tests/fuzz/corpus/agent_service/).
// The handlers run for real, hermetically:
// - scratch directories: a copy of tests/golden/tiny-dense is the node's --model-dir and stage
//   root, a fake proc tree (MemAvailable 512 MiB, drop_caches refused) bounds what a load may
//   allocate, the preflight reads the "healthy" sysfs fixture, the NCCL library path is a file
//   that does not exist;
// - no network: every address a request names (stage peers, MTU peers, the rendezvous) is
//   rewritten to a loopback port that refuses connections; ports outside 1..65535 are left as
//   they are, so the handlers' own checks see them;
// - RestartProcess is served without a supervisor hook, so it is refused (FAILED_PRECONDITION)
//   and never ends the fuzzer;
// - the shard is put in the state that lets each shard RPC reach past its state check: stopped
//   before LoadShard, Loaded before StartShard, Running (tiny-dense on the CPU backend) before
//   DrainShard, StopShard and Generate.
// Streams that run until the client cancels (WatchStatus, Logs with follow, a long Generate)
// end at the call's deadline.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/pagecache/testing/fake_kernel_cache_ops.h"
#include "agent/service/agent_service.h"
#include "proto/rpc/testing/service_fuzz.h"

namespace {

namespace fs = std::filesystem;
using glm::rpc::ServiceFuzzInput;

// Timeouts a request may ask for that the handlers accept are cut to this, so that one input
// cannot hold the fuzzer for minutes (the rendezvous it would wait for never answers).
constexpr int64_t kMaxFuzzTimeoutMs = 200;

// The scratch tree, removed at exit (the fuzzer object itself lives until the process ends).
std::string& ScratchDir() {
  static std::string* dir = new std::string();
  return *dir;
}
void RemoveScratch() {
  std::error_code ignored;
  fs::remove_all(ScratchDir(), ignored);
}

class AgentFuzzer {
 public:
  AgentFuzzer() {
    scratch_ = fs::temp_directory_path() / absl::StrCat("agent_service_fuzz_", ::getpid());
    fs::remove_all(scratch_);
    ScratchDir() = scratch_.string();
    std::atexit(RemoveScratch);
    fs::create_directories(scratch_ / "proc/sys/vm/drop_caches");  // a directory: drops refused
    proc_ = (scratch_ / "proc").string();
    glm::pagecache::WriteFakeMeminfo(proc_, {.total_kb = 1 << 20, .available_kb = 512 << 10,
                                             .cached_kb = 64 << 10});
    model_dir_ = (scratch_ / "model").string();
    fs::copy(GLM_TINY_DENSE, model_dir_, fs::copy_options::recursive);
    const std::string fixture = std::string(GLM_PREFLIGHT_FIXTURES) + "/healthy";

    glm::agent::AgentServiceOptions options;
    options.node = "fuzz";
    options.version = "0.0.0";
    options.heartbeat = std::chrono::milliseconds(50);
    options.probe_paths.proc_root = proc_;
    options.probe_paths.dev_root = fixture + "/dev";
    options.roots = {fixture + "/sys", fixture + "/proc", fixture + "/dev"};
    options.gid_netlink = false;
    options.model_dir = model_dir_;
    options.stage_root = model_dir_;
    options.nccl_library = (scratch_ / "nccl/libnccl.so.2").string();
    options.stage_progress_interval = std::chrono::milliseconds(0);
    options.shard.tick_thread = false;
    options.shard.num_threads = 1;
    options.shard.monitor_interval = std::chrono::milliseconds(50);
    options.shard.make_kernel_ops = [this] {
      return std::make_unique<glm::pagecache::FakeKernelCacheOps>(
          &kernel_calls_, proc_,
          glm::pagecache::FakeMeminfo{.total_kb = 1 << 20, .available_kb = 512 << 10,
                                      .cached_kb = 0});
    };
    // options.request_process_restart stays null: RestartProcess is refused, never exits.
    service_ = std::make_unique<glm::agent::AgentService>(options, glm::Clock::Real());
    const google::protobuf::ServiceDescriptor* descriptor =
        glm::v1::InfoRequest::descriptor()->file()->FindServiceByName("Agent");
    if (descriptor == nullptr) std::abort();
    server_ = std::make_unique<glm::rpc::ServiceFuzzer>(service_.get(), descriptor);
  }

  void Run(const uint8_t* data, size_t size) {
    std::optional<ServiceFuzzInput> input =
        glm::rpc::DecodeServiceFuzzInput(server_->descriptor(), data, size);
    if (!input) return;
    const std::string& method = input->method->name();
    KeepOffTheNetwork(input->request.get());
    if (method == "LoadShard") {
      EnsureState(kStopped);
    } else if (method == "StartShard") {
      EnsureState(kLoaded);
    } else if (method == "DrainShard" || method == "StopShard" || method == "Generate") {
      EnsureState(kRunning);
    }
    const bool endless = method == "WatchStatus" || method == "Logs" || method == "Generate";
    server_->Call(*input, std::chrono::milliseconds(endless ? 300 : 5000), endless ? 64 : 1 << 20);
  }

 private:
  enum Wanted { kStopped, kLoaded, kRunning };

  void KeepOffTheNetwork(google::protobuf::Message* request) {
    const int port = glm::rpc::RefusingLoopbackPort();
    auto peer = [port](glm::v1::StagePeer* p) {
      if (!p->host().empty()) p->set_host("127.0.0.1");
      if (p->port() > 0 && p->port() <= 65535) p->set_port(port);
    };
    if (auto* r = dynamic_cast<glm::v1::StageNcclRequest*>(request)) {
      for (auto& p : *r->mutable_peers()) peer(&p);
    } else if (auto* r = dynamic_cast<glm::v1::StageWeightsRequest*>(request)) {
      for (auto& p : *r->mutable_peers()) peer(&p);
    } else if (auto* r = dynamic_cast<glm::v1::PreflightRequest*>(request)) {
      if (!r->fabric_ip().empty()) r->set_fabric_ip("127.0.0.1");
      for (auto& p : *r->mutable_mtu_peers()) {
        if (!p.fabric_ip().empty()) p.set_fabric_ip("127.0.0.1");
        if (p.port() > 0 && p.port() <= 65535) p.set_port(port);
      }
    } else if (auto* r = dynamic_cast<glm::v1::StartShardRequest*>(request)) {
      if (!r->rendezvous_address().empty()) {
        r->set_rendezvous_address(absl::StrCat("127.0.0.1:", port));
      }
      if (r->connect_timeout_ms() > kMaxFuzzTimeoutMs) r->set_connect_timeout_ms(kMaxFuzzTimeoutMs);
      if (r->op_timeout_ms() > kMaxFuzzTimeoutMs) r->set_op_timeout_ms(kMaxFuzzTimeoutMs);
    } else if (auto* r = dynamic_cast<glm::v1::DrainShardRequest*>(request)) {
      if (r->timeout_ms() > kMaxFuzzTimeoutMs) r->set_timeout_ms(kMaxFuzzTimeoutMs);
    }
  }

  // tiny-dense whole on one CPU rank: what the shard RPCs are fuzzed against.
  static glm::v1::LoadShardRequest GoodLoad() {
    glm::v1::LoadShardRequest r;
    r.set_layer_begin(0);
    r.set_layer_end(3);
    r.set_tp_size(1);
    r.set_pp_size(1);
    r.set_backend("cpu");
    r.set_kv_cache_bytes(4 << 20);
    return r;
  }

  glm::v1::ShardState State() const { return service_->publisher().Snapshot().shard_state(); }

  void Call(const std::string& method, const google::protobuf::Message& request) {
    ServiceFuzzInput input;
    input.method = server_->descriptor().FindMethodByName(method);
    input.request.reset(request.New());
    input.request->CopyFrom(request);
    server_->Call(input, std::chrono::seconds(30), 1 << 20);
  }

  void EnsureState(Wanted wanted) {
    const glm::v1::ShardState state = State();
    const bool running = state == glm::v1::SHARD_STATE_RUNNING;
    const bool loaded = state == glm::v1::SHARD_STATE_LOADED && loaded_good_;
    if ((wanted == kRunning && running) || (wanted == kLoaded && loaded)) return;
    if (wanted == kStopped && (state == glm::v1::SHARD_STATE_UNSPECIFIED ||
                               state == glm::v1::SHARD_STATE_STOPPED)) {
      return;
    }
    Call("StopShard", glm::v1::StopShardRequest());
    loaded_good_ = false;
    if (wanted == kStopped) return;
    Call("LoadShard", GoodLoad());
    loaded_good_ = State() == glm::v1::SHARD_STATE_LOADED;
    if (!loaded_good_) std::abort();  // the fixture no longer loads: the harness is broken
    if (wanted == kLoaded) return;
    Call("StartShard", glm::v1::StartShardRequest());
    loaded_good_ = false;
    if (State() != glm::v1::SHARD_STATE_RUNNING) std::abort();
  }

  fs::path scratch_;
  std::string proc_;
  std::string model_dir_;
  glm::pagecache::KernelCacheCalls kernel_calls_;
  bool loaded_good_ = false;  // Loaded from GoodLoad() (StartShard's precondition)
  std::unique_ptr<glm::agent::AgentService> service_;
  std::unique_ptr<glm::rpc::ServiceFuzzer> server_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static AgentFuzzer* fuzzer = new AgentFuzzer();  // lives as long as the process
  fuzzer->Run(data, size);
  return 0;
}
