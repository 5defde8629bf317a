// Brings a node's weights directory to exactly the files its plan needs, each verified against
// the manifest's XXH3-128: files already present and right are kept; missing, truncated or
// corrupted ones are fetched in chunks from peers over gRPC (glm.v1.Agent.FetchFile, served by
// stage_server.h; mTLS with the node's certificate when the cluster has one), resuming from a
// *.partial file after an interruption and from another peer when one goes away; a file is moved
// into place only after its hash matches. Written ranges are dropped from the page cache as they
// go (on GB10 the cache competes with the GPU). Progress (bytes, rate, ETA) goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/manifest/manifest.h"
#include "common/clock.h"
#include "grpcpp/security/credentials.h"

namespace glm::stage {

struct PeerAddress {
  std::string name;  // for messages ("spark-2").
  std::string host;
  uint16_t port = 0;
  std::string tls_name;  // the name in the peer's certificate when it differs from host; "" = host
};

struct StageProgress {
  std::string file;            // the file being fetched.
  uint64_t bytes_done = 0;     // of all files in the plan (present ones count as done).
  uint64_t bytes_total = 0;
  uint64_t bytes_fetched = 0;  // over the network in this run.
  double rate_bytes_per_s = 0;
  double eta_s = -1;           // -1 until a rate is known.
};

struct StageOptions {
  std::string dest_dir;
  cluster::Manifest manifest;
  std::vector<std::string> files;  // the plan (FilesForShard); each must be in the manifest.
  std::vector<PeerAddress> peers;
  uint64_t chunk_bytes = 4 << 20;
  int io_timeout_ms = 10000;
  int rounds = 3;                  // passes over the peer list per file before giving up.
  bool prune = true;               // delete manifest files (and *.partial) the plan does not need.
  Clock* clock = nullptr;          // null = Clock::Real().
  // Called on the calling thread after a chunk when at least `progress_interval` passed since the
  // previous call (0: after every chunk), and always once per completed file.
  std::function<void(const StageProgress&)> on_progress;
  Clock::Duration progress_interval{0};
  // Client credentials for the peers (the node's cluster certificate under mTLS); null = insecure.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // files[0] is the peers' NCCL library (FetchFile nccl_library) rather than a stage-root file.
  bool peers_nccl_library = false;
};

struct StageReport {
  std::vector<std::string> already_present;
  std::vector<std::string> fetched;
  std::vector<std::string> removed;     // pruned.
  std::vector<std::string> discarded;   // local copies that failed verification.
  uint64_t bytes_fetched = 0;
  uint64_t bytes_resumed = 0;           // bytes kept from *.partial files / truncated copies.
  int peer_failures = 0;                // transfers that broke off or returned bad data.
};

// Errors: a plan file not in the manifest (InvalidArgument), a file no peer could supply
// (Unavailable, naming the file and each peer's error), local I/O errors (naming the path).
absl::StatusOr<StageReport> StageFiles(const StageOptions& options);

// A fetch hook for NcclStageOptions::fetch: stages `remote` from `peers` into the given path,
// verified against remote.xxh3_128 and resumable, using a scratch directory beside that path.
// remote.path names a file under the peers' stage root, or is empty for the peers' own NCCL
// library (FetchFile nccl_library). `on_progress` may be null.
std::function<absl::Status(const std::string& out_path)> FetchFromPeers(
    std::vector<PeerAddress> peers, cluster::ManifestFile remote,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
    std::function<void(const StageProgress&)> on_progress = nullptr,
    Clock* clock = nullptr, Clock::Duration progress_interval = Clock::Duration(0));

}  // namespace glm::stage
