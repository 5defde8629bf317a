#include "controller/orchestrate/logs_forward.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glm/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace glm::orchestrate {
namespace {

std::string AgentFix(const std::string& node, const std::string& address) {
  return absl::StrCat("Fix: check that glm-agent runs on node ", node, " and listens on ", address,
                      " (nodes[].agent in cluster.yaml; `glmctl status` shows the node's state), "
                      "start it (systemctl start glm-agent, or `glmctl up cluster.yaml` for a "
                      "local cluster), then retry");
}

// Cancels `client` once `cancelled` says so, until Stop(); checks every few milliseconds so a
// Ctrl-C of glmctl ends the agent's stream promptly.
class CancelPropagator {
 public:
  CancelPropagator(grpc::ClientContext* client, const std::function<bool()>& cancelled)
      : thread_([this, client, &cancelled] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!done_) {
            if (cancelled()) {
              client->TryCancel();
              return;
            }
            cv_.wait_for(lock, std::chrono::milliseconds(20));
          }
        }) {}
  ~CancelPropagator() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started after the members it uses
};

}  // namespace

grpc::Status ForwardLogs(const glm::v1::ClusterLogsRequest& request,
                         const glm::v1::ClusterStatus& cluster, GrpcAgentClientFactory& channels,
                         const LogRing& own_ring, const std::function<bool()>& cancelled,
                         const std::function<bool(const glm::v1::LogLine&)>& write,
                         const LogsForwardOptions& options) {
  if (request.tail_lines() < 0) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("logs: tail_lines ", request.tail_lines(), " is negative; give 0 (the last ",
                     kDefaultLogTailLines, " lines) or a positive count"));
  }
  if (request.node() == kControllerLogsNode) {
    StreamLogRing(
        own_ring,
        {.tail_lines = request.tail_lines(), .follow = request.follow(), .poll = options.poll},
        [&](const LogRing::Line& line, int64_t dropped_before) {
          glm::v1::LogLine out;
          out.set_seq(line.seq);
          out.set_text(line.text);
          out.set_dropped_before(dropped_before);
          return write(out);
        },
        cancelled);
    return grpc::Status::OK;
  }

  const glm::v1::NodeStatus* node = nullptr;
  std::vector<std::string> known = {kControllerLogsNode};
  for (const glm::v1::NodeStatus& n : cluster.nodes()) {
    known.push_back(n.name());
    if (n.name() == request.node()) node = &n;
  }
  if (node == nullptr) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("no node '", request.node(), "' in cluster '", cluster.cluster_name(),
                     "'; known: ", absl::StrJoin(known, ", "),
                     ". Fix: give one of these names (nodes[].name in cluster.yaml)"));
  }
  const std::string& name = node->name();
  const std::string& address = node->address();
  auto channel = channels.Channel(address);
  if (!channel.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", name, " (agent at ", address,
                                     "): cannot make the controller's channel: ",
                                     std::string(channel.status().message())));
  }
  if (!(*channel)->WaitForConnected(std::chrono::system_clock::now() + options.connect_timeout)) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("node ", name, ": its agent at ", address,
                     " cannot be reached (no connection within ", options.connect_timeout.count(),
                     " ms). ", AgentFix(name, address)));
  }

  auto stub = glm::v1::Agent::NewStub(*channel);
  grpc::ClientContext client;
  glm::v1::LogsRequest forwarded;
  forwarded.set_tail_lines(request.tail_lines());
  forwarded.set_follow(request.follow());
  CancelPropagator propagate(&client, cancelled);
  auto reader = stub->Logs(&client, forwarded);
  glm::v1::LogLine line;
  bool caller_gone = false;
  while (reader->Read(&line)) {
    if (!write(line)) {
      caller_gone = true;
      client.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  propagate.Stop();
  if (s.ok()) return s;
  if (caller_gone || cancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
  }
  switch (s.error_code()) {
    case grpc::StatusCode::UNIMPLEMENTED:
      return grpc::Status(s.error_code(),
                          absl::StrCat("node ", name, ": the glm-agent at ", address,
                                       " has no Logs RPC (an older build). Fix: upgrade "
                                       "glm-agent on ", name, " to the controller's version"));
    case grpc::StatusCode::UNAVAILABLE:
      return grpc::Status(
          s.error_code(),
          absl::StrCat("node ", name, ": the log stream from its agent at ", address,
                       " broke: ", s.error_message(), ". ", AgentFix(name, address)));
    default:
      return grpc::Status(s.error_code(), absl::StrCat("node ", name, " (agent at ", address,
                                                       "): ", s.error_message()));
  }
}

}  // namespace glm::orchestrate
