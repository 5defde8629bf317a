// Fuzzes every RPC of glm.v1.Controller (ControllerService) with hostile requests: one input is
// one call (proto/rpc/testing/service_fuzz.h has the encoding; seeds in
// tests/fuzz/corpus/controller_service/). The handlers run for real, hermetically:
// - the cluster is one node whose agent address is a loopback port that refuses connections,
//   so Up, Preflight, Down (StopShard on every node) and Logs forwarding reach their agent
//   calls and fail fast there; no other address is dialled;
// - Plan and Validate plan through a fake that reads nothing (the real planner has its own
//   fuzzer, controller/plan/plan_fuzz.cc);
// - Down only marks the in-process cluster down: nothing outside this process stops;
// - RendezvousGet waits at most 20 ms here: the store already caps a wait at
//   RendezvousStore::kMaxWait (10 minutes), which is right for shard groups but would park a
//   server thread per input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "controller/orchestrate/controller_service.h"
#include "proto/rpc/testing/service_fuzz.h"

namespace {

using glm::rpc::ServiceFuzzInput;

constexpr int64_t kMaxFuzzWaitMs = 20;

glm::orchestrate::ClusterTopology Topology() {
  glm::orchestrate::ClusterTopology t;
  t.cluster_name = "fuzz";
  t.config_path = "/nonexistent/fuzz/cluster.yaml";
  t.controller_listen = "127.0.0.1:0";
  t.local = true;
  glm::orchestrate::NodeEndpoint node;
  node.name = "n1";
  node.address = absl::StrCat("127.0.0.1:", glm::rpc::RefusingLoopbackPort());
  t.nodes = {node};
  return t;
}

class ControllerFuzzer {
 public:
  ControllerFuzzer() {
    glm::orchestrate::ControllerServiceOptions options;
    options.version = "0.0.0";
    options.config_path = Topology().config_path;
    options.loader = [] { return absl::StatusOr<glm::orchestrate::ClusterTopology>(Topology()); };
    options.plan_text = [](const std::string& path,
                           bool json) -> absl::StatusOr<std::string> {
      if (path != Topology().config_path) {
        return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
      }
      return std::string(json ? "{}" : "plan");
    };
    options.connect_policy.max_attempts = 1;
    options.connect_policy.initial_backoff = std::chrono::milliseconds(1);
    options.connect_policy.max_backoff = std::chrono::milliseconds(1);
    options.connect_policy.call_timeout = std::chrono::milliseconds(200);
    options.heartbeat = std::chrono::milliseconds(50);
    options.reconcile_interval = std::chrono::milliseconds(0);  // no self-healing thread
    service_ = std::make_unique<glm::orchestrate::ControllerService>(options, Topology(),
                                                                     glm::Clock::Real());
    const google::protobuf::ServiceDescriptor* descriptor =
        glm::v1::StatusRequest::descriptor()->file()->FindServiceByName("Controller");
    if (descriptor == nullptr) std::abort();
    server_ = std::make_unique<glm::rpc::ServiceFuzzer>(service_.get(), descriptor);
  }

  void Run(const uint8_t* data, size_t size) {
    std::optional<ServiceFuzzInput> input =
        glm::rpc::DecodeServiceFuzzInput(server_->descriptor(), data, size);
    if (!input) return;
    if (auto* r = dynamic_cast<glm::v1::RendezvousGetRequest*>(input->request.get())) {
      if (r->wait_ms() > kMaxFuzzWaitMs) r->set_wait_ms(kMaxFuzzWaitMs);
    }
    const std::string& method = input->method->name();
    const bool endless = method == "Logs" || method == "Generate";
    server_->Call(*input, std::chrono::milliseconds(endless ? 300 : 5000), endless ? 64 : 1 << 20);
  }

 private:
  std::unique_ptr<glm::orchestrate::ControllerService> service_;
  std::unique_ptr<glm::rpc::ServiceFuzzer> server_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ControllerFuzzer* fuzzer = new ControllerFuzzer();  // lives as long as the process
  fuzzer->Run(data, size);
  return 0;
}
