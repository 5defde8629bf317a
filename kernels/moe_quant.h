// Routed experts of one MoE layer whose weights stay INT4 / INT8 / NVFP4 as the checkpoint stores
// them (gemv_quant.h has the formats), fp32 activations, entirely on the device:
//   out[t] += sum_j w[t, j] * down[e](bf16(silu(gate[e] bf16(x[t])) * up[e] bf16(x[t]))),
//   e = ids[t, j]
// Why: widening every expert of a layer to bf16 before each call (the fallback of the CUDA
// backend) costs the layer's experts in bf16 of scratch (GLM-5 at TP 1: 19.3 GB) and writing it
// every step; here each routed expert's packed weight is read once per step, narrow.
//
// Steps (one stream, no host synchronization: graph-capturable once the workspace has grown):
// routing from logits when args.route is set (kernels::MoeRoute), the device token lists of
// moe_grouped.h (slots = distinct valid experts ascending, units of at most kMoeQuantUnitRows
// rows of one expert), the gate|up pass (silu(g) * u per pair, fp32, into act [pairs, inter]),
// the down pass (y [pairs, hidden]) and the pair-indexed combine of the other MoE paths.
// Numerics per pair are GemvQuantHost's: x (and act before the down pass) rounded to bf16,
// times the exactly dequantized weight, products summed in fp32 (tensor cores, exact products),
// nvfp4's global scale (per expert and per projection) applied to the sums. Deterministic (each
// output written by one thread in a fixed order, no float atomics); independent of the grid.
// Limits: pairs = tokens * top_k <= kMoeQuantMaxPairs (the token lists' shared memory); one
// format and one group size for every projection of the layer; the shapes of CheckQuantWeight
// (k a multiple of 32 / 16, 16-byte rows). The CUDA backend runs a prefill as consecutive
// pieces of at most kMoeQuantMaxPairs pairs (engine/backend/cuda/cuda_moe.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_limits.h"
#include "kernels/gemv_quant.h"
#include "kernels/kernel_policy.h"
#include "kernels/moe.h"

namespace glm::kernels {

inline constexpr int kMoeQuantUnitRows = 16;  // token rows per unit: two 8-token MMA tiles
inline constexpr int64_t kMoeQuantMaxPairs = kMoeGroupedMaxPairs;
// The kernel's static shared memory (the unit's pair ids), beside the planned dynamic bytes: the
// plan keeps both (and the per-block reservation) within half an SM.
inline constexpr int kMoeQuantStaticSmemBytes = kMoeQuantUnitRows * 4;

// One projection of one expert: QuantWeightView's pointers and strides (the shape, format and
// group size are the layer's). global_scale: nvfp4 weight_scale_2 (1 for int; differs per expert
// and per projection in real checkpoints).
struct MoeQuantMatrix {
  const void* data = nullptr;
  int64_t ld_bytes = 0;
  const void* scales = nullptr;
  int64_t scale_ld = 0;
  float global_scale = 1.0f;
};

// gate, up [inter, hidden]; down [hidden, inter]. Copied to the device as is.
struct MoeQuantExpert {
  MoeQuantMatrix gate, up, down;
};

// A layer's quantized experts as the kernels read them.
struct MoeQuantTable {
  const MoeQuantExpert* device = nullptr;  // [num_experts]
  int num_experts = 0;
  int64_t hidden = 0, inter = 0;
  QuantFormat format = QuantFormat::kInt4;
  int64_t group_size = 128;  // every projection's (>= k: one scale per row)

