#include "engine/dist/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::engine {
namespace {

// NCCL ABI constants (nccl.h; stable since 2.x).
constexpr nccl::Result kSuccess = 0;
constexpr nccl::Result kInProgress = 7;  // ncclInProgress: non-blocking work still running.
constexpr nccl::DataType kFloat32 = 7;   // ncclFloat32.
constexpr nccl::RedOp kSum = 0;          // ncclSum.

const char* ResultName(nccl::Result r) {
  switch (r) {
    case 0: return "ncclSuccess";
    case 1: return "ncclUnhandledCudaError";
    case 2: return "ncclSystemError";
    case 3: return "ncclInternalError";
    case 4: return "ncclInvalidArgument";
    case 5: return "ncclInvalidUsage";
    case 6: return "ncclRemoteError";
    case 7: return "ncclInProgress";
    default: return "ncclResult?";
  }
}

}  // namespace

NcclCommunicator::NcclCommunicator(const nccl::FunctionTable& table, DeviceStream* stream,
                                   NcclCommunicatorOptions options)
    : table_(table), stream_(stream), options_(std::move(options)) {
  if (options_.clock == nullptr) options_.clock = Clock::Real();
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const nccl::FunctionTable& table, DeviceStream* stream, Rendezvous* rendezvous,
    NcclCommunicatorOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("NcclCommunicator: rank ", options.rank,
                                                   " is outside a group of size ", options.size));
  }
  if (stream == nullptr || rendezvous == nullptr) {
    return absl::InvalidArgumentError("NcclCommunicator: stream and rendezvous are required");
  }
  if (table.GetUniqueId == nullptr || table.CommInitRank == nullptr ||
      table.AllReduce == nullptr || table.CommGetAsyncError == nullptr ||
      table.CommAbort == nullptr) {
    return absl::InvalidArgumentError(
        "NcclCommunicator: the NCCL function table is incomplete; load it with "
        "glm::stage::NcclLibrary::Load, which resolves every symbol");
  }
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(table, stream, std::move(options)));
  GLM_RETURN_IF_ERROR(comm->Init(rendezvous));
  return comm;
}

