// The routed-experts op (kernels/moe.h): the per-expert table, the path by shape, the workspace
// layout and the pair-indexed combine; the weight kernels live in moe_decode / moe_grouped /
// moe_mma / moe_tiled.
#include "kernels/moe.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/cuda_util.h"
#include "kernels/moe.cuh"
#include "kernels/moe_decode.h"
#include "kernels/moe_grouped.h"
#include "kernels/moe_mma.h"
#include "kernels/moe_route.h"
#include "kernels/moe_tiled.h"
#include "kernels/op_util.h"

namespace glm::kernels {
namespace {

using moe::kOp;
using Path = MoePolicy::Path;

struct TableEntry {
  std::vector<MoeExpert> host;
  MoeExpert* device = nullptr;
  MoeExpertTable table;
};

// Alignment, row strides and fp8 scales of every expert (host only).
absl::Status CheckExperts(const MoeExpert* experts, int num_experts, int64_t hidden,
                          int64_t inter, MoeWeightType type) {
  const bool fp8 = type == MoeWeightType::kF8E4M3Block128;
  const uintptr_t align = type == MoeWeightType::kF32 ? 16 : type == MoeWeightType::kBF16 ? 8 : 4;
  for (int e = 0; e < num_experts; ++e) {
    const MoeExpert& x = experts[e];
    const struct {
      const void* data;
      int64_t ld;
      const float* scales;
      int64_t scale_ld, cols;
    } mats[3] = {{x.gate, x.gate_ld, x.gate_s, x.gate_sld, hidden},
                 {x.up, x.up_ld, x.up_s, x.up_sld, hidden},
                 {x.down, x.down_ld, x.down_s, x.down_sld, inter}};
    for (const auto& m : mats) {
      if ((reinterpret_cast<uintptr_t>(m.data) & (align - 1)) != 0 || m.ld % 4 != 0 ||
          m.ld < m.cols ||
          (fp8 && (m.scales == nullptr || m.scale_ld < (m.cols + 127) / 128))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cuda ", kOp, ": expert ", e, " weights must be ", align, "-byte aligned with row "
            "strides that are multiples of 4 elements (16/8/4-byte loads) and at least the row "
            "length, fp8 with block scales"));
      }
    }
  }
  return absl::OkStatus();
}

// The streaming kernels' limit: 16-byte weight rows (k a multiple of the values per 16 bytes,
// 16-byte aligned data and row strides).
bool Rows16(const std::vector<MoeExpert>& experts, int64_t hidden, int64_t inter, int wt) {
  const int64_t eb = moe::ElemBytes(wt), per_chunk = 16 / eb;
  bool ok = hidden % per_chunk == 0 && inter % per_chunk == 0;
  for (const MoeExpert& ep : experts) {
    for (const void* d : {ep.gate, ep.up, ep.down}) {
      ok = ok && (reinterpret_cast<uintptr_t>(d) & 15) == 0;
    }
    for (int64_t ld : {ep.gate_ld, ep.up_ld, ep.down_ld}) ok = ok && (ld * eb) % 16 == 0;
  }
  return ok;
}

void* Carve(void*& p, size_t bytes) {
  void* r = p;
  p = static_cast<char*>(p) + (bytes + 255) / 256 * 256;
  return r;
}

size_t Rounded(size_t bytes) { return (bytes + 255) / 256 * 256; }

using moe::LaunchCombineByPair;

const char* PathName(Path p) {
  switch (p) {
    case Path::kAuto: return "kAuto";
    case Path::kDecode: return "kDecode";
    case Path::kGrouped: return "kGrouped";
    case Path::kMma: return "kMma";
    case Path::kTiled: return "kTiled";
  }
  return "?";
}

}  // namespace

namespace moe {

absl::Status LaunchCombineByPair(const float* y, const int32_t* ids, const float* weights,
                                 int top_k, int num_experts, int64_t tokens, int64_t hidden,
                                 float* out, int64_t out_ld, cudaStream_t stream) {
  LaunchKernel(MoeCombineByPairKernel,
               dim3(static_cast<unsigned>(tokens),
                    static_cast<unsigned>(detail::CeilDiv(hidden, kCombineThreads))),
               kCombineThreads, 0, stream, y, ids, weights, top_k, num_experts,
               static_cast<int>(hidden), out, out_ld);
  return detail::CudaCheck(cudaGetLastError(), kOp, "MoeCombineByPairKernel launch");
}

}  // namespace moe

