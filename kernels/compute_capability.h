// Which kernel paths a device's compute capability allows, decided in one place from plain values
// (QueryDeviceLimits fills DeviceLimits::cc_major / cc_minor; tests pass any capability). An op
// whose kernels need more than the device has refuses when its plan is made, with a
// FailedPrecondition that names the op, the device's capability and what the path needs, so the
// engine reports which op lacks a path instead of launching code the device cannot run. Plain
// C++: the CPU-only build and its tests carry it.
//
// Capabilities the project builds for (cmake/GlmCuda.cmake): 8.0 (A800 / A100: mma.sync bf16 /
// f16, cp.async; no fp8 conversion instructions, clusters, TMA or programmatic dependent launch,
// which the kernels replace with software conversion or skip at run time), 9.0 (H100 / H200),
// 10.0 (B200), 12.0 / 12.1 (RTX Blackwell, GB10). Every op has an sm_80 path; the one path that
// exists only on some devices is the block-scaled FP4 tensor-core GEMV (Fp4MmaSupport).
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace glm::kernels {

struct ComputeCapability {
  int major = 0;
  int minor = 0;
};

// OK when `device` >= `need`; otherwise FailedPrecondition "<op>: <what> needs compute
// capability N.n or newer; this device is D.d".
absl::Status RequireComputeCapability(std::string_view op, ComputeCapability device,
                                      ComputeCapability need, std::string_view what);

// The block-scaled FP4 tensor-core path (mma.sync kind::mxf4nvf4, gemv_quant_fp4.h): only
// compute capability 12.0 / 12.1, and only when this build carries the arch-specific device code
// for the device (sm_120a for 12.0, sm_121a for 12.1: the instruction is refused for plain
// sm_120 / sm_121 and does not exist elsewhere). `compiled_for_device`: whether the code loaded
// for the device has the instruction (GemvQuantPlan asks the device). FailedPrecondition naming
// `op`, the capability and the fix otherwise.
absl::Status Fp4MmaSupport(std::string_view op, ComputeCapability device, bool compiled_for_device);

}  // namespace glm::kernels
