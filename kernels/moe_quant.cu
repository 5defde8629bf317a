// Launcher, planning and the per-expert table of moe_quant (moe_quant.h).
#include "kernels/moe_quant.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/cuda_util.h"
#include "kernels/moe_grouped.h"
#include "kernels/moe_quant.cuh"
#include "kernels/moe_route.h"
#include "kernels/op_util.h"

namespace glm::kernels {
namespace {

constexpr const char* kOp = "MoeQuantExperts";

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int Fmt(QuantFormat f) {
  return f == QuantFormat::kInt4 ? detail::kGqInt4
         : f == QuantFormat::kInt8 ? detail::kGqInt8
                                   : detail::kGqNvfp4;
}

// gemv_quant's rules (gemv_quant.cu): half an SM per CTA, at least 48 KiB, at most the opt-in.
int64_t SmemBudget(const DeviceLimits& l) {
  const int64_t optin = l.smem_optin_per_block > 0 ? l.smem_optin_per_block : 48 * 1024;
  const int64_t half = l.smem_per_sm > 0 ? l.smem_per_sm / 2 - l.reserved_smem_per_block : optin;
  return std::min<int64_t>(optin, std::max<int64_t>(half, 48 * 1024));
}
int64_t WindowXBytes(QuantFormat f) { return 2 * detail::GqWindowElems(Fmt(f)); }
int64_t XPad(QuantFormat f) { return f == QuantFormat::kInt8 ? 16 : 64; }

// The per-window scale path of gemv_quant for a weight of k inputs.
bool WindowScale(QuantFormat f, int64_t group, int64_t k) {
  if (f == QuantFormat::kNvfp4) return false;
  const int bits = f == QuantFormat::kInt8 ? 8 : 4;
  return group >= k || (group * bits / 8) % detail::kGqWindowBytes == 0;
}

QuantWeightView ViewOf(const MoeQuantMatrix& m, QuantFormat format, int64_t group, int64_t rows,
                       int64_t cols) {
  QuantWeightView v;
  v.format = format;
  v.data = m.data;
  v.ld_bytes = m.ld_bytes;
  v.scales = m.scales;
  v.scale_ld = m.scale_ld;
  v.group_size = group;
  v.global_scale = m.global_scale;
  v.rows = rows;
  v.cols = cols;
  return v;
}

bool SameMatrix(const MoeQuantMatrix& a, const MoeQuantMatrix& b) {
  return a.data == b.data && a.ld_bytes == b.ld_bytes && a.scales == b.scales &&
         a.scale_ld == b.scale_ld && std::memcmp(&a.global_scale, &b.global_scale, 4) == 0;
}

struct TableEntry {
  std::vector<MoeQuantExpert> given;   // as the caller passed them (the cache key's content)
  std::vector<MoeQuantExpert> stored;  // as uploaded (int global scales 1)
  MoeQuantExpert* device = nullptr;
  MoeQuantTable table;
};

using moe::MoeQuantKernel;
using moe::MoeQuantParams;
using KernelFn = void (*)(MoeQuantParams);

template <int kFmt, bool kGateUp>
KernelFn KernelFor(bool window_scale) {
  if constexpr (kFmt == detail::kGqNvfp4) {
    return &MoeQuantKernel<kFmt, false, kGateUp>;
  } else {
    return window_scale ? &MoeQuantKernel<kFmt, true, kGateUp>
                        : &MoeQuantKernel<kFmt, false, kGateUp>;
  }
}

KernelFn Kernel(QuantFormat f, bool window_scale, bool gate_up) {
  switch (f) {
    case QuantFormat::kInt4:
      return gate_up ? KernelFor<detail::kGqInt4, true>(window_scale)
                     : KernelFor<detail::kGqInt4, false>(window_scale);
    case QuantFormat::kInt8:
      return gate_up ? KernelFor<detail::kGqInt8, true>(window_scale)
                     : KernelFor<detail::kGqInt8, false>(window_scale);
    case QuantFormat::kNvfp4:
      return gate_up ? KernelFor<detail::kGqNvfp4, true>(false)
                     : KernelFor<detail::kGqNvfp4, false>(false);
  }
  return nullptr;
}

}  // namespace

std::string MoeQuantTable::DebugString() const {
  return absl::StrCat(num_experts, " experts ", QuantFormatName(format), " group ", group_size,
                      " hidden ", hidden, " moe_inter ", inter);
}

std::string MoeQuantTiling::DebugString() const {
  return absl::StrCat("slots<=", max_slots, " units<=", max_units, " gate|up blocks=",
                      gate_up_blocks, " down blocks=", down_blocks, " smem=", smem_bytes,
                      " chunk windows ", gate_up_chunk_windows, "/", down_chunk_windows,
                      gate_up_window_scale ? " window-scale" : " widen", "/",
                      down_window_scale ? "window-scale" : "widen");
}

absl::Status CheckMoeQuantExperts(const MoeQuantExpert* experts, int num_experts, int64_t hidden,
                                  int64_t inter, QuantFormat format, int64_t group_size) {
  if (experts == nullptr || num_experts < 1 || num_experts > kMoeMaxExperts || hidden < 1 ||
      inter < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": ", num_experts, " experts of hidden ", hidden, " and moe_inter ", inter,
        " (need 1..", kMoeMaxExperts, " experts, positive widths and the host array)"));
  }
  for (int e = 0; e < num_experts; ++e) {
    const struct {
      const char* name;
      const MoeQuantMatrix& m;
      int64_t rows, cols;
    } mats[3] = {{"gate", experts[e].gate, inter, hidden},
                 {"up", experts[e].up, inter, hidden},
                 {"down", experts[e].down, hidden, inter}};
    for (const auto& mat : mats) {
      const std::string what = absl::StrCat("expert ", e, " ", mat.name);
      const QuantWeightView v = ViewOf(mat.m, format, group_size, mat.rows, mat.cols);
      GLM_RETURN_IF_ERROR(CheckQuantWeight(v, what.c_str()));
      if (mat.m.data == nullptr || mat.m.scales == nullptr ||
          (reinterpret_cast<uintptr_t>(mat.m.data) & 15) != 0 ||
          (reinterpret_cast<uintptr_t>(mat.m.scales) & (format == QuantFormat::kNvfp4 ? 0 : 1)) !=
              0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cuda ", kOp, ": ", what, " (", v.DebugString(), ") needs non-null data 16-byte "
            "aligned and scales ", format == QuantFormat::kNvfp4 ? "" : "2-byte aligned ",
            "(load it with WeightLoader, which stores them so)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MoeQuantTable> MoeQuantTableFor(const void* key, const MoeQuantExpert* experts,
                                               int num_experts, int64_t hidden, int64_t inter,
                                               QuantFormat format, int64_t group_size,
                                               cudaStream_t stream) {
  if (experts == nullptr || num_experts < 1 || num_experts > kMoeMaxExperts) {
    return CheckMoeQuantExperts(experts, num_experts, hidden, inter, format, group_size);
  }
  static std::mutex* mu = new std::mutex;
  // Never destroyed: device memory outlives static destruction order concerns.
  static auto* cache = new std::map<std::tuple<int, const void*, int>, TableEntry>;
  int device = 0;
  GLM_OP_RETURN_IF_ERROR(kOp, cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(*mu);
  TableEntry& entry = (*cache)[{device, key, num_experts}];
  bool same = entry.device != nullptr && entry.given.size() == static_cast<size_t>(num_experts) &&
              entry.table.hidden == hidden && entry.table.inter == inter &&
              entry.table.format == format && entry.table.group_size == group_size;
  for (int e = 0; same && e < num_experts; ++e) {
    const MoeQuantExpert &a = entry.given[e], &b = experts[e];
    same = SameMatrix(a.gate, b.gate) && SameMatrix(a.up, b.up) && SameMatrix(a.down, b.down);
  }
  if (same) return entry.table;
  GLM_RETURN_IF_ERROR(
      CheckMoeQuantExperts(experts, num_experts, hidden, inter, format, group_size));
  if (entry.device == nullptr) {
    GLM_OP_RETURN_IF_ERROR(kOp,
                           cudaMalloc(&entry.device, num_experts * sizeof(MoeQuantExpert)));
  }
  entry.given.assign(experts, experts + num_experts);
  entry.stored = entry.given;
  if (format != QuantFormat::kNvfp4) {
    for (MoeQuantExpert& x : entry.stored) {
      x.gate.global_scale = x.up.global_scale = x.down.global_scale = 1.0f;
    }
  }
  entry.table.device = entry.device;
  entry.table.num_experts = num_experts;
  entry.table.hidden = hidden, entry.table.inter = inter;
  entry.table.format = format, entry.table.group_size = group_size;
  // entry.stored lives on in the cache, so the async copy's source stays valid.
  GLM_OP_RETURN_IF_ERROR(
      kOp, cudaMemcpyAsync(entry.device, entry.stored.data(),
                           entry.stored.size() * sizeof(MoeQuantExpert), cudaMemcpyHostToDevice,
                           stream));
  return entry.table;
}

absl::StatusOr<MoeQuantTiling> PlanMoeQuant(int64_t pairs, int num_experts, int64_t hidden,
                                            int64_t inter, QuantFormat format,
                                            int64_t group_size, const DeviceLimits& limits) {
  if (pairs < 1 || pairs > kMoeQuantMaxPairs || num_experts < 1 ||
      num_experts > kMoeMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": ", pairs, " (token, expert) pairs of ", num_experts, " experts; the "
        "narrow path takes 1..", kMoeQuantMaxPairs, " pairs (the token lists' shared memory) of "
        "1..", kMoeMaxExperts, " experts: widen the experts beyond"));
  }
  // The shapes' rules, on stand-in strides (the table checks the real ones).
  for (const auto& [rows, cols, name] :
       {std::tuple<int64_t, int64_t, const char*>{inter, hidden, "gate / up"},
        std::tuple<int64_t, int64_t, const char*>{hidden, inter, "down"}}) {
    QuantWeightView v;
    v.format = format;
    v.rows = rows, v.cols = cols, v.group_size = group_size;
    v.ld_bytes = (cols * v.bits() / 8 + 15) / 16 * 16;
    v.scale_ld = CeilDiv(cols, std::max<int64_t>(group_size, 1));
    GLM_RETURN_IF_ERROR(CheckQuantWeight(v, name));
  }
  MoeQuantTiling t;
  t.max_slots = std::min<int64_t>(num_experts, pairs);
  t.max_units = moe::MaxGroupUnits(pairs, t.max_slots, kMoeQuantUnitRows);
  t.gate_up_blocks = CeilDiv(inter, moe::kMqGateUpRows);
  t.down_blocks = CeilDiv(hidden, detail::kGqRows);
  const int64_t budget = std::max<int64_t>(SmemBudget(limits) - kMoeQuantStaticSmemBytes,
                                           moe::kMqExchangeBytes);
  const int64_t wx = WindowXBytes(format), pad = XPad(format);
  const int64_t we = detail::GqWindowElems(Fmt(format));
  const int64_t per_row = budget / kMoeQuantUnitRows - pad;
  if (per_row < wx) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda ", kOp, ": ", budget, " bytes of shared memory per block hold no 64-byte window of ",
        kMoeQuantUnitRows, " staged rows (need ", kMoeQuantUnitRows * (wx + pad), ")"));
  }
  t.gate_up_chunk_windows = static_cast<int>(std::min(per_row / wx, CeilDiv(hidden, we)));
  t.down_chunk_windows = static_cast<int>(std::min(per_row / wx, CeilDiv(inter, we)));
  // A full unit staging all of the longer K bounds what the kernel may use (the budget keeps
  // two CTAs per SM, which the register bound of 128 per thread allows anyway).
  const int64_t widest = std::max(CeilDiv(hidden, we), CeilDiv(inter, we)) * wx + pad;
  t.smem_bytes = static_cast<size_t>(std::max<int64_t>(
      std::min(budget, kMoeQuantUnitRows * widest), moe::kMqExchangeBytes));
  t.gate_up_window_scale = WindowScale(format, group_size, hidden);
  t.down_window_scale = WindowScale(format, group_size, inter);
  t.act_bytes = static_cast<size_t>(pairs * inter) * 4;
  t.y_bytes = static_cast<size_t>(pairs * hidden) * 4;
  if (t.max_units > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("cuda ", kOp, ": ", t.max_units,
                                                   " units exceed grid.y (65535)"));
  }
  return t;
}

