// Communicator over NCCL called through a FunctionTable (the library the agent dlopen'ed and
// version-checked), so the engine neither includes nccl.h nor links libnccl.
//
// Setup: rank 0 calls ncclGetUniqueId and publishes the 128 bytes under `<key_prefix>/nccl_id`;
// the others read it from the Rendezvous; every rank calls ncclCommInitRankConfig with
// blocking = 0 and polls ncclCommGetAsyncError until NCCL's bootstrap completes, so a peer that
// never joins fails init within `init_timeout` (the communicator stays non-blocking after).
// Fail fast: Synchronize() polls the stream and ncclCommGetAsyncError until the work completes;
// an async error (a peer died: ncclRemoteError / ncclSystemError) or `op_timeout` without
// completion aborts the communicator (ncclCommAbort) and poisons it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "engine/dist/communicator.h"
#include "engine/dist/device_stream.h"
#include "engine/dist/nccl_table.h"
#include "engine/dist/rendezvous.h"

namespace glm::engine {

struct NcclCommunicatorOptions {
  int rank = 0;
  int size = 1;
  // Scopes the rendezvous keys: one prefix per group and epoch ("tp/replica0/stage1/epoch3").
  std::string key_prefix;
  // How long rank != 0 waits for rank 0's unique id.
  std::chrono::milliseconds rendezvous_timeout{60'000};
  // How long NCCL's bootstrap may take once this rank has the unique id: every rank must have
  // called Create by then, else init aborts with DeadlineExceeded (NCCL alone would wait for its
  // bootstrap timeout, minutes). Not enforced with an NCCL older than 2.14 (blocking init).
  std::chrono::milliseconds init_timeout{60'000};
  // Longest an issued operation may stay incomplete in Synchronize() before the group is declared
  // dead (NCCL's own default is 30 minutes). Must exceed the slowest legitimate wait on a peer.
  std::chrono::milliseconds op_timeout{60'000};
  // Device scratch of >= 1 float for Barrier() (an all-reduce of one element).
  float* barrier_scratch = nullptr;
  Clock* clock = nullptr;  // Clock::Real() when null.
};

class NcclCommunicator : public Communicator {
 public:
  // `table` is copied; the library it came from must outlive the communicator. `stream` and
  // `rendezvous` must outlive this call; `stream` must outlive every operation but the
  // destructor (which calls ncclCommDestroy only). Makes the stream's device current
  // (DeviceStream::MakeCurrent: the communicator binds to the current device), then waits until
  // every rank has joined (NCCL's bootstrap), at most options.init_timeout: DeadlineExceeded
  // (communicator aborted) when a peer never joins, Unavailable when NCCL reports an error.
  // With an NCCL older than 2.14 (table.CommInitRankConfig null) it blocks in ncclCommInitRank
  // instead, up to NCCL's own bootstrap timeout.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const nccl::FunctionTable& table, DeviceStream* stream, Rendezvous* rendezvous,
      NcclCommunicatorOptions options);
  // ncclCommDestroy when healthy (already aborted when poisoned).
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  bool DeviceMemory() const override { return true; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Send(const float* data, size_t count, int peer) override;
  absl::Status Recv(float* data, size_t count, int peer) override;
  absl::Status SendRecv(const float* send, size_t send_count, int send_peer, float* recv,
                        size_t recv_count, int recv_peer) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  absl::Status Barrier() override;
  absl::Status Synchronize() override;
  // Aborts the communicator (ncclCommAbort: NCCL kernels waiting on a peer exit) and poisons it;
  // later calls fail. For tearing down a failed group, whose peers may never arrive (the
  // destructor's ncclCommDestroy may wait for them). No-op when already aborted.
  void Abort();

 private:
  NcclCommunicator(const nccl::FunctionTable& table, DeviceStream* stream,
                   NcclCommunicatorOptions options);
  absl::Status Init(Rendezvous* rendezvous);
  // ncclCommInitRankConfig (blocking = 0), then polls until init completes or init_timeout.
  absl::Status InitNonBlocking(const nccl::UniqueId& id);
  // OK, or the poisoned status.
  absl::Status Usable() const;
  absl::Status CheckPeer(int peer, const char* op) const;
  // Turns a failed NCCL call into a poisoned, aborted communicator; returns the error.
  // ncclInProgress (a non-blocking enqueue still being issued) is polled to completion first,
  // within op_timeout, as NCCL requires before the next call.
  absl::Status Check(nccl::Result result, const char* op);
  absl::Status WaitEnqueued(const char* op);
  absl::Status Fail(absl::Status status);

  nccl::FunctionTable table_;
  DeviceStream* stream_;
  NcclCommunicatorOptions options_;
  nccl::Comm comm_ = nullptr;
  absl::Status poisoned_;
};

}  // namespace glm::engine