absl::Status NcclCommunicator::Init(Rendezvous* rendezvous) {
  const std::string key = options_.key_prefix + "/nccl_id";
  nccl::UniqueId id{};
  if (options_.rank == 0) {
    nccl::Result r = table_.GetUniqueId(&id);
    if (r != kSuccess) {
      return absl::InternalError(absl::StrCat("ncclGetUniqueId failed on rank 0: ",
                                              table_.GetErrorString(r)));
    }
    GLM_RETURN_IF_ERROR(rendezvous->Put(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    absl::StatusOr<std::string> bytes = rendezvous->Get(key, options_.rendezvous_timeout);
    if (!bytes.ok()) {
      return Annotate(bytes.status(), absl::StrCat("rank ", options_.rank,
                                                   " waiting for rank 0's NCCL unique id"));
    }
    if (bytes->size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("NCCL unique id under '", key, "' has ",
                                              bytes->size(), " bytes, expected ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }
  // ncclCommInitRank(Config) binds the communicator to the calling thread's current device.
  GLM_RETURN_IF_ERROR(Annotate(stream_->MakeCurrent(),
                               absl::StrCat("NCCL rank ", options_.rank,
                                            ": selecting the stream's device")));
  if (table_.CommInitRankConfig != nullptr) return InitNonBlocking(id);
  // NCCL < 2.14 has no ncclCommInitRankConfig: the blocking init, as before it existed. A peer
  // that never joins then fails this rank only after NCCL's bootstrap timeout.
  nccl::Result r = table_.CommInitRank(&comm_, options_.size, id, options_.rank);
  if (r != kSuccess) {
    comm_ = nullptr;
    return absl::UnavailableError(absl::StrCat(
        "ncclCommInitRank failed on rank ", options_.rank, " of ", options_.size, ": ",
        ResultName(r), " (", table_.GetErrorString(r),
        "); check that every rank uses the same NCCL build and can reach rank 0"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::InitNonBlocking(const nccl::UniqueId& id) {
  nccl::Config config;  // every field undefined (NCCL's defaults) but:
  config.blocking = 0;
  nccl::Comm comm = nullptr;
  nccl::Result r = table_.CommInitRankConfig(&comm, options_.size, id, options_.rank, &config);
  const Clock::TimePoint deadline =
      options_.clock->Now() + std::chrono::duration_cast<Clock::Duration>(options_.init_timeout);
  auto backoff = std::chrono::milliseconds(1);
  // ncclInProgress: the bootstrap runs in NCCL's threads; ncclCommGetAsyncError says when it is
  // done (ncclSuccess) or failed.
  while (r == kInProgress) {
    nccl::Result async_error = kInProgress;
    r = table_.CommGetAsyncError(comm, &async_error);
    if (r == kSuccess) r = async_error;
    if (r != kInProgress) break;
    if (options_.clock->Now() >= deadline) {
      table_.CommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL rank ", options_.rank, " of ", options_.size, ": communicator init did not "
          "complete within ", options_.init_timeout.count(), " ms; a peer never joined NCCL's "
          "bootstrap: is every rank up and able to reach rank 0? (communicator aborted; the "
          "group must be restarted)"));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::milliseconds(10));
  }
  if (r != kSuccess) {
    // A non-blocking init that failed may have handed out the half-made communicator.
    if (comm != nullptr) table_.CommAbort(comm);
    return absl::UnavailableError(absl::StrCat(
        "ncclCommInitRankConfig failed on rank ", options_.rank, " of ", options_.size, ": ",
        ResultName(r), " (", table_.GetErrorString(r),
        "); check that every rank uses the same NCCL build and can reach rank 0"));
  }
  comm_ = comm;
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) table_.CommDestroy(comm_);
}

absl::Status NcclCommunicator::Usable() const {
  if (!poisoned_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL communicator (rank ", options_.rank, ") failed earlier: ", poisoned_.message()));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CheckPeer(int peer, const char* op) const {
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": peer ", peer, " is not another rank of ",
                                                   "a group of size ", options_.size,
                                                   " (this is rank ", options_.rank, ")"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (comm_ != nullptr) {
    table_.CommAbort(comm_);
    comm_ = nullptr;
  }
  poisoned_ = status;
  return status;
}

void NcclCommunicator::Abort() {
  if (comm_ == nullptr) return;
  (void)Fail(absl::AbortedError(absl::StrCat("NCCL communicator (rank ", options_.rank,
                                             ") aborted: its group was torn down")));
}

absl::Status NcclCommunicator::Check(nccl::Result result, const char* op) {
  if (result == kSuccess) return absl::OkStatus();
  if (result == kInProgress) return WaitEnqueued(op);
  return Fail(absl::InternalError(absl::StrCat(op, " failed on rank ", options_.rank, ": ",
                                               ResultName(result), " (",
                                               table_.GetErrorString(result), ")")));
}

absl::Status NcclCommunicator::WaitEnqueued(const char* op) {
  // A non-blocking communicator's call returned ncclInProgress: NCCL is still issuing it and must
  // not be called again (on this communicator) until ncclCommGetAsyncError leaves
  // ncclInProgress. This waits for the enqueue only; Synchronize waits for the work.
  const Clock::TimePoint deadline =
      options_.clock->Now() + std::chrono::duration_cast<Clock::Duration>(options_.op_timeout);
  auto backoff = std::chrono::microseconds(20);
  while (true) {
    nccl::Result async_error = kInProgress;
    nccl::Result r = table_.CommGetAsyncError(comm_, &async_error);
    if (r == kSuccess) r = async_error;
    if (r == kSuccess) return absl::OkStatus();
    if (r != kInProgress) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "NCCL rank ", options_.rank, " of ", options_.size, ": ", op, " failed while being "
          "issued: ", ResultName(r), " (", table_.GetErrorString(r),
          "); a peer died or its link failed; the group must be restarted")));
    }
    if (options_.clock->Now() >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "NCCL rank ", options_.rank, " of ", options_.size, ": ", op, " was still being issued "
          "after ", options_.op_timeout.count(), " ms; a peer is stuck or dead (communicator "
          "aborted; the group must be restarted)")));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::microseconds>(backoff * 2, std::chrono::microseconds(200));
  }
}

absl::Status NcclCommunicator::AllReduceSum(float* data, size_t count) {
  GLM_RETURN_IF_ERROR(Usable());
  if (count == 0) return absl::OkStatus();
  return Check(table_.AllReduce(data, data, count, kFloat32, kSum, comm_, stream_->handle()),
               "ncclAllReduce");
}

absl::Status NcclCommunicator::Send(const float* data, size_t count, int peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(peer, "Send"));
  if (count == 0) return absl::OkStatus();
  return Check(table_.Send(data, count, kFloat32, peer, comm_, stream_->handle()), "ncclSend");
}