absl::Status MoeQuantExperts(const MoeQuantArgs& args, const KernelPolicy& policy,
                             MoeWorkspace& workspace, cudaStream_t stream) {
  const int64_t tokens = args.tokens;
  if (tokens == 0) return absl::OkStatus();
  const MoeRouting* route = args.route;
  const int32_t* ids = route != nullptr ? route->ids : args.ids;
  const float* weights = route != nullptr ? route->weights : args.weights;
  const int top_k =
      route != nullptr ? route->top_k + (route->appended >= 0 ? 1 : 0) : args.top_k;
  if (route != nullptr &&
      (route->logits_rows != tokens || route->top_k < 1 || route->ids == nullptr ||
       route->weights == nullptr || route->logits == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": logits has ", route->logits_rows, " rows for ", tokens, " tokens, top_k ",
        route->top_k, ", ids ", route->ids == nullptr ? "null" : "set", ", weights ",
        route->weights == nullptr ? "null" : "set",
        " (need one logits row per token, top_k >= 1 and both outputs)"));
  }
  const MoeQuantTable* table = args.experts;
  if (table == nullptr || table->device == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", kOp, ": no expert table (build one with MoeQuantTableFor)"));
  }
  if (tokens < 0 || top_k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", kOp, ": tokens ", tokens, " and top_k ", top_k, " must be > 0"));
  }
  const int64_t pairs = tokens * top_k;
  if (pairs > kMoeQuantMaxPairs) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda ", kOp, ": ", pairs, " (token, expert) pairs exceed the narrow path's ",
        kMoeQuantMaxPairs, " (the token lists' shared memory); run the tokens in pieces of at "
        "most that many pairs, as the CUDA backend does"));
  }
  const int64_t hidden = table->hidden, inter = table->inter;
  if (args.x == nullptr || args.x_ld < hidden || args.out == nullptr || args.out_ld < hidden ||
      ids == nullptr || weights == nullptr ||
      (reinterpret_cast<uintptr_t>(args.x) & 3) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": x (row stride ", args.x_ld, ", 4-byte aligned) and out (row stride ",
        args.out_ld, ") must be set with row strides >= hidden ", hidden,
        ", ids and weights set"));
  }
  int device = 0, major = 0;
  GLM_OP_RETURN_IF_ERROR(kOp, cudaGetDevice(&device));
  GLM_OP_RETURN_IF_ERROR(
      kOp, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 8) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda ", kOp, ": bf16 mma.sync needs compute capability 8.0 or newer; this device is ",
        major, ".x (widen the experts and run MoeExperts)"));
  }
  GLM_ASSIGN_OR_RETURN(DeviceLimits limits,
                       QueryDeviceLimits(policy.smem_cap_bytes, policy.max_sms));
  GLM_ASSIGN_OR_RETURN(const MoeQuantTiling tiling,
                       PlanMoeQuant(pairs, table->num_experts, hidden, inter, table->format,
                                    table->group_size, limits));

  if (route != nullptr) {
    const MoeRouting& r = *route;
    GLM_RETURN_IF_ERROR(MoeRoute(r.logits, r.logits_ld, r.bias, r.logits_rows, r.num_routed,
                                 std::max(1, r.n_group), r.topk_group, r.top_k, r.renormalize,
                                 r.scale, r.appended, r.ids, r.weights, stream));
  }

  // Device token lists (units of up to kMoeQuantUnitRows rows), the two passes, the combine.
  const int64_t max_slots = tiling.max_slots, max_units = tiling.max_units;
  GLM_ASSIGN_OR_RETURN(void* ints,
                       workspace.Get(0, moe::DeviceListsBytes(pairs, max_slots, max_units)));
  const moe::DeviceLists dl = moe::CarveDeviceLists(ints, pairs, max_slots, max_units);
  GLM_ASSIGN_OR_RETURN(void* act, workspace.Get(1, tiling.act_bytes));
  GLM_ASSIGN_OR_RETURN(void* y, workspace.Get(2, tiling.y_bytes));
  GLM_RETURN_IF_ERROR(moe::LaunchListRoute(ids, static_cast<int>(pairs), table->num_experts, dl,
                                           stream, kMoeQuantUnitRows));

  detail::DeviceInfo info;
  info.num_sms = limits.num_sms;
  info.smem_optin = limits.smem_optin_per_block;
  MoeQuantParams p{};
  p.experts = table->device;
  p.n_units = dl.n_units, p.unit_expert = dl.unit_expert, p.unit_off = dl.unit_off;
  p.row_pair = dl.row_pair;
  p.top_k = top_k;
  p.smem_bytes = static_cast<int>(tiling.smem_bytes);
  for (const bool gate_up : {true, false}) {
    p.a = gate_up ? args.x : static_cast<const float*>(act);
    p.a_ld = gate_up ? args.x_ld : inter;
    p.n = gate_up ? inter : hidden;
    p.k = gate_up ? hidden : inter;
    p.group = std::min(table->group_size, p.k);
    p.c = static_cast<float*>(gate_up ? act : y);
    const bool ws = gate_up ? tiling.gate_up_window_scale : tiling.down_window_scale;
    const KernelFn kernel = Kernel(table->format, ws, gate_up);
    GLM_RETURN_IF_ERROR(
        detail::UseDynamicSmem(kernel, static_cast<int64_t>(tiling.smem_bytes), info, kOp));
    const dim3 grid(static_cast<unsigned>(gate_up ? tiling.gate_up_blocks : tiling.down_blocks),
                    static_cast<unsigned>(max_units));
    kernel<<<grid, detail::kGqThreads, tiling.smem_bytes, stream>>>(p);
    GLM_RETURN_IF_ERROR(detail::CudaCheck(cudaGetLastError(), kOp, "MoeQuantKernel launch"));
  }
  return moe::LaunchCombineByPair(static_cast<const float*>(y), ids, weights, top_k,
                                  table->num_experts, tokens, hidden, args.out, args.out_ld,
                                  stream);
}

}  // namespace glm::kernels
