// Which transport a pipeline stage's TP group all-reduces over. NCCL between GPUs, Gloo between
// CPU ranks, and the host path (Gloo, the activations staged through host memory: engine/model/
// tp.h) for GPU ranks that cannot use NCCL: a rank without the NCCL library, or two ranks on one
// GPU (a test machine; NCCL refuses duplicate GPUs in one communicator). No home-made collective
// either way.
//
// Every rank of the group publishes its TpRankDevice in the rendezvous (StageGroup::Create, key
// <group_key>/pipeline/tp<pp_rank>/device/<tp_rank>), reads every rank's, and calls
// ChooseTpTransport on the same list in tp-rank order: all ranks reach the same choice without
// another exchange. The world, control and result groups stay Gloo (host metadata and the PP
// activation hand-offs, stage_group.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::engine::pipeline {

// What one TP rank brings to the choice.
struct TpRankDevice {
  std::string backend;      // Backend::name(): "cpu", "cuda"
  // The GPU the rank's backend stream runs on (DeviceStream::device_uuid: "GPU-<uuid>", unique
  // across hosts); empty on a backend without a device stream.
  std::string device_uuid;
  int nccl_version = 0;     // ncclGetVersion of the library this rank holds; 0 = none

  // "backend=cuda;gpu=GPU-...;nccl=23004", what the rendezvous holds.
  std::string Encode() const;
  // Encode's inverse; DataLoss naming the text when it is not one.
  static absl::StatusOr<TpRankDevice> Decode(const std::string& text);
};

enum class TpTransport { kGloo, kNccl };

struct TpTransportChoice {
  TpTransport transport = TpTransport::kGloo;
  // Why not NCCL ("rank 1 runs the cpu backend", "host path: ranks 0 and 1 share GPU
  // GPU-..."); empty for NCCL.
  std::string reason;

  bool nccl() const { return transport == TpTransport::kNccl; }
  // "nccl", or "gloo (<reason>)": the log line's and ShardStatus.tp_transport's text.
  std::string Describe() const;
};

// NCCL when, and only when, every rank (ranks[i] is tp rank i; at least two) runs the cuda
// backend, reports its GPU, holds an NCCL library of the same version as the others, and no
// two ranks share a GPU; else Gloo, with the first reason found in that order.
TpTransportChoice ChooseTpTransport(const std::vector<TpRankDevice>& ranks);

}  // namespace glm::engine::pipeline