absl::Status NcclCommunicator::Recv(float* data, size_t count, int peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(peer, "Recv"));
  if (count == 0) return absl::OkStatus();
  return Check(table_.Recv(data, count, kFloat32, peer, comm_, stream_->handle()), "ncclRecv");
}

absl::Status NcclCommunicator::SendRecv(const float* send, size_t send_count, int send_peer,
                                        float* recv, size_t recv_count, int recv_peer) {
  GLM_RETURN_IF_ERROR(Usable());
  GLM_RETURN_IF_ERROR(CheckPeer(send_peer, "SendRecv"));
  GLM_RETURN_IF_ERROR(CheckPeer(recv_peer, "SendRecv"));
  // NCCL needs a send and a recv that pair up across ranks in one group, or both sides block in
  // their send kernel waiting for the other's recv.
  GLM_RETURN_IF_ERROR(Check(table_.GroupStart(), "ncclGroupStart"));
  nccl::Result rs = send_count == 0 ? kSuccess
                                    : table_.Send(send, send_count, kFloat32, send_peer, comm_,
                                                  stream_->handle());
  nccl::Result rr = recv_count == 0 ? kSuccess
                                    : table_.Recv(recv, recv_count, kFloat32, recv_peer, comm_,
                                                  stream_->handle());
  nccl::Result re = table_.GroupEnd();
  GLM_RETURN_IF_ERROR(Check(rs, "ncclSend (grouped)"));
  GLM_RETURN_IF_ERROR(Check(rr, "ncclRecv (grouped)"));
  return Check(re, "ncclGroupEnd");
}

absl::Status NcclCommunicator::Broadcast(float* data, size_t count, int root) {
  GLM_RETURN_IF_ERROR(Usable());
  if (root < 0 || root >= options_.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " outside a group of size ", options_.size));
  }
  if (count == 0) return absl::OkStatus();
  return Check(
      table_.Broadcast(data, data, count, kFloat32, root, comm_, stream_->handle()),
      "ncclBroadcast");
}

absl::Status NcclCommunicator::Barrier() {
  GLM_RETURN_IF_ERROR(Usable());
  if (options_.barrier_scratch == nullptr) {
    return absl::FailedPreconditionError(
        "NcclCommunicator::Barrier needs options.barrier_scratch (device memory for 1 float)");
  }
  GLM_RETURN_IF_ERROR(AllReduceSum(options_.barrier_scratch, 1));
  return Synchronize();
}

absl::Status NcclCommunicator::Synchronize() {
  GLM_RETURN_IF_ERROR(Usable());
  const Clock::TimePoint deadline =
      options_.clock->Now() + std::chrono::duration_cast<Clock::Duration>(options_.op_timeout);
  auto backoff = std::chrono::microseconds(20);
  while (true) {
    absl::StatusOr<bool> done = stream_->Query();
    if (!done.ok()) {
      return Fail(Annotate(done.status(), absl::StrCat("NCCL rank ", options_.rank,
                                                       ": the device stream failed")));
    }
    if (*done) return absl::OkStatus();
    nccl::Result async_error = kSuccess;
    nccl::Result r = table_.CommGetAsyncError(comm_, &async_error);
    if (r == kSuccess && async_error != kSuccess && async_error != kInProgress) r = async_error;
    if (r != kSuccess && r != kInProgress) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "NCCL rank ", options_.rank, " of ", options_.size, ": asynchronous error ",
          ResultName(r), " (", table_.GetErrorString(r),
          "); a peer died or its link failed; the group must be restarted")));
    }
    if (options_.clock->Now() >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "NCCL rank ", options_.rank, " of ", options_.size, ": issued work did not complete "
          "within ", options_.op_timeout.count(), " ms; a peer is stuck or dead (communicator "
          "aborted; the group must be restarted)")));
    }
    std::this_thread::sleep_for(backoff);
    // Capped low: the model waits here once per step (tp.h Finish), so the cap bounds what the
    // poll adds to a step's latency; a query costs about a microsecond.
    backoff = std::min<std::chrono::microseconds>(backoff * 2, std::chrono::microseconds(200));
  }
}

}  // namespace glm::engine