absl::StatusOr<MoeExpertTable> MoeExpertTableFor(const void* key, const MoeExpert* experts,
                                                 int num_experts, int64_t hidden, int64_t inter,
                                                 MoeWeightType type, cudaStream_t stream) {
  if (experts == nullptr || num_experts < 1 || num_experts > kMoeMaxExperts || hidden < 1 ||
      inter < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": ", num_experts, " experts of hidden ", hidden, " and moe_inter ", inter,
        " (need 1..", kMoeMaxExperts, " experts, positive widths and the host array)"));
  }
  static std::mutex* mu = new std::mutex;
  // Never destroyed: device memory outlives static destruction order concerns.
  static auto* cache = new std::map<std::tuple<int, const void*, int>, TableEntry>;
  int device = 0;
  GLM_OP_RETURN_IF_ERROR(kOp, cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(*mu);
  TableEntry& entry = (*cache)[{device, key, num_experts}];
  if (entry.device != nullptr && entry.host.size() == static_cast<size_t>(num_experts) &&
      entry.table.hidden == hidden && entry.table.inter == inter && entry.table.type == type &&
      std::memcmp(entry.host.data(), experts, num_experts * sizeof(MoeExpert)) == 0) {
    return entry.table;
  }
  GLM_RETURN_IF_ERROR(CheckExperts(experts, num_experts, hidden, inter, type));
  if (entry.device == nullptr) {
    GLM_OP_RETURN_IF_ERROR(kOp, cudaMalloc(&entry.device, num_experts * sizeof(MoeExpert)));
  }
  entry.host.assign(experts, experts + num_experts);
  const int wt = moe::WeightTypeInt(type);
  entry.table.device = entry.device;
  entry.table.num_experts = num_experts;
  entry.table.hidden = hidden, entry.table.inter = inter, entry.table.type = type;
  entry.table.rows16 = Rows16(entry.host, hidden, inter, wt);
  // entry.host lives on in the cache, so the async copy's source stays valid.
  GLM_OP_RETURN_IF_ERROR(
      kOp, cudaMemcpyAsync(entry.device, entry.host.data(), entry.host.size() * sizeof(MoeExpert),
                           cudaMemcpyHostToDevice, stream));
  return entry.table;
}

