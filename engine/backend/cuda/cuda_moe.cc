// Backend::MoeExperts / MoeRouteExperts on the CUDA backend: the engine's views (MatView,
// ExpertWeights, MoeRouteArgs, Scratch) as kernels/moe.h arguments, and INT4 / INT8 / NVFP4
// experts as kernels/moe_quant.h arguments. The kernels, the path choice and the per-expert
// device tables are kernels/moe*.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_quant_linear.h"
#include "kernels/moe.h"
#include "kernels/moe_quant.h"

namespace glm::engine::cuda {
namespace {

class ScratchWorkspace : public kernels::MoeWorkspace {
 public:
  explicit ScratchWorkspace(Scratch& scratch) : scratch_(scratch) {}
  absl::StatusOr<void*> Get(int slot, size_t bytes) override { return scratch_.Get(slot, bytes); }

 private:
  Scratch& scratch_;
};

kernels::MoeWeightType WeightType(WeightDType d) {
  return d == WeightDType::kF32    ? kernels::MoeWeightType::kF32
         : d == WeightDType::kBF16 ? kernels::MoeWeightType::kBF16
                                   : kernels::MoeWeightType::kF8E4M3Block128;
}

// Expert e has expert 0's shapes: gate, up [moe_inter, hidden], down [hidden, moe_inter].
absl::Status CheckSameShape(const ExpertWeights& w, int32_t e) {
  const int64_t inter = w.gate[0].rows, hidden = w.gate[0].cols;
  const MatView &g = w.gate[e], &u = w.up[e], &d = w.down[e];
  if (g.rows != inter || u.rows != inter || g.cols != hidden || u.cols != hidden ||
      d.rows != hidden || d.cols != inter) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MoeExperts: expert ", e, " has gate [", g.rows, ", ", g.cols, "], up [", u.rows,
        ", ", u.cols, "], down [", d.rows, ", ", d.cols, "]; expert 0 has moe_inter ", inter,
        " and hidden ", hidden, " (all experts must have the same shapes)"));
  }
  return absl::OkStatus();
}

// The layer's device table (kernels::MoeExpertTableFor: uploaded once per layer, keyed by the
// gate view array), after the engine-level checks: every expert of the same shapes and dtype.
absl::StatusOr<kernels::MoeExpertTable> Table(const ExpertWeights& w, cudaStream_t stream) {
  if (w.num_experts <= 0 || w.gate == nullptr || w.up == nullptr || w.down == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MoeExperts: ", w.num_experts, " experts (need at least one, with gate / up / down "
        "views)"));
  }
  const int64_t inter = w.gate[0].rows, hidden = w.gate[0].cols;
  const WeightDType dtype = w.gate[0].dtype;
  std::vector<kernels::MoeExpert> host(w.num_experts);
  for (int32_t e = 0; e < w.num_experts; ++e) {
    const MatView &g = w.gate[e], &u = w.up[e], &d = w.down[e];
    GLM_RETURN_IF_ERROR(CheckSameShape(w, e));
    if (g.dtype != dtype || u.dtype != dtype || d.dtype != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda MoeExperts: expert ", e, " weights mix dtypes; all experts of a layer must be "
          "stored alike (fp32, bf16 or fp8)"));
    }
    host[e] = {g.data,   u.data,   d.data,   g.ld,       u.ld,       d.ld,
               g.scales, u.scales, d.scales, g.scale_ld, u.scale_ld, d.scale_ld};
  }
  return kernels::MoeExpertTableFor(w.gate, host.data(), w.num_experts, hidden, inter,
                                    WeightType(dtype), stream);
}

// x and out against the table's hidden width, then the kernels' arguments (kernels::MoeArgs or
// MoeQuantArgs: the same fields).
template <typename TableT, typename Args>
absl::Status FillArgs(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                      const TableT& table, const MatView& out, const kernels::MoeRouting* route,
                      Args* args) {
  if (x.cols != table.hidden || out.cols != table.hidden || out.rows != x.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MoeExperts: x [", x.rows, ", ", x.cols, "] and out [", out.rows, ", ", out.cols,
        "] must be [tokens, hidden ", table.hidden, "]"));
  }
  args->x = x.data, args->x_ld = x.ld, args->tokens = x.rows;
  args->ids = ids, args->weights = weights, args->top_k = top_k;
  args->experts = &table;
  args->out = out.data, args->out_ld = out.ld;
  args->route = route;
  return absl::OkStatus();
}

absl::Status Run(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                 const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                 cudaStream_t stream, const kernels::KernelPolicy& policy,
                 kernels::MoeRunInfo* info, const kernels::MoeRouting* route) {
  if (x.rows == 0) return absl::OkStatus();
  GLM_ASSIGN_OR_RETURN(const kernels::MoeExpertTable table, Table(experts, stream));
  kernels::MoeArgs args;
  GLM_RETURN_IF_ERROR(FillArgs(x, ids, weights, top_k, table, out, route, &args));
  ScratchWorkspace ws(scratch);
  return kernels::MoeExperts(args, policy, ws, stream, info);
}

// The layer's quantized device table (kernels::MoeQuantTableFor, keyed by the gate view array);
// the caller checked QuantExpertsNarrow.
absl::StatusOr<kernels::MoeQuantTable> QuantTable(const ExpertWeights& w, cudaStream_t stream) {
  const int64_t inter = w.gate[0].rows, hidden = w.gate[0].cols;
  std::vector<kernels::MoeQuantExpert> host(w.num_experts);
  auto matrix = [](const MatView& v) {
    kernels::MoeQuantMatrix m;
    m.data = v.data;
    m.ld_bytes = v.ld;
    m.scales = v.group_scales;
    m.scale_ld = v.scale_ld;
    m.global_scale = v.global_scale;
    return m;
  };
  for (int32_t e = 0; e < w.num_experts; ++e) {
    const MatView &g = w.gate[e], &u = w.up[e], &d = w.down[e];
    GLM_RETURN_IF_ERROR(CheckSameShape(w, e));
    host[e] = {matrix(g), matrix(u), matrix(d)};
  }
  return kernels::MoeQuantTableFor(w.gate, host.data(), w.num_experts, hidden, inter,
                                   QuantViewOf(w.gate[0]).format, w.gate[0].group_size, stream);
}

