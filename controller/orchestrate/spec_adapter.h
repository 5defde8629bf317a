// Glue from the spec and plan libraries (controller/spec, controller/plan) to the orchestrator's
// ClusterTopology. Only controller main and glmctl link this; the state machine and its tests do
// not depend on the YAML schema.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "controller/orchestrate/steps.h"
#include "controller/orchestrate/topology.h"
#include "controller/spec/cluster_spec.h"

namespace glm::orchestrate {

// TLS paths resolved against the YAML's directory; nodes in YAML order.
ClusterTopology TopologyFromSpec(const controller::ClusterSpec& spec, const std::string& path);

// LoadClusterSpec + TopologyFromSpec, plus each node's disk and memory needs from the plan when
// it can be made (preflight checks them).
absl::StatusOr<ClusterTopology> LoadTopology(const std::string& path);

// Replicas (node names in rank order) and a one-line summary from controller/plan.
absl::StatusOr<PlanStep::Outcome> PlanReplicas(const std::string& config_path,
                                               const ClusterTopology& topology);

// The source's weight manifest (JSON) when model.path is a directory on this machine (the
// controller runs on the source node, or the local demo); "" otherwise. Hashes every file.
absl::StatusOr<std::string> SourceManifestJson(const ClusterTopology& topology);

// `glmctl plan` output: PlanToText, or PlanToJson when `json`.
absl::StatusOr<std::string> PlanText(const std::string& config_path, bool json);

// Where a node's agent certificate lives when the cluster uses mTLS: beside the CA, named after
// the node (as `glmctl certs` writes them): <ca dir>/<node>.pem and <ca dir>/<node>.key.
rpc::TlsFiles NodeTlsFiles(const ClusterTopology& topology, const std::string& node);

}  // namespace glm::orchestrate