absl::Status MoeExperts(const MoeArgs& args, const KernelPolicy& policy, MoeWorkspace& workspace,
                        cudaStream_t stream, MoeRunInfo* info) {
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
        "cuda MoeRouteExperts: logits has ", route->logits_rows, " rows for ", tokens,
        " tokens, top_k ", route->top_k, ", ids ", route->ids == nullptr ? "null" : "set",
        ", weights ", route->weights == nullptr ? "null" : "set",
        " (need one logits row per token, top_k >= 1 and both outputs)"));
  }
  const MoeExpertTable* table = args.experts;
  if (table == nullptr || table->device == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": no expert table (build one with MoeExpertTableFor)"));
  }
  const int num_experts = table->num_experts;
  if (tokens < 0 || top_k <= 0 || num_experts <= 0 || num_experts > moe::kMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": tokens ", tokens, ", top_k ", top_k, " and num_experts ", num_experts,
        " must be positive, num_experts at most ", moe::kMaxExperts, " (one-CTA routing scan)"));
  }
  const int64_t pairs = tokens * top_k;
  if (pairs >= 0x7fffffff || tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", kOp, ": ", pairs, " (token, expert) pairs exceed 2^31 - 1"));
  }
  const int64_t hidden = table->hidden, inter = table->inter;
  if (hidden % 4 != 0 || inter % 4 != 0 || args.x_ld % 4 != 0 || args.x_ld < hidden ||
      args.out_ld < hidden || !detail::Aligned16(args.x) || args.out == nullptr ||
      ids == nullptr || weights == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": hidden (", hidden, "), moe_inter (", inter, ") and x's row stride (",
        args.x_ld, ") must be multiples of 4 with x 16-byte aligned (cp.async 16-byte copies), "
        "row strides of x and out (", args.out_ld, ") at least hidden, ids / weights / out set"));
  }

  const int wt = moe::WeightTypeInt(table->type);
  const bool fp8 = wt == moe::kWFP8;
  const bool rows16 = table->rows16;
  // The token-group and tensor-core kernels address x / act rows with 32-bit element offsets.
  const bool offsets32 =
      tokens * args.x_ld + hidden < 0x7fffffff && pairs * inter + inter < 0x7fffffff;
  const bool decode_ok = rows16 && pairs <= kMoeDecodeMaxPairs;
  const bool grouped_ok = rows16 && offsets32 && pairs <= kMoeGroupedMaxPairs;
  const bool mma_ok = fp8 && grouped_ok;
  Path path = policy.moe.path;
  if (path == Path::kAuto) {
    // Cut-overs measured on an H200 at GLM-5 widths (cuda_ops_bench --only moe, us per call):
    // bf16 at <= 64 pairs on the token groups, 152 vs 169 at batch 1 (commit b09f5e2); fp8 on
    // tensor cores from 513 pairs, 4372 vs 6381 at batch 128 (dc4b4be), decode step x0.58 at
    // batch 512 (d24f288). 4096 pairs is the token lists' shared-memory limit (there the token
    // groups take 24.5 ms, the tiled GEMM 53.6: 89345df).
    if (decode_ok && wt != moe::kWBF16) {
      path = Path::kDecode;
    } else if (mma_ok && pairs >= kMoeMmaMinPairs) {
      path = Path::kMma;
    } else if (grouped_ok) {
      path = Path::kGrouped;
    } else {
      path = Path::kTiled;
    }
  } else if ((path == Path::kDecode && !decode_ok) || (path == Path::kGrouped && !grouped_ok) ||
             (path == Path::kMma && !mma_ok)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda ", kOp, ": MoePolicy::Path::", PathName(path), " cannot run ", pairs,
        " (token, expert) pairs of hidden ", hidden, " / moe_inter ", inter, ": it needs ",
        path == Path::kDecode ? absl::StrCat("<= ", kMoeDecodeMaxPairs, " pairs")
                              : absl::StrCat("<= ", kMoeGroupedMaxPairs, " pairs"),
        path == Path::kMma ? ", fp8 weights" : "",
        ", 16-byte weight rows (widths multiples of 16 / element bytes, 16-byte aligned rows)",
        path == Path::kDecode ? "" : " and x / act element offsets below 2^31",
        " (kAuto picks a path that can)"));
  }

  GLM_ASSIGN_OR_RETURN(detail::DeviceInfo dev,
                       detail::CurrentDeviceInfo(kOp, policy.smem_cap_bytes));
  if (policy.max_sms > 0 && policy.max_sms < dev.num_sms) dev.num_sms = policy.max_sms;

  // MoeRouteExperts: the gate|up decode kernel routes for itself at few tokens when the routing
  // needs no group step and 256 experts at most (RouteRowWarp<8>); else MoeRoute's kernel first.
  bool fuse_route = false;
  if (route != nullptr) {
    const MoeRouting& r = *route;
    fuse_route = path == Path::kDecode && policy.moe.path == Path::kAuto &&
                 tokens <= kMoeRouteFuseMaxTokens && r.num_routed >= 1 && r.num_routed <= 256 &&
                 r.logits_ld >= r.num_routed && (r.n_group <= 1 || r.topk_group >= r.n_group) &&
                 r.top_k <= r.num_routed && r.top_k <= kMoeRouteMaxTopK && r.appended >= -1;
    if (!fuse_route) {
      GLM_RETURN_IF_ERROR(MoeRoute(r.logits, r.logits_ld, r.bias, r.logits_rows, r.num_routed,
                                   std::max(1, r.n_group), r.topk_group, r.top_k, r.renormalize,
                                   r.scale, r.appended, r.ids, r.weights, stream));
    } else {
      GLM_RETURN_IF_ERROR(CheckDevicePointer(r.logits, kOp, "logits"));
      GLM_RETURN_IF_ERROR(CheckDevicePointer(r.ids, kOp, "ids"));
      GLM_RETURN_IF_ERROR(CheckDevicePointer(r.weights, kOp, "weights"));
      if (r.bias != nullptr) GLM_RETURN_IF_ERROR(CheckDevicePointer(r.bias, kOp, "bias"));
    }
  }
  if (info != nullptr) info->path = path, info->route_fused = fuse_route;

  if (path == Path::kGrouped || path == Path::kMma) {
    // Device token lists, then the two weight passes, then the pair-indexed combine.
    const int64_t max_slots = std::min<int64_t>(num_experts, pairs);
    const int64_t max_units = moe::MaxGroupUnits(pairs, max_slots);
    GLM_ASSIGN_OR_RETURN(void* ints,
                         workspace.Get(0, moe::DeviceListsBytes(pairs, max_slots, max_units)));
    const moe::DeviceLists dl = moe::CarveDeviceLists(ints, pairs, max_slots, max_units);
    GLM_ASSIGN_OR_RETURN(void* act, workspace.Get(1, static_cast<size_t>(pairs * inter) * 4));
    GLM_ASSIGN_OR_RETURN(void* y, workspace.Get(2, static_cast<size_t>(pairs * hidden) * 4));
    GLM_RETURN_IF_ERROR(
        moe::LaunchListRoute(ids, static_cast<int>(pairs), num_experts, dl, stream));
    const moe::DecodeLists l{dl.n_active, dl.slot_expert, dl.slot_off, dl.row_pair,
                             dl.n_units,  dl.unit_expert, dl.unit_off};
    if (path == Path::kMma) {
      // Split rows: x (tokens, hidden) for the fused kernel, act (pairs, inter) for down.
      const int kbh = static_cast<int>(detail::CeilDiv(hidden, moe::kMmaKB));
      const int kbi = static_cast<int>(detail::CeilDiv(inter, moe::kMmaKB));
      auto split_bytes = [&](int64_t rows, int kb) {
        return Rounded(static_cast<size_t>(rows * kb * moe::kMmaSplitRow) * 2) +
               Rounded(static_cast<size_t>(rows * kb) * 4);
      };
      GLM_ASSIGN_OR_RETURN(void* xs, workspace.Get(3, split_bytes(tokens, kbh)));
      GLM_ASSIGN_OR_RETURN(void* as, workspace.Get(4, split_bytes(pairs, kbi)));
      moe::MmaParams mp{};
      mp.experts = table->device, mp.top_k = top_k;
      void* c3 = xs;
      mp.bsplit = static_cast<const __half*>(
          Carve(c3, static_cast<size_t>(tokens * kbh * moe::kMmaSplitRow) * 2));
      mp.binv = static_cast<const float*>(Carve(c3, static_cast<size_t>(tokens * kbh) * 4));
      mp.kblocks = kbh, mp.n = static_cast<int>(inter), mp.k = static_cast<int>(hidden);
      mp.c = static_cast<float*>(act);
      GLM_RETURN_IF_ERROR(
          moe::LaunchMma(true, mp, args.x, args.x_ld, tokens, l, max_slots, dev, stream));
      void* c4 = as;
      mp.bsplit = static_cast<const __half*>(
          Carve(c4, static_cast<size_t>(pairs * kbi * moe::kMmaSplitRow) * 2));
      mp.binv = static_cast<const float*>(Carve(c4, static_cast<size_t>(pairs * kbi) * 4));
      mp.kblocks = kbi, mp.n = static_cast<int>(hidden), mp.k = static_cast<int>(inter);
      mp.c = static_cast<float*>(y);
      GLM_RETURN_IF_ERROR(moe::LaunchMma(false, mp, static_cast<const float*>(act), inter, pairs,
                                         l, max_slots, dev, stream));
    } else {
      moe::DecodeParams d{};
      d.ids = ids, d.pairs = static_cast<int>(pairs), d.top_k = top_k;
      d.num_experts = num_experts, d.experts = table->device;
      d.a = args.x, d.a_ld = args.x_ld;
      d.n = static_cast<int>(inter), d.k = static_cast<int>(hidden);
      d.c = static_cast<float*>(act);
      GLM_RETURN_IF_ERROR(moe::LaunchGrouped(true, wt, d, l, max_units, dev, stream));
      d.a = static_cast<const float*>(act), d.a_ld = inter;
      d.n = static_cast<int>(hidden), d.k = static_cast<int>(inter);
      d.c = static_cast<float*>(y);
      GLM_RETURN_IF_ERROR(moe::LaunchGrouped(false, wt, d, l, max_units, dev, stream));
    }
    return LaunchCombineByPair(static_cast<const float*>(y), ids, weights, top_k, num_experts,
                               tokens, hidden, args.out, args.out_ld, stream);
  }

  if (path == Path::kDecode) {
    // Two weight-streaming kernels that route from ids themselves, then the combine.
    GLM_ASSIGN_OR_RETURN(void* act, workspace.Get(1, static_cast<size_t>(pairs * inter) * 4));
    GLM_ASSIGN_OR_RETURN(void* y, workspace.Get(2, static_cast<size_t>(pairs * hidden) * 4));
    moe::DecodeParams d{};
    d.ids = ids, d.pairs = static_cast<int>(pairs), d.top_k = top_k;
    d.num_experts = num_experts, d.experts = table->device;
    const int64_t max_slots = std::min<int64_t>(num_experts, pairs);
    d.a = args.x, d.a_ld = args.x_ld;
    d.n = static_cast<int>(inter), d.k = static_cast<int>(hidden);
    d.c = static_cast<float*>(act);
    if (fuse_route) {
      const MoeRouting& r = *route;
      d.route.logits = r.logits, d.route.ld = r.logits_ld;
      d.route.bias = r.bias;
      d.route.routed = r.num_routed, d.route.routed_top_k = r.top_k;
      d.route.tokens = static_cast<int>(tokens), d.route.appended = r.appended;
      d.route.renormalize = r.renormalize ? 1 : 0, d.route.scale = r.scale;
      d.route.ids = r.ids, d.route.weights = r.weights;
    }
    moe::DecodeParams dn = d;
    dn.route = moe::DecodeRouteIn{};
    dn.a = static_cast<const float*>(act), dn.a_ld = inter;
    dn.n = static_cast<int>(hidden), dn.k = static_cast<int>(inter);
    dn.c = static_cast<float*>(y);
    GLM_RETURN_IF_ERROR(moe::LaunchDecode(true, wt, d, max_slots, dev, stream));
    GLM_RETURN_IF_ERROR(moe::LaunchDecode(false, wt, dn, max_slots, dev, stream));
    return LaunchCombineByPair(static_cast<const float*>(y), ids, weights, top_k, num_experts,
                               tokens, hidden, args.out, args.out_ld, stream);
  }

  // Tiled grouped GEMM: routing into expert-ordered rows, two GEMMs, the row-indexed combine.
  const size_t int_bytes = 2 * Rounded((num_experts + 1) * sizeof(int32_t)) +
                           2 * Rounded(static_cast<size_t>(pairs) * sizeof(int32_t));
  GLM_ASSIGN_OR_RETURN(void* ints, workspace.Get(0, int_bytes));
  void* cur = ints;
  auto* expert_off = static_cast<int32_t*>(Carve(cur, (num_experts + 1) * sizeof(int32_t)));
  auto* tile_off = static_cast<int32_t*>(Carve(cur, (num_experts + 1) * sizeof(int32_t)));
  auto* row_pair = static_cast<int32_t*>(Carve(cur, pairs * sizeof(int32_t)));
  auto* pair_row = static_cast<int32_t*>(Carve(cur, pairs * sizeof(int32_t)));
  GLM_ASSIGN_OR_RETURN(void* act, workspace.Get(1, static_cast<size_t>(pairs * inter) * 4));
  GLM_ASSIGN_OR_RETURN(void* y, workspace.Get(2, static_cast<size_t>(pairs * hidden) * 4));
  GLM_RETURN_IF_ERROR(moe::LaunchTiledRoute(ids, static_cast<int>(pairs), num_experts, expert_off,
                                            tile_off, row_pair, pair_row, stream));
  const int64_t max_tiles = moe::MaxTiles(pairs, num_experts);
  moe::GemmParams p{};
  p.top_k = top_k;
  p.experts = table->device;
  p.expert_off = expert_off, p.tile_off = tile_off, p.row_pair = row_pair;
  p.num_experts = num_experts;
  p.a = args.x, p.a_ld = args.x_ld;
  p.n = static_cast<int>(inter), p.k = static_cast<int>(hidden);
  p.c = static_cast<float*>(act);
  GLM_RETURN_IF_ERROR(moe::LaunchTiledGemm(true, wt, p, max_tiles, dev, stream));
  p.a = static_cast<const float*>(act), p.a_ld = inter;
  p.n = static_cast<int>(hidden), p.k = static_cast<int>(inter);
  p.c = static_cast<float*>(y);
  GLM_RETURN_IF_ERROR(moe::LaunchTiledGemm(false, wt, p, max_tiles, dev, stream));
  return moe::LaunchTiledCombine(static_cast<const float*>(y), pair_row, weights, top_k, tokens,
                                 static_cast<int>(hidden), args.out, args.out_ld, stream);
}

}  // namespace glm::kernels
