// Kernel launches with programmatic dependent launch (PDL, compute capability 9.0+).
//
// A decode step is a chain of ~35 dependent kernels per layer, most of them a few microseconds
// long; without PDL each one starts only after the previous one has fully drained, so every
// boundary costs a launch latency plus a ramp-up. LaunchKernel launches with programmatic stream
// serialization: the kernel's CTAs may become resident while the previous kernel in the stream
// is still running, and wait on the device (griddepcontrol.wait) until it has completed and its
// memory is visible. Graph capture keeps the edge programmatic.
//
// The contract, for every kernel launched through LaunchKernel:
// - Its first statement is PdlEnter(). (A kernel that first streams immutable data, such as
//   weights, may instead wait before its first access to anything another kernel reads or
//   writes: gemv_narrow.cuh.) Without the wait the kernel races with the previous one.
// - After the wait the kernel lets the next kernel launch (griddepcontrol.launch_dependents).
//   That only makes the next kernel's CTAs resident early; they still wait for this whole grid
//   to complete, so no ordering is lost. Dependents launch only once every CTA of this grid has
//   started, so a grid is never starved of SMs by the kernels after it.
// - Kernels whose CTAs wait for each other (cooperative launches, software grid barriers) are
//   not launched this way.
// Without PDL (an older device, or code JIT-compiled from an older virtual architecture:
// PdlLaunches in cuda_util.h) LaunchKernel is a plain launch and PdlEnter's instructions are
// no-ops.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda_util.h"

namespace glm::kernels {

// The first statement of a kernel launched with LaunchKernel (see the contract above).
__device__ __forceinline__ void PdlEnter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
// PdlLaunches(). Arguments convert to the kernel's parameter types as in a <<<>>> launch. Returns
// the launch's error, which cudaGetLastError also reports, as after a <<<>>> launch.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = PdlLaunches() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace glm::kernels
