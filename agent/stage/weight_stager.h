// Brings a node's weights directory to exactly the files its plan needs, each verified against
// the manifest's XXH3-128: files already present and right are kept; missing, truncated or
// corrupted ones are fetched in chunks from peers (stage_server.h), resuming from a *.partial
// file after an interruption and from another peer when one goes away; a file is moved into
// place only after its hash matches. Written ranges are dropped from the page cache as they go
// (on GB10 the cache competes with the GPU). Progress (bytes, rate, ETA) goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/stage/manifest.h"
#include "common/clock.h"

namespace glm::stage {

struct PeerAddress {
  std::string name;  // for messages ("spark-2").
  std::string host;
  uint16_t port = 0;
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
  Manifest manifest;
  std::vector<std::string> files;  // the plan (FilesForShard); each must be in the manifest.
  std::vector<PeerAddress> peers;
  uint64_t chunk_bytes = 4 << 20;
  int io_timeout_ms = 10000;
  int rounds = 3;                  // passes over the peer list per file before giving up.
  bool prune = true;               // delete manifest files (and *.partial) the plan does not need.
  Clock* clock = nullptr;          // null = Clock::Real().
  // Called after every chunk and once per file completion, on the calling thread.
  std::function<void(const StageProgress&)> on_progress;
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

// A fetch hook for NcclStageOptions::fetch: stages `remote` (a file a peer serves, e.g. the
// pinned libnccl.so.2 under the source's served directory) from `peers` into the given path,
// verified against remote.xxh3_128 and resumable, using a scratch directory beside that path.
std::function<absl::Status(const std::string& out_path)> FetchFromPeers(
    std::vector<PeerAddress> peers, ManifestFile remote);

}  // namespace glm::stage
