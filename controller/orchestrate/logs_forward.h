// Controller.Logs: one daemon's recent log lines for `glmctl logs`. Node "controller" is served
// from this process's ring; a node of the cluster is forwarded to its agent's Agent.Logs over the
// controller's channel (mTLS when configured), and the caller's cancel ends the agent's stream.
// Each daemon serves only its own in-memory ring (common/log_ring.h): no file, no command.
#pragma once

#include <chrono>
#include <functional>

#include "common/log_ring.h"
#include "controller/orchestrate/grpc_agent_client.h"
#include "glm/v1/controller.pb.h"
#include "grpcpp/support/status.h"

namespace glm::orchestrate {

// The name that means the controller itself (a cluster node of that name is not reachable
// through Logs; cluster.yaml names are usually node-N or host names).
inline constexpr char kControllerLogsNode[] = "controller";

struct LogsForwardOptions {
  // How long the agent's channel may take to connect before the call fails UNAVAILABLE.
  std::chrono::milliseconds connect_timeout{5000};
  // Longest wait between two checks of `cancelled` (while following).
  std::chrono::milliseconds poll{200};
};

// Serves `request` to `write` (one LogLine; false when the caller went away). `cluster`: the
// controller's snapshot (ClusterState::Snapshot(); its nodes give names and agent addresses).
// `cancelled`: the caller cancelled (ServerContext::IsCancelled). Blocks until the stream ends:
// at once without follow, else when the caller cancels, the agent ends it, or it breaks.
// Errors: INVALID_ARGUMENT for a negative tail; NOT_FOUND for an unknown node (naming the known
// ones); UNAVAILABLE when the agent cannot be reached (naming node, address and the fix);
// anything else the agent returns, prefixed with the node and address.
grpc::Status ForwardLogs(const glm::v1::ClusterLogsRequest& request,
                         const glm::v1::ClusterStatus& cluster, GrpcAgentClientFactory& channels,
                         const LogRing& own_ring, const std::function<bool()>& cancelled,
                         const std::function<bool(const glm::v1::LogLine&)>& write,
                         const LogsForwardOptions& options = {});

}  // namespace glm::orchestrate
