// Decode kernels of the routed experts (moe_decode.cuh): tokens * top_k <= kMoeDecodeMaxPairs,
// 16-byte weight rows. Launchers for kernels/moe.cu (CUDA sources only: op_util.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe_common.h"
#include "kernels/op_util.h"

namespace glm::kernels::moe {

// One weight pass (fused: gate|up into act; else down into y) over p.pairs <= kMoeDecodeMaxPairs
// pairs of at most max_slots distinct experts, on a persistent grid sized from the device's
// resident CTAs (info). p.route.logits != nullptr (fused only): the kernel routes first and
// writes p.route.ids / p.route.weights. InvalidArgument past the limits; Internal on a launch
// error.
absl::Status LaunchDecode(bool fused, int wt, const DecodeParams& p, int64_t max_slots,
                          const detail::DeviceInfo& info, cudaStream_t stream);

}  // namespace glm::kernels::moe
