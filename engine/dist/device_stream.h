// The device stream a NcclCommunicator enqueues on, seen without CUDA headers: the CUDA backend
// implements it over cudaStream_t / cudaStreamQuery; tests implement it over a fake.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/dist/nccl_table.h"

namespace glm::engine {

class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // The cudaStream_t passed to NCCL (nullptr is the legacy default stream).
  virtual nccl::Stream handle() const = 0;
  // true when all work enqueued so far has finished, false while some is pending; an error when
  // the stream itself failed (a sticky CUDA error).
  virtual absl::StatusOr<bool> Query() = 0;
  // Makes the stream's device the calling thread's current device (cudaSetDevice): a NCCL
  // communicator binds to the current device when it is created. OK and nothing by default.
  virtual absl::Status MakeCurrent() { return absl::OkStatus(); }
  // The GPU this stream runs on, unique across hosts ("GPU-<uuid>" as nvidia-smi -L prints it);
  // two ranks whose streams report the same id share one GPU. Empty when unknown (fakes).
  virtual std::string device_uuid() const { return ""; }
};

}  // namespace glm::engine
