#include "agent/preflight/node_config.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace glm::preflight {

NodePreflightConfig NodePreflightConfigFromSpec(const cluster::ClusterSpec& spec,
                                                const cluster::NodeSpec& node) {
  NodePreflightConfig c;
  c.name = node.name;
  c.address = node.agent;
  c.fabric_ip = node.fabric_ip;
  c.hca = node.hca;
  c.port = node.port;
  c.gid_index = node.gid_index;
  c.netdev = node.netdev;
  c.nccl_library = spec.nccl.library.empty() ? "" : spec.ResolvePath(spec.nccl.library);
  c.nccl_expected_version = spec.nccl.expected_version;
  c.fabric_mtu = spec.fabric.mtu.value_or(0);
  c.fabric_subnet = spec.fabric.subnet;
  return c;
}

absl::StatusOr<NodePreflightConfig> LoadNodePreflightConfig(const std::string& path,
                                                            const std::string& node_name) {
  absl::StatusOr<cluster::ClusterSpec> spec = cluster::LoadClusterSpec(path);
  if (!spec.ok()) return spec.status();
  std::vector<std::string> names;
  for (const cluster::NodeSpec& node : spec->nodes) {
    if (node.name == node_name) return NodePreflightConfigFromSpec(*spec, node);
    names.push_back(node.name);
  }
  return absl::NotFoundError(absl::StrCat(path, ": no node named '", node_name,
                                          "' in nodes: (have: ", absl::StrJoin(names, ", "),
                                          "); fix --node"));
}

}  // namespace glm::preflight
