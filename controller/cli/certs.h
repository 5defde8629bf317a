// `glmctl certs --out DIR cluster.yaml`: a cluster CA and one certificate per identity, with
// OpenSSL (EC P-256, SHA-256). Writes, all PEM:
//   ca.pem ca.key                  cluster CA (keep ca.key offline once nodes have their certs)
//   controller.pem controller.key  SANs: controller.listen's host (+ loopback and this host's
//                                  name when it listens on 0.0.0.0)
//   <node>.pem <node>.key          SANs: the node's agent host (+ loopback)
// Every leaf certificate is good for both server and client auth (mTLS in both directions).
// Keys are written 0600. Existing files are not overwritten unless `overwrite`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/orchestrate/topology.h"

namespace glm::cli {

struct CertsOptions {
  std::string out_dir;
  int valid_days = 825;
  bool overwrite = false;
};

// Returns the paths written (for the CLI to print).
absl::StatusOr<std::vector<std::string>> MakeClusterCerts(
    const orchestrate::ClusterTopology& topology, const CertsOptions& options);

// Host part of "host:port" / "[v6]:port".
std::string HostOf(const std::string& address);

}  // namespace glm::cli
