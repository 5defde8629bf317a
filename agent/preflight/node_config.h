// The slice of cluster.yaml that a node's preflight needs, taken from the ClusterSpec
// (cluster/spec, library glm_cluster_spec) so the agent and glmctl read the YAML the same way:
// node_defaults applied, sizes/paths validated, errors as file:line:column.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cluster/spec/cluster_spec.h"

namespace glm::preflight {

struct NodePreflightConfig {
  std::string name;
  std::string address;                // agent host:port
  std::string fabric_ip;
  std::string hca;
  int port = 1;
  std::optional<int> gid_index;       // nullopt = auto.
  std::string netdev;
  std::string nccl_library;           // empty = not configured.
  std::string nccl_expected_version;  // "2.30.4"; empty = any.
  int fabric_mtu = 0;                 // 0 = not configured.
  std::string fabric_subnet;
};

NodePreflightConfig NodePreflightConfigFromSpec(const cluster::ClusterSpec& spec,
                                                const cluster::NodeSpec& node);

// LoadClusterSpec(path), then the node named `node_name`. NotFound lists the node names.
absl::StatusOr<NodePreflightConfig> LoadNodePreflightConfig(const std::string& path,
                                                            const std::string& node_name);

}  // namespace glm::preflight
