// Collectives between the ranks of one shard group (a TP group, or two neighbouring PP stages).
// Layers never call NCCL or sockets directly; they call a Communicator.
//
// Contract (all implementations):
// - Memory: NcclCommunicator takes device memory (on the CUDA device its stream belongs to);
//   GlooCommunicator takes host memory. `count` is in fp32 elements; 0 is a no-op.
// - Ordering: operations are issued in program order. NcclCommunicator enqueues them on the
//   backend's stream, so later kernels on that stream see the result without a host wait, and
//   returns before they complete; Synchronize() waits for completion. GlooCommunicator completes
//   each operation before returning (Synchronize() is then a no-op that reports the poisoned
//   state, if any).
// - Every rank of the group must issue the same sequence of collectives with the same counts
//   (and matching Send/Recv pairs); a mismatch is detected where the transport can (Gloo: each
//   operation's slot carries its kind and count, so mismatched ranks never match and fail at the
//   timeout) and is an error, never silent corruption.
// - Errors are absl::Status and fail fast: a dead or stuck peer, a timeout, or a transport error
//   poisons the communicator (every later call returns the first error) so the engine stops and
//   reports, and the agent restarts the group. Nothing retries or limps on.
// - Thread-safety: one thread at a time (the engine's step thread). Not copyable.
// - AllReduceSum results are bit-identical on every rank.
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace glm::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the data pointers are device memory (NcclCommunicator: on its stream's device) or
  // host memory (every other implementation). Callers holding device activations pass them
  // directly when true and stage them through host memory when false (engine/model/tp.h).
  virtual bool DeviceMemory() const { return false; }

  // In place: data[i] = sum over ranks of data[i] (fp32).
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // Point to point; the peer issues the matching Recv / Send with the same count.
  virtual absl::Status Send(const float* data, size_t count, int peer) = 0;
  virtual absl::Status Recv(float* data, size_t count, int peer) = 0;
  // Sends `send` to `send_peer` and receives `recv` from `recv_peer` at once: deadlock-free when
  // peers exchange with each other (the pattern NCCL needs grouped). Buffers must not overlap.
  virtual absl::Status SendRecv(const float* send, size_t send_count, int send_peer, float* recv,
                                size_t recv_count, int recv_peer) = 0;
  // In place: every rank's data becomes root's.
  virtual absl::Status Broadcast(float* data, size_t count, int root) = 0;
  // Returns when every rank has entered the barrier and everything issued before it completed.
  virtual absl::Status Barrier() = 0;
  // Waits until every operation issued so far has completed (device backends); bounded by the
  // implementation's timeout.
  virtual absl::Status Synchronize() = 0;
};

}  // namespace glm::engine