// Tokens run in pieces of at most kernels::kMoeQuantMaxPairs pairs (the token lists' limit), one
// after the other on the stream: a prefill reads each routed expert once per piece, narrow,
// instead of widening the whole layer to bf16. Rows are independent, so the pieces are the
// same arithmetic as one call.
absl::Status RunQuant(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                      const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                      cudaStream_t stream, const kernels::KernelPolicy& policy,
                      const kernels::MoeRouting* route) {
  if (x.rows == 0) return absl::OkStatus();
  if (top_k < 1 || top_k > kernels::kMoeQuantMaxPairs) {
    return absl::InvalidArgumentError(absl::StrCat("cuda MoeExperts: top_k ", top_k,
                                                   " outside 1..", kernels::kMoeQuantMaxPairs));
  }
  GLM_ASSIGN_OR_RETURN(const kernels::MoeQuantTable table, QuantTable(experts, stream));
  ScratchWorkspace ws(scratch);
  const int64_t piece_rows = kernels::kMoeQuantMaxPairs / top_k;
  for (int64_t r0 = 0; r0 < x.rows; r0 += piece_rows) {
    const int64_t rows = std::min(piece_rows, x.rows - r0);
    MatView xp = x, op = out;
    xp.data = x.data + r0 * x.ld, xp.rows = rows;
    op.data = out.data + r0 * out.ld, op.rows = rows;
    const int64_t pair0 = r0 * top_k;
    kernels::MoeRouting rp;
    if (route != nullptr) {
      rp = *route;
      rp.logits = route->logits + r0 * route->logits_ld, rp.logits_rows = rows;
      rp.ids = route->ids + pair0, rp.weights = route->weights + pair0;
    }
    kernels::MoeQuantArgs args;
    GLM_RETURN_IF_ERROR(FillArgs(xp, ids + pair0, weights + pair0, top_k, table, op,
                                 route != nullptr ? &rp : nullptr, &args));
    GLM_RETURN_IF_ERROR(kernels::MoeQuantExperts(args, policy, ws, stream));
  }
  return absl::OkStatus();
}

kernels::MoeRouting RoutingOf(const MatView& logits, const MoeRouteArgs& r) {
  kernels::MoeRouting route;
  route.logits = logits.data, route.logits_ld = logits.ld, route.logits_rows = logits.rows;
  route.num_routed = static_cast<int>(logits.cols);
  route.bias = r.bias, route.n_group = r.n_group, route.topk_group = r.topk_group;
  route.top_k = r.top_k, route.renormalize = r.renormalize, route.scale = r.scale;
  route.appended = r.appended, route.ids = r.ids, route.weights = r.weights;
  return route;
}

}  // namespace

bool QuantExpertsNarrow(const ExpertWeights& w, int64_t pairs) {
  if (pairs < 1 || w.num_experts <= 0 ||
      w.gate == nullptr || w.up == nullptr || w.down == nullptr) {
    return false;
  }
  const MatView& first = w.gate[0];
  if (!IsQuantizedWeight(first.dtype)) return false;
  for (int32_t e = 0; e < w.num_experts; ++e) {
    for (const MatView* v : {&w.gate[e], &w.up[e], &w.down[e]}) {
      if (v->dtype != first.dtype || v->group_size != first.group_size) return false;
    }
  }
  return true;
}

absl::Status MoeQuantExperts(const MatView& x, const int32_t* ids, const float* weights,
                             int top_k, const ExpertWeights& experts, const MatView& out,
                             Scratch& scratch, cudaStream_t stream,
                             const kernels::KernelPolicy& policy) {
  return RunQuant(x, ids, weights, top_k, experts, out, scratch, stream, policy, nullptr);
}

absl::Status MoeQuantRouteExperts(const MatView& logits, const MoeRouteArgs& r, const MatView& x,
                                  const ExpertWeights& experts, const MatView& out,
                                  Scratch& scratch, cudaStream_t stream,
                                  const kernels::KernelPolicy& policy) {
  const kernels::MoeRouting route = RoutingOf(logits, r);
  return RunQuant(x, r.ids, r.weights, r.top_k + (r.appended >= 0 ? 1 : 0), experts, out,
                  scratch, stream, policy, &route);
}

absl::Status MoeExperts(const MatView& x, const int32_t* ids, const float* weights, int top_k,
                        const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                        cudaStream_t stream, const kernels::KernelPolicy& policy,
                        kernels::MoeRunInfo* info) {
  return Run(x, ids, weights, top_k, experts, out, scratch, stream, policy, info, nullptr);
}

absl::Status MoeRouteExperts(const MatView& logits, const MoeRouteArgs& r, const MatView& x,
                             const ExpertWeights& experts, const MatView& out, Scratch& scratch,
                             cudaStream_t stream, const kernels::KernelPolicy& policy,
                             kernels::MoeRunInfo* info) {
  const kernels::MoeRouting route = RoutingOf(logits, r);
  return Run(x, r.ids, r.weights, r.top_k + (r.appended >= 0 ? 1 : 0), experts, out, scratch,
             stream, policy, info, &route);
}

}  // namespace glm::engine::cuda
