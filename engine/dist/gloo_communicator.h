// Communicator for the CPU backend: host memory, collectives by Gloo (libgloo) over its TCP
// transport. No collective logic of ours: Gloo's ring all-reduce, broadcast and barrier, and
// Gloo unbound buffers for point to point.
//
// Setup: a gloo::transport::tcp device bound to `host` (an IP of this node: its fabric IP in
// production, 127.0.0.1 in tests) and a gloo::rendezvous::Context connected as a full mesh
// through a gloo::rendezvous::Store over our Rendezvous; Gloo's keys live under
// `<key_prefix>/gloo/`.
//
// AllReduceSum is Gloo's ring (reduce-scatter, then all-gather of the reduced segments): every
// segment is reduced once, on one rank, and the all-gather copies it, so results are
// bit-identical on every rank. The summation order is the ring's, not a serial loop over ranks:
// the result equals the serial sum only up to fp32 rounding.
//
// Mismatches: Gloo matches messages by slot; every operation's slot carries its kind and count,
// so ranks that issue different operations or counts never match and fail after `op_timeout`
// (instead of reading a message of the wrong size, which Gloo's transport does not check).
//
// Failures: Gloo's exceptions become absl::Status naming the operation, rank and peer(s). A peer
// that closes its connection fails the operation at once; a silent one fails it after
// `op_timeout`. On failure the communicator closes all its connections, so the other ranks fail
// fast too, and stays poisoned.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/dist/communicator.h"
#include "engine/dist/rendezvous.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace glm::engine {

struct GlooCommunicatorOptions {
  int rank = 0;
  int size = 1;
  // Scopes the rendezvous keys: one prefix per group and epoch.
  std::string key_prefix;
  // Numeric IP (v4 or v6) of the interface to bind: the node's fabric IP; 127.0.0.1 in tests.
  std::string host = "127.0.0.1";
  // Bound on setup: waiting for the peers' addresses in the rendezvous and connecting.
  std::chrono::milliseconds connect_timeout{60'000};
  // Gloo's context timeout: an operation that has not completed after this long fails (a stuck
  // or dead peer, or ranks that issued different operations).
  std::chrono::milliseconds op_timeout{60'000};
};

class GlooCommunicator : public Communicator {
 public:
  // Creates the device, publishes this rank's addresses and connects to every other rank; blocks
  // until all ranks have joined or `connect_timeout` passes. `rendezvous` must outlive this call
  // only. Process-wide side effect: SIGPIPE is ignored from then on (Gloo writes to its sockets
  // without MSG_NOSIGNAL, so a peer that dies mid-write would otherwise kill this process
  // instead of failing the operation with an error).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(Rendezvous* rendezvous,
                                                                  GlooCommunicatorOptions options);
  // Closes the connections (peers still using the group fail at once).
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Send(const float* data, size_t count, int peer) override;
  absl::Status Recv(float* data, size_t count, int peer) override;
  absl::Status SendRecv(const float* send, size_t send_count, int send_peer, float* recv,
                        size_t recv_count, int recv_peer) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  absl::Status Barrier() override;
  // Every operation completes before it returns: reports the poisoned state, if any.
  absl::Status Synchronize() override;

 private:
  explicit GlooCommunicator(GlooCommunicatorOptions options);
  absl::Status Usable() const;
  absl::Status CheckPeer(int peer, const char* op) const;
  // Runs `body` (Gloo calls); a Gloo exception poisons the communicator and becomes the status,
  // naming `op` and `peers` (a description of the ranks the operation talks to).
  absl::Status Run(const char* op, const std::string& peers, absl::FunctionRef<void()> body);
  // Ranks whose connection has already failed (asked after an operation failed).
  std::vector<int> BrokenPeers();

  GlooCommunicatorOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;  // Null when size == 1.
  std::shared_ptr<gloo::Context> context_;           // Null when size == 1.
  absl::Status poisoned_;
};

}  // namespace glm::engine
