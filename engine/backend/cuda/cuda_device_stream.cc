#include "engine/backend/cuda/cuda_device_stream.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend/cuda/cuda_devices.h"

namespace glm::engine::cuda {

absl::StatusOr<bool> CudaDeviceStream::Query() {
  const cudaError_t err = cudaStreamQuery(stream_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error; keep it out of the next launch check
    return false;
  }
  return absl::InternalError(absl::StrCat("cudaStreamQuery on device ", device_, ": ",
                                          cudaGetErrorString(err)));
}

absl::Status CudaDeviceStream::MakeCurrent() {
  if (const cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaSetDevice(", device_, "): ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

std::string CudaDeviceStream::device_uuid() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  unsigned char bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<unsigned char>(prop.uuid.bytes[i]);
  return FormatGpuUuid(bytes);
}

absl::StatusOr<int> VisibleDeviceCount() {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err)));
  }
  return count;
}

std::string FormatGpuUuid(const unsigned char (&b)[16]) {
  std::string hex;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex.push_back('-');
    absl::StrAppendFormat(&hex, "%02x", b[i]);
  }
  return "GPU-" + hex;
}

}  // namespace glm::engine::cuda
