#include "kernels/compute_capability.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace glm::kernels {

absl::Status RequireComputeCapability(std::string_view op, ComputeCapability device,
                                      ComputeCapability need, std::string_view what) {
  if (device.major > need.major || (device.major == need.major && device.minor >= need.minor)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      std::string(op), ": ", std::string(what), " needs compute capability ", need.major, ".",
      need.minor, " or newer; this device is ", device.major, ".", device.minor));
}

absl::Status Fp4MmaSupport(std::string_view op, ComputeCapability device,
                           bool compiled_for_device) {
  if (device.major != 12 || device.minor > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        std::string(op),
        ": the block-scaled FP4 tensor-core path (mma.sync kind::mxf4nvf4) needs compute "
        "capability 12.0 or 12.1; this device is ",
        device.major, ".", device.minor,
        "; use the default nvfp4 path (LinearPolicy::Nvfp4Path::kWidenBf16)"));
  }
  if (!compiled_for_device) {
    return absl::FailedPreconditionError(absl::StrCat(
        std::string(op),
        ": the block-scaled FP4 tensor-core path needs this build's device code for sm_",
        device.major, device.minor, "a (this device is ", device.major, ".", device.minor,
        "); configure with CMAKE_CUDA_ARCHITECTURES containing ", device.major, device.minor, "a"));
  }
  return absl::OkStatus();
}

}  // namespace glm::kernels
