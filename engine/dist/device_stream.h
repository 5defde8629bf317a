// The device stream a NcclCommunicator enqueues on, seen without CUDA headers: the CUDA backend
// implements it over cudaStream_t / cudaStreamQuery; tests implement it over a fake.
#pragma once

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
};

}  // namespace glm::engine
