// Glue from the spec and plan libraries (cluster/spec, controller/plan) to the orchestrator's
// ClusterTopology. Only controller main and glmctl link this; the state machine and its tests do
// not depend on the YAML schema.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cluster/spec/cluster_spec.h"
#include "controller/orchestrate/nccl_source.h"
#include "controller/orchestrate/steps.h"
#include "controller/orchestrate/topology.h"

namespace glm::cluster {
class HashCache;
}  // namespace glm::cluster

namespace glm::orchestrate {

// TLS paths resolved against the YAML's directory; nodes in YAML order.
ClusterTopology TopologyFromSpec(const cluster::ClusterSpec& spec, const std::string& path);

// LoadClusterSpec + TopologyFromSpec, plus each node's disk and memory needs from the plan when
// it can be made (preflight checks them).
absl::StatusOr<ClusterTopology> LoadTopology(const std::string& path);

// Replicas (node names in rank order) and a one-line summary from controller/plan.
absl::StatusOr<PlanStep::Outcome> PlanReplicas(const std::string& config_path,
                                               const ClusterTopology& topology);

// The source's weight manifest (JSON) when model.path is a directory on this machine (the
// controller runs on the source node, or the local demo); "" otherwise. Hashes through `cache`
// (re-reading only files whose size, mtime or inode changed) and saves it; null: hashes every
// file.
absl::StatusOr<std::string> SourceManifestJson(const ClusterTopology& topology,
                                               cluster::HashCache* cache = nullptr);

// The controller host's copy of the pinned NCCL build: nccl.source, else nccl.library, when that
// file exists here (nullopt otherwise, or when no library is configured); hashed through `cache`.
absl::StatusOr<std::optional<NcclSourceFile>> ControllerNcclSource(
    const ClusterTopology& topology, cluster::HashCache* cache = nullptr);

// Where the controller keeps its state (the hash cache): `flag` (--state-dir) when set, else the
// first writable of <cluster.yaml dir>/.glmctl/<cluster> (the run dir glmctl uses),
// $XDG_CACHE_HOME/glmctl/<cluster>, ~/.cache/glmctl/<cluster>; "" when none is (no cache).
std::string ControllerStateDir(const ClusterTopology& topology, const std::string& flag);

// `glmctl plan` output: PlanToText, or PlanToJson when `json`.
absl::StatusOr<std::string> PlanText(const std::string& config_path, bool json);

// Where a node's agent certificate lives when the cluster uses mTLS: beside the CA, named after
// the node (as `glmctl certs` writes them): <ca dir>/<node>.pem and <ca dir>/<node>.key.
rpc::TlsFiles NodeTlsFiles(const ClusterTopology& topology, const std::string& node);

}  // namespace glm::orchestrate