  std::string DebugString() const;
};

// Every expert's three views against CheckQuantWeight (gate / up [inter, hidden], down [hidden,
// inter] of `format` and `group_size`), non-null pointers and 16-byte aligned data and scales
// (InvalidArgument naming the expert, the projection and the rule). Host only: no CUDA calls.
absl::Status CheckMoeQuantExperts(const MoeQuantExpert* experts, int num_experts, int64_t hidden,
                                  int64_t inter, QuantFormat format, int64_t group_size);

// The device table of `experts` (host array [num_experts]), checked (CheckMoeQuantExperts) and
// uploaded on `stream` the first time, then cached for the process under (device, key,
// num_experts) and uploaded again only when a pointer, stride or scale changes. key: the
// caller's identity of the layer's weights (the engine passes its gate view array). int
// formats' global scales are stored as 1. The first call for a layer allocates, so it must not be
// the one inside a CUDA-graph capture. Thread-safe.
absl::StatusOr<MoeQuantTable> MoeQuantTableFor(const void* key, const MoeQuantExpert* experts,
                                               int num_experts, int64_t hidden, int64_t inter,
                                               QuantFormat format, int64_t group_size,
                                               cudaStream_t stream);

// Launch geometry (pure planning; tested without a GPU). A CTA is 256 threads (8 warps of 16
// weight rows, gemv_quant's tiling) and one unit: grid (row blocks, max_units); CTAs past the
// step's unit count exit at once. Gate|up CTAs cover 64 gate rows (warps 0-3) and the same 64
// up rows (warps 4-7), so silu(g) * u is formed in the CTA; down CTAs cover 128 rows. A CTA
// walks its K in chunks of staged x that fit smem_bytes (for a unit of r rows: (smem_bytes / r
// - pad) / window bytes windows per chunk), so no split-K workspace.
struct MoeQuantTiling {
  int64_t max_slots = 0;         // min(num_experts, pairs)
  int64_t max_units = 0;         // max_slots + pairs / kMoeQuantUnitRows
  int64_t gate_up_blocks = 0;    // ceil(inter / 64)
  int64_t down_blocks = 0;       // ceil(hidden / 128)
  size_t smem_bytes = 0;         // dynamic shared memory per CTA (both passes)
  int gate_up_chunk_windows = 0;  // windows per staged chunk at kMoeQuantUnitRows rows
  int down_chunk_windows = 0;
  bool gate_up_window_scale = false;  // gemv_quant's per-window scale path (int, whole windows)
  bool down_window_scale = false;
  size_t act_bytes = 0;  // workspace: act [pairs, inter] fp32
  size_t y_bytes = 0;    // workspace: y [pairs, hidden] fp32

  std::string DebugString() const;
};

// pairs in [1, kMoeQuantMaxPairs]; limits as gemv_quant plans them (the staged x of a CTA gets
// half an SM's shared memory, at least 48 KiB, at most the per-block opt-in; two CTAs per SM).
// InvalidArgument for a bad shape or pair count.
absl::StatusOr<MoeQuantTiling> PlanMoeQuant(int64_t pairs, int num_experts, int64_t hidden,
                                            int64_t inter, QuantFormat format,
                                            int64_t group_size, const DeviceLimits& limits);

struct MoeQuantArgs {
  const float* x = nullptr;  // [tokens, hidden] fp32, row stride x_ld (>= hidden); 4-byte aligned
  int64_t x_ld = 0;
  int64_t tokens = 0;
  // [tokens, top_k]: expert of each (token, slot) pair and its weight; ids outside
  // [0, num_experts) contribute nothing. With routing, both are route->ids / route->weights.
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int top_k = 0;
  const MoeQuantTable* experts = nullptr;
  float* out = nullptr;  // [tokens, hidden], row stride out_ld: out += the experts' sum
  int64_t out_ld = 0;
  const MoeRouting* route = nullptr;  // non-null: route first (MoeRouteExperts)
};

// Enqueues the layer's experts on `stream`. Workspace slots 0 (token lists), 1 (act) and 2 (y),
// as MoeExperts uses them. policy.smem_cap_bytes / max_sms plan as a smaller device would.
// Errors: InvalidArgument for shapes and pointers, FailedPrecondition beyond kMoeQuantMaxPairs
// (run the tokens in pieces, as the CUDA backend does) or on a device older than compute
// capability 8.0, Internal for CUDA failures; each names the op and the limit.
absl::Status MoeQuantExperts(const MoeQuantArgs& args, const KernelPolicy& policy,
                             MoeWorkspace& workspace, cudaStream_t stream);

}  // namespace glm::kernels
