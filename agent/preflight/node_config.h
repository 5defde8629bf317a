// The slice of cluster.yaml that a node's preflight needs. A thin adapter: it reads only these
// fields with yaml-cpp so preflight works before/without the controller's full ClusterSpec
// (controller/spec). Swap LoadNodePreflightConfig for a conversion from ClusterSpec once that
// library is available to the agent.
//
// Accepted YAML (per-node values override the top-level `nccl:` / `fabric:` defaults):
//   fabric: {mtu: 9000, subnet: 192.168.100.0/24}
//   nccl: {library: /opt/nccl/libnccl.so.2, expected_version: "2.30.4"}
//   nodes:
//     - name: spark1
//       address: 10.0.0.11
//       fabric_ip: 192.168.100.1
//       hca: rocep1s0f0
//       port: 1
//       gid_index: auto        # or an integer
//       netdev: enp1s0f0np0
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace glm::preflight {

struct NodePreflightConfig {
  std::string name;
  std::string address;
  std::string fabric_ip;
  std::string hca;
  int port = 1;
  std::optional<int> gid_index;  // nullopt = auto.
  std::string netdev;
  std::string nccl_library;           // empty = not configured.
  std::string nccl_expected_version;  // "2.30.4"; empty = any.
  int fabric_mtu = 0;                 // 0 = not configured.
  std::string fabric_subnet;
};

// Errors name the file, the line (when yaml-cpp knows it), the field and the fix.
absl::StatusOr<NodePreflightConfig> LoadNodePreflightConfig(const std::string& path,
                                                            const std::string& node_name);
absl::StatusOr<NodePreflightConfig> ParseNodePreflightConfig(const std::string& yaml_text,
                                                             const std::string& node_name,
                                                             const std::string& source_name);

}  // namespace glm::preflight
