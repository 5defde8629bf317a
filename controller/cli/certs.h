// `glmctl certs --out DIR cluster.yaml`: a cluster CA and one certificate per identity, with
// OpenSSL (EC P-256, SHA-256). Writes, all PEM:
//   ca.pem ca.key                  cluster CA (keep ca.key offline once nodes have their certs)
//   controller.pem controller.key  SANs: controller.listen's host (+ loopback and this host's
//                                  name when it listens on 0.0.0.0)
//   <node>.pem <node>.key          SANs: every address a peer or the controller dials: the
//                                  node's agent host and its fabric_ip (+ loopback)
//   operator.pem operator.key      the operator's glmctl (client auth only, no SANs)
// The controller and node certificates are good for both server and client auth (mTLS in both
// directions). Each leaf's subject is O=glmctl, OU=<role>, CN=<name>, where the role is
// controller, agent (every node) or operator: the servers allow each role its RPCs only
// (proto/rpc/authz.h has the table). Node names "ca", "controller" and "operator" are refused
// (their files would collide). Leaves are valid for `valid_days` (90 by default), the CA for
// `ca_valid_days`; `glmctl certs --renew` re-issues every leaf from the CA already in DIR
// (ca.pem and ca.key kept, leaves replaced). Keys are written 0600. An existing CA is not
// replaced unless `overwrite` (--force).
//
// glmctl presents OperatorTlsFiles(controller.tls) to the controller: operator.pem/.key from the
// directory of controller.tls.ca when both exist, else controller.tls itself (the controller's
// own certificate, role controller). The fallback keeps a cluster whose certificate directory has
// no operator.pem working unchanged; re-running `glmctl certs` gives the CLI its own, narrower
// identity (it can no longer call agents directly).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/orchestrate/topology.h"
#include "glm/v1/controller.pb.h"
#include "proto/rpc/credentials.h"

namespace glm::cli {

struct CertsOptions {
  std::string out_dir;
  int valid_days = 90;        // leaf certificates
  int ca_valid_days = 1825;   // the CA (outlives many renewals)
  bool overwrite = false;     // replace an existing CA and everything (--force)
  bool renew = false;         // keep DIR's CA, re-issue the leaves (--renew)
};

// Returns the paths written (for the CLI to print).
absl::StatusOr<std::vector<std::string>> MakeClusterCerts(
    const orchestrate::ClusterTopology& topology, const CertsOptions& options);

// Issues one leaf certificate from the CA in `dir` (ca.pem, ca.key): CN `name`, subject OU
// `role` (empty: no role), SANs `hosts`; writes <dir>/<name>.pem and .key, replacing them.
absl::StatusOr<std::vector<std::string>> IssueLeafCert(const std::string& dir,
                                                       const std::string& name,
                                                       const std::string& role,
                                                       const std::vector<std::string>& hosts,
                                                       int valid_days);

// `glmctl status` lines for a controller certificate or CA that expires within 14 days (or has
// expired), each naming the fix; empty otherwise or without TLS.
std::vector<std::string> CertificateExpiryWarnings(const glm::v1::ClusterStatus& status);

// The files glmctl presents to the controller (see above).
rpc::TlsFiles OperatorTlsFiles(const rpc::TlsFiles& controller_tls);

// Host part of "host:port" / "[v6]:port".
std::string HostOf(const std::string& address);

}  // namespace glm::cli
