// The CUDA backend's stream as a DeviceStream (engine/dist/device_stream.h): what a
// NcclCommunicator enqueues its collectives on, so a TP all-reduce runs behind the layer that
// produced its input with no host wait. Not owned: the backend owns the stream and this object.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"
#include "engine/dist/device_stream.h"

namespace glm::engine::cuda {

class CudaDeviceStream : public DeviceStream {
 public:
  // `stream` belongs to device `device`; the caller keeps it alive while this object is used.
  CudaDeviceStream(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  nccl::Stream handle() const override { return stream_; }
  // cudaStreamQuery: true when done, false on cudaErrorNotReady, else the (sticky) error.
  absl::StatusOr<bool> Query() override;
  // cudaSetDevice(device).
  absl::Status MakeCurrent() override;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from cudaDeviceProp::uuid (nvidia-smi -L's form);
  // empty when the property query fails.
  std::string device_uuid() const override;

 private:
  const int device_;
  const cudaStream_t stream_;
};

// nvidia-smi's spelling of a 16-byte GPU UUID: "GPU-" + 8-4-4-4-12 lower-case hex digits.
std::string FormatGpuUuid(const unsigned char (&bytes)[16]);

}  // namespace glm::engine::cuda
