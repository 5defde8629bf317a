// PdlLaunches (cuda_util.h): whether LaunchKernel (launch.cuh) launches with programmatic
// dependent launch on the current device.
#include <array>
#include <atomic>

#include "kernels/cuda_util.h"
#include "kernels/launch.cuh"

namespace glm::kernels {
namespace {

// Compiled like every kernel of the library: its attributes tell which virtual architecture the
// device runs this build's code from.
__global__ void PdlProbeKernel() { PdlEnter(); }

// 1: no PDL on `device`, 2: PDL.
int ProbeDevice(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  if (major < 9) return 1;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, reinterpret_cast<const void*>(PdlProbeKernel)) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return fa.ptxVersion >= 90 ? 2 : 1;
}

}  // namespace

bool PdlLaunches() {
  static std::array<std::atomic<int>, 64> state{};  // per device: 0 not probed yet, else 1 / 2
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 ||
      device >= static_cast<int>(state.size())) {
    (void)cudaGetLastError();
    return false;
  }
  int s = state[device].load(std::memory_order_relaxed);
  if (s == 0) {
    s = ProbeDevice(device);
    state[device].store(s, std::memory_order_relaxed);
  }
  return s == 2;
}

}  // namespace glm::kernels
