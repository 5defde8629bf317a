// Routed experts of one MoE layer (engine/backend/backend.h MoeExperts), fp32 activations,
// entirely on the device:
//   out[t] += sum_j w[t, j] * down[e](silu(gate[e] x[t]) * up[e] x[t]),  e = ids[t, j].
// No host loop over experts and no host synchronization: every path derives the grouping by
// expert on the device, so a step can be captured in a CUDA graph once the workspace has grown.
//
// One default path per shape range (pairs = tokens * top_k; MoePolicy::Path::kAuto):
//   pairs <= kMoeDecodeMaxPairs (fp32 / fp8 experts): the decode kernels (moe_decode.h);
//   bf16 experts there, and pairs <= kMoeGroupedMaxPairs: the token-group kernels (moe_grouped.h);
//   fp8 experts with kMoeMmaMinPairs <= pairs <= kMoeGroupedMaxPairs: tensor cores (moe_mma.h);
//   larger: the tiled grouped GEMM (moe_tiled.h), which is also the reference the tests force.
// The streaming kernels need 16-byte weight rows (hidden and moe_inter multiples of 16 / element
// bytes, weights 16-byte aligned with 16-byte row strides); without, kAuto takes the tiled GEMM.
// Results are deterministic (fixed summation order, no float atomics), and do not depend on the
// grid, so a graph replay equals the eager call bit for bit. Plain C++ (no device code).
// INT4 / INT8 / NVFP4 experts (read narrow) are a sibling op on the same token lists and
// combine: moe_quant.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernel_policy.h"

namespace glm::kernels {

inline constexpr int kMoeMaxExperts = 1024;        // one-CTA routing scans
inline constexpr int kMoeDecodeMaxPairs = 64;      // the decode kernels' routing in registers
inline constexpr int kMoeGroupedMaxPairs = 4096;   // the device token lists' shared memory
inline constexpr int kMoeMmaMinPairs = 513;        // kAuto's fp8 tensor-core range starts here
// MoeRouteExperts steps of at most this many tokens on the decode kernels route inside the
// gate|up kernel (every warp routes every token itself: worth it while that is shorter than
// MoeRoute's launch; at 2 tokens it no longer is).
inline constexpr int kMoeRouteFuseMaxTokens = 1;

// Storage of every expert weight of a layer (one type per layer).
enum class MoeWeightType {
  kF32,
  kBF16,
  kF8E4M3Block128,  // e4m3 with fp32 scales per 128x128 block (the CPU's dequantization)
};

// One expert's weights, all device pointers: gate, up [moe_inter, hidden], down [hidden,
// moe_inter], row strides in elements (multiples of 4); fp8: block scales *_s [ceil(rows / 128),
// *_sld >= ceil(cols / 128)] fp32, null otherwise. Copied to the device as is (the kernels'
// per-expert table).
struct MoeExpert {
  const void* gate;
  const void* up;
  const void* down;
  int64_t gate_ld, up_ld, down_ld;
  const float* gate_s;
  const float* up_s;
  const float* down_s;
  int64_t gate_sld, up_sld, down_sld;
};

// A layer's experts as the kernels read them: the per-expert table on the device and what the
// launchers need to know of it.
struct MoeExpertTable {
  const MoeExpert* device = nullptr;  // [num_experts]
  int num_experts = 0;
  int64_t hidden = 0, inter = 0;
  MoeWeightType type = MoeWeightType::kF32;
  bool rows16 = false;  // 16-byte rows (the streaming kernels' limit; else only the tiled GEMM)
};

// The device table of `experts` (host array [num_experts]) for the current device, checked
// (alignment, row strides, fp8 scales; InvalidArgument naming the expert) and uploaded on
// `stream` the first time, then cached for the process under (device, key, num_experts) and
// uploaded again only when the pointers change. key: the caller's identity of the layer's weights
// (the engine passes its gate view array). The first call for a layer allocates, so it must not
// be the one inside a CUDA-graph capture. Thread-safe.
absl::StatusOr<MoeExpertTable> MoeExpertTableFor(const void* key, const MoeExpert* experts,
                                                 int num_experts, int64_t hidden, int64_t inter,
                                                 MoeWeightType type, cudaStream_t stream);

// Routing from the router's logits inside the op (Backend::MoeRouteExperts): kernels::MoeRoute's
// arguments (moe_route.h). ids / weights [tokens, top_k (+ 1 with appended >= 0)] are written
// and then drive the experts.
struct MoeRouting {
  const float* logits = nullptr;  // [tokens, num_routed] fp32, row stride logits_ld
  int64_t logits_ld = 0;
  int64_t logits_rows = 0;
  int num_routed = 0;
  const float* bias = nullptr;  // [num_routed] or null
  int n_group = 1, topk_group = 1, top_k = 1;
  bool renormalize = true;
  float scale = 1.0f;
  int appended = -1;  // >= 0: this expert appended to every token with weight 1
  int32_t* ids = nullptr;
  float* weights = nullptr;
};

struct MoeArgs {
  const float* x = nullptr;  // [tokens, hidden], row stride x_ld (multiple of 4, 16-byte aligned)
  int64_t x_ld = 0;
  int64_t tokens = 0;
  // [tokens, top_k]: expert of each (token, slot) pair and its weight; ids outside
  // [0, num_experts) contribute nothing. With routing, both are route->ids / route->weights.
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int top_k = 0;
  const MoeExpertTable* experts = nullptr;
  float* out = nullptr;  // [tokens, hidden], row stride out_ld: out += the experts' sum
  int64_t out_ld = 0;
  const MoeRouting* route = nullptr;  // non-null: route first (MoeRouteExperts)
};

// Grow-only device memory for the op's intermediates (the engine's Scratch fits): Get returns at
// least `bytes` of 256-byte aligned device memory, valid until the next Get of the same slot.
// Slots 0..4 are used. Once grown to a step's size, the same shape allocates nothing.
class MoeWorkspace {
 public:
  virtual ~MoeWorkspace() = default;
  virtual absl::StatusOr<void*> Get(int slot, size_t bytes) = 0;
};

// What a call ran (benches print it).
struct MoeRunInfo {
  MoePolicy::Path path = MoePolicy::Path::kAuto;  // the path taken (never kAuto after a call)
  bool route_fused = false;  // the routing ran inside the gate|up decode kernel
};

// Enqueues the layer's experts on `stream`. policy.moe.path forces one path (tests, benches);
// a forced path outside its limits is FailedPrecondition naming them. policy.smem_cap_bytes and
// policy.max_sms plan launches as a smaller device would. Errors: InvalidArgument for shapes and
// pointers, FailedPrecondition for device limits, Internal for CUDA failures; each names the op
// and the limit.
absl::Status MoeExperts(const MoeArgs& args, const KernelPolicy& policy, MoeWorkspace& workspace,
                        cudaStream_t stream, MoeRunInfo* info = nullptr);

}  // namespace glm::kernels
