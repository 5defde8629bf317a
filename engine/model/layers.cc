#include "engine/model/layers.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace glm::engine {

void* Workspace::Take(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  while (chunk_ < chunks_.size() && offset_ + bytes > chunks_[chunk_]->bytes()) {
    ++chunk_;
    offset_ = 0;
  }
  if (chunk_ == chunks_.size()) {
    constexpr size_t kMinChunk = 8u << 20;
    chunks_.push_back(backend_->Allocate(std::max(bytes, kMinChunk)));
    offset_ = 0;
  }
  void* p = static_cast<char*>(chunks_[chunk_]->data()) + offset_;
  offset_ += bytes;
  return p;
}

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// Whether this rank's row-parallel output adds onto the residual stream (TpGroup).
bool AddsResidual(const StepContext& ctx) {
  return ctx.tp == nullptr || ctx.tp->adds_residual();
}

// The residual stream [T, H] after the ranks' row-parallel outputs: summed over the TP group.
void ReduceResidual(StepContext& ctx, const MatView& h) {
  if (ctx.tp != nullptr) ctx.tp->AllReduce(ctx.backend, h);
}

}  // namespace

absl::StatusOr<TensorSlice> WeightLoader::Share(const std::string& name, int64_t rows,
                                                 int64_t cols, TpSplit split, int64_t* local_rows,
                                                 int64_t* local_cols) const {
  *local_rows = rows;
  *local_cols = cols;
  TensorSlice slice;
  if (split == TpSplit::kReplicated || tp_.size == 1) return slice;
  const bool by_rows = split == TpSplit::kColumnParallel;
  const int64_t n = by_rows ? rows : cols;
  if (n % tp_.size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " [", rows, ", ", cols, "]: its ", by_rows ? "rows" : "columns", " (", n,
        ") do not split evenly across tp_size=", tp_.size, " ranks; use a tp_size that divides ",
        n));
  }
  const int64_t share = n / tp_.size;
  slice.dim = by_rows ? TensorSlice::kRows : TensorSlice::kCols;
  slice.begin = tp_.rank * share;
  slice.end = slice.begin + share;
  (by_rows ? *local_rows : *local_cols) = share;
  return slice;
}

absl::StatusOr<std::vector<float>> WeightLoader::Host(const std::string& name, int64_t rows,
                                                      int64_t cols, TpSplit split) {
  int64_t local_rows = 0, local_cols = 0;
  GLM_ASSIGN_OR_RETURN(const TensorSlice slice,
                       Share(name, rows, cols, split, &local_rows, &local_cols));
  std::vector<int64_t> shape;
  GLM_ASSIGN_OR_RETURN(std::vector<float> data,
                       slice.dim == TensorSlice::kWhole
                           ? source_.ReadFloat(name, &shape)
                           : source_.ReadFloatSlice(name, slice, &shape));
  const bool is_vector = rows == 1;
  const bool ok = is_vector ? (shape.size() == 1 && shape[0] == cols)
                            : (shape.size() == 2 && shape[0] == rows && shape[1] == cols);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " has shape ", ShapeString(shape), "; config.json implies ",
        is_vector ? ShapeString({cols}) : ShapeString({rows, cols}),
        ". Check that config.json belongs to this checkpoint"));
  }
  return data;
}

DeviceMatrix WeightLoader::Upload(const std::vector<float>& data, int64_t rows, int64_t cols) {
  DeviceMatrix m;
  m.buffer = backend_->Allocate(data.size() * sizeof(float));
  backend_->CopyToDevice(m.buffer->data(), data.data(), data.size() * sizeof(float));
  m.view = {m.buffer->f32(), rows, cols, cols};
  bytes_.total += static_cast<int64_t>(data.size() * sizeof(float));
  return m;
}

absl::StatusOr<LinearWeightMode> ParseLinearWeightMode(const std::string& s) {
  if (s == "fp32") return LinearWeightMode::kF32;
  if (s == "bf16") return LinearWeightMode::kBF16;
  if (s == "auto") return LinearWeightMode::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "weight dtype `", s, "` is not one of fp32, bf16, auto (--dtype / weight_dtype)"));
}

namespace {

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

DeviceMatrix WeightLoader::UploadLinearF32(const std::vector<float>& data, int64_t rows,
                                           int64_t cols) {
  DeviceMatrix m = Upload(data, rows, cols);
  bytes_.linear += rows * cols * 4;
  bytes_.linear_fp32 += rows * cols * 4;
  ++bytes_.num_linear[0];
  return m;
}

std::optional<WeightDType> WeightLoader::QuantizedKind(const LinearPart& part,
                                                       int64_t cols) const {
  if (mode_ != LinearWeightMode::kAuto || !part.keep_quantized) return std::nullopt;
  const std::optional<QuantizedInfo> info = source_.QuantizedInfoOf(part.name);
  if (!info.has_value() || !backend_->SupportsWeightDType(info->dtype)) return std::nullopt;
  int64_t local_rows = 0, local_cols = 0;
  const absl::StatusOr<TensorSlice> slice =
      Share(part.name, part.rows, cols, part.split, &local_rows, &local_cols);
  // An uneven split fails when the tensor is read; a share that cuts through a group or a packed
  // word is dequantized from its slice instead.
  if (slice.ok() && !QuantizedSliceAligned(*info, *slice)) return std::nullopt;
  // The backend's kernels' shape limits on this rank's share (else widened).
  const int64_t group = info->group_size > 0 ? info->group_size : local_cols;
  if (!backend_->SupportsQuantizedShape(info->dtype, local_rows, local_cols, group)) {
    return std::nullopt;
  }
  return info->dtype;
}

WeightDType WeightLoader::LinearKind(const LinearPart& part, int64_t cols) const {
  if (mode_ == LinearWeightMode::kF32) return WeightDType::kF32;
  if (const std::optional<WeightDType> q = QuantizedKind(part, cols)) return *q;
  if (mode_ == LinearWeightMode::kAuto && source_.IsFp8Block(part.name)) {
    int64_t local_rows = 0, local_cols = 0;
    const absl::StatusOr<TensorSlice> slice =
        Share(part.name, part.rows, cols, part.split, &local_rows, &local_cols);
    // An uneven split fails when the tensor is read; a share that cuts through scale blocks is
    // dequantized from its slice and kept in bf16.
    if (local_cols % 16 == 0 &&
        (!slice.ok() || Fp8SliceAligned({part.rows, cols}, *slice))) {
      return WeightDType::kF8E4M3Block128;
    }
  }
  return WeightDType::kBF16;
}

absl::StatusOr<DeviceMatrix> WeightLoader::Linear(const std::string& name, int64_t rows,
                                                  int64_t cols, TpSplit split) {
  return LinearRows({{name, rows, split}}, cols);
}

absl::StatusOr<DeviceMatrix> WeightLoader::LinearRows(const std::vector<LinearPart>& parts,
                                                      int64_t cols, std::vector<int64_t>* offsets) {
  if (parts.empty()) return absl::InvalidArgumentError("LinearRows: no parts");
  const WeightDType kind = LinearKind(parts[0], cols);
  if (IsQuantizedWeight(kind) && parts.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LinearRows: ", parts[0].name, " is kept INT4 / INT8 / NVFP4 as stored, and such weights "
        "are not fused (each keeps its own scales and NVFP4 global scale); load the ",
        parts.size(), " parts as separate Linear weights"));
  }
  const int64_t align = kind == WeightDType::kF8E4M3Block128 ? 128 : 1;
  const int64_t whole_cols = cols;
  std::vector<int64_t> first(parts.size());
  std::vector<int64_t> part_rows(parts.size());  // this rank's rows of each part
  std::vector<TensorSlice> slices(parts.size());
  int64_t rows = 0, real_rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (LinearKind(parts[i], whole_cols) != kind) {
      return absl::InvalidArgumentError(
          absl::StrCat("LinearRows: ", parts[i].name, " is not stored like ", parts[0].name,
                       " (fp8 block-scaled or quantized vs not); load them as separate Linear "
                       "weights"));
    }
    int64_t local_cols = 0;
    GLM_ASSIGN_OR_RETURN(slices[i], Share(parts[i].name, parts[i].rows, whole_cols,
                                          parts[i].split, &part_rows[i], &local_cols));
    if (i == 0) {
      cols = local_cols;
    } else if (local_cols != cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LinearRows: ", parts[i].name, " is split by input columns and ", parts[0].name,
          " is not (or the other way round); load them as separate Linear weights"));
    }
    rows = (rows + align - 1) / align * align;
    first[i] = rows;
    rows += part_rows[i];
    real_rows += part_rows[i];
  }
  if (offsets != nullptr) *offsets = first;
  DeviceMatrix m;
  int64_t stored = 0, real = 0;  // bytes in backend memory, and of them the parts' own
  if (kind == WeightDType::kF32) {
    std::vector<float> data(rows * cols, 0.0f);
    for (size_t i = 0; i < parts.size(); ++i) {
      GLM_ASSIGN_OR_RETURN(std::vector<float> host,
                           Host(parts[i].name, parts[i].rows, whole_cols, parts[i].split));
      std::copy(host.begin(), host.end(), data.begin() + first[i] * cols);
    }
    m.buffer = backend_->Allocate(data.size() * sizeof(float));
    backend_->CopyToDevice(m.buffer->data(), data.data(), data.size() * sizeof(float));
    m.view = {m.buffer->f32(), rows, cols, cols};
    stored = rows * cols * 4;
    real = real_rows * cols * 4;
  } else if (kind == WeightDType::kF8E4M3Block128) {
    const int64_t scols = (cols + 127) / 128;
    const int64_t scale_ld = (scols + 3) / 4 * 4;  // cuBLASLt's block-scaling stride rule
    std::vector<uint8_t> payload(rows * cols, 0);
    std::vector<float> scales(((rows + 127) / 128) * scale_ld, 0.0f);
    for (size_t i = 0; i < parts.size(); ++i) {
      const LinearPart& p = parts[i];
      GLM_ASSIGN_OR_RETURN(Fp8BlockTensor t,
                           slices[i].dim == TensorSlice::kWhole
                               ? source_.ReadFp8Block(p.name)
                               : source_.ReadFp8BlockSlice(p.name, slices[i]));
      const std::vector<int64_t> whole =
          slices[i].dim == TensorSlice::kWhole ? t.shape : t.full_shape;
      const int64_t srows = (part_rows[i] + 127) / 128;
      if (whole != std::vector<int64_t>{p.rows, whole_cols} ||
          t.shape != std::vector<int64_t>{part_rows[i], cols} ||
          static_cast<int64_t>(t.scales.size()) != srows * scols ||
          static_cast<int64_t>(t.data.size()) != part_rows[i] * cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", p.name, " has shape ", ShapeString(whole), " with ", t.scales.size(),
            " block scales for ", ShapeString(t.shape), "; config.json implies ",
            ShapeString({p.rows, whole_cols}), " and ", srows * scols,
            " for this rank's ", ShapeString({part_rows[i], cols}),
            ". Check that config.json belongs to this checkpoint"));
      }
      std::copy(t.data.begin(), t.data.end(), payload.begin() + first[i] * cols);
      for (int64_t r = 0; r < srows; ++r) {
        std::copy_n(t.scales.data() + r * scols, scols,
                    scales.data() + (first[i] / 128 + r) * scale_ld);
      }
    }
    m.buffer = backend_->Allocate(payload.size());
    backend_->CopyToDevice(m.buffer->data(), payload.data(), payload.size());
    m.scale_buffer = backend_->Allocate(scales.size() * sizeof(float));
    backend_->CopyToDevice(m.scale_buffer->data(), scales.data(), scales.size() * sizeof(float));
    m.view = {m.buffer->f32(), rows, cols, cols};
    m.view.dtype = WeightDType::kF8E4M3Block128;
    m.view.scales = m.scale_buffer->f32();
    m.view.scale_ld = scale_ld;
    const int64_t scale_bytes = static_cast<int64_t>(scales.size() * sizeof(float));
    stored = static_cast<int64_t>(payload.size()) + scale_bytes;
    real = real_rows * cols + scale_bytes;
    bytes_.fp8_scales += scale_bytes;
    bytes_.fp8_payload += real_rows * cols;
  } else if (IsQuantizedWeight(kind)) {
    const LinearPart& p = parts[0];
    GLM_ASSIGN_OR_RETURN(QuantizedTensor t, source_.ReadQuantized(p.name, slices[0]));
    if (t.dtype != kind || t.full_shape != std::vector<int64_t>{p.rows, whole_cols} ||
        t.shape != std::vector<int64_t>{rows, cols} ||
        static_cast<int64_t>(t.data.size()) != rows * t.row_bytes ||
        static_cast<int64_t>(t.scales.size()) != rows * t.scale_cols * t.scale_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", p.name, " has shape ", ShapeString(t.full_shape), " (this rank's ",
          ShapeString(t.shape), ", ", t.row_bytes, " bytes per packed row, ", t.scale_cols,
          " scales per row); config.json implies ", ShapeString({p.rows, whole_cols}), " and ",
          ShapeString({rows, cols}), " for this rank. Check that config.json belongs to this "
          "checkpoint"));
    }
    // 16-byte rows of packed codes and of scales (vector loads in the kernels).
    const int64_t ld = (t.row_bytes + 15) / 16 * 16;
    const int64_t scale_row_bytes = (t.scale_cols * t.scale_bytes + 15) / 16 * 16;
    std::vector<uint8_t> payload(rows * ld, 0), scales(rows * scale_row_bytes, 0);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(t.data.data() + r * t.row_bytes, t.row_bytes, payload.data() + r * ld);
      std::copy_n(t.scales.data() + r * t.scale_cols * t.scale_bytes,
                  t.scale_cols * t.scale_bytes, scales.data() + r * scale_row_bytes);
    }
    m.buffer = backend_->Allocate(payload.size());
    backend_->CopyToDevice(m.buffer->data(), payload.data(), payload.size());
    m.scale_buffer = backend_->Allocate(scales.size());
    backend_->CopyToDevice(m.scale_buffer->data(), scales.data(), scales.size());
    m.view = {m.buffer->f32(), rows, cols, ld};
    m.view.dtype = kind;
    m.view.group_scales = m.scale_buffer->data();
    m.view.scale_ld = scale_row_bytes / t.scale_bytes;
    m.view.group_size = t.group_size;
    m.view.global_scale = t.global_scale;
    stored = static_cast<int64_t>(payload.size() + scales.size());
    real = stored;
    bytes_.quant_payload += static_cast<int64_t>(payload.size());
    bytes_.quant_scales += static_cast<int64_t>(scales.size());
  } else {
    const int64_t ld = (cols + 7) / 8 * 8;  // 16-byte rows for cuBLASLt and 8-byte loads
    std::vector<uint16_t> h(rows * ld, 0);
    for (size_t i = 0; i < parts.size(); ++i) {
      GLM_ASSIGN_OR_RETURN(std::vector<float> data,
                           Host(parts[i].name, parts[i].rows, whole_cols, parts[i].split));
      for (int64_t r = 0; r < part_rows[i]; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          h[(first[i] + r) * ld + c] = ToBf16(data[r * cols + c]);
        }
      }
    }
    m.buffer = backend_->Allocate(h.size() * sizeof(uint16_t));
    backend_->CopyToDevice(m.buffer->data(), h.data(), h.size() * sizeof(uint16_t));
    m.view = {m.buffer->f32(), rows, cols, ld};
    m.view.dtype = WeightDType::kBF16;
    stored = static_cast<int64_t>(h.size() * sizeof(uint16_t));
    real = real_rows * ld * 2;
  }
  bytes_.total += stored;
  bytes_.linear += real;
  bytes_.linear_fp32 += real_rows * cols * 4;
  bytes_.num_linear[static_cast<int>(kind)] += static_cast<int64_t>(parts.size());
  return m;
}

absl::StatusOr<DeviceMatrix> WeightLoader::Matrix(const std::string& name, int64_t rows,
                                                  int64_t cols) {
  GLM_ASSIGN_OR_RETURN(std::vector<float> data, Host(name, rows, cols));
  return Upload(data, rows, cols);
}

absl::StatusOr<DeviceMatrix> WeightLoader::Vector(const std::string& name, int64_t size) {
  GLM_ASSIGN_OR_RETURN(std::vector<float> data, Host(name, 1, size));
  return Upload(data, 1, size);
}

// ---- FusedLinear ------------------------------------------------------------------------------

absl::StatusOr<FusedLinear> FusedLinear::Load(WeightLoader& w, const std::vector<LinearPart>& parts,
                                              int64_t cols) {
  FusedLinear f;
  for (size_t begin = 0; begin < parts.size();) {
    const WeightDType kind = w.LinearKind(parts[begin], cols);
    size_t end = begin + 1;
    while (w.fuse() && !IsQuantizedWeight(kind) && end < parts.size() &&
           w.LinearKind(parts[end], cols) == kind) {
      ++end;
    }
    const std::vector<LinearPart> group(parts.begin() + begin, parts.begin() + end);
    std::vector<int64_t> rows_at;
    Group g;
    GLM_ASSIGN_OR_RETURN(g.weight, w.LinearRows(group, cols, &rows_at));
    g.out_offset = f.out_cols_;
    for (size_t i = 0; i < group.size(); ++i) {
      f.offsets_.push_back(g.out_offset + rows_at[i]);
      // This rank's rows (LinearRows checked that the split divides them).
      f.rows_.push_back(group[i].split == TpSplit::kColumnParallel
                            ? group[i].rows / w.tp().size
                            : group[i].rows);
    }
    f.out_cols_ += g.weight.view.rows;
    f.groups_.push_back(std::move(g));
    begin = end;
  }
  return f;
}

MatView FusedLinear::WeightPart(size_t i) const {
  size_t gi = 0;
  while (gi + 1 < groups_.size() && groups_[gi + 1].out_offset <= offsets_[i]) ++gi;
  const MatView& w = groups_[gi].weight.view;
  const int64_t first = offsets_[i] - groups_[gi].out_offset;  // row in the group's weight
  MatView v = w;
  v.rows = rows_[i];
  if (IsQuantizedWeight(w.dtype)) return v;  // a group of its own (first == 0)
  const int64_t elem_bytes = w.dtype == WeightDType::kF32    ? 4
                             : w.dtype == WeightDType::kBF16 ? 2
                                                             : 1;
  v.data = reinterpret_cast<float*>(reinterpret_cast<char*>(w.data) + first * w.ld * elem_bytes);
  if (w.dtype == WeightDType::kF8E4M3Block128) v.scales = w.scales + first / 128 * w.scale_ld;
  return v;
}

void FusedLinear::Forward(StepContext& ctx, const MatView& x, const MatView& out) const {
  for (const Group& g : groups_) {
    ctx.backend->Linear(x, g.weight.view, out.Cols(g.out_offset, g.weight.view.rows), false);
  }
}

void FusedLinear::ForwardNormed(StepContext& ctx, const MatView& x, const float* norm_w, float eps,
                                const MatView& normed, const MatView& out) const {
  for (size_t i = 0; i < groups_.size(); ++i) {
    const Group& g = groups_[i];
    const MatView y = out.Cols(g.out_offset, g.weight.view.rows);
    if (i == 0) {
      ctx.backend->RmsNormLinear(x, norm_w, eps, normed, g.weight.view, y, false);
    } else {
      ctx.backend->Linear(normed, g.weight.view, y, false);
    }
  }
}

// ---- DenseMlp ---------------------------------------------------------------------------------

absl::StatusOr<DenseMlp> DenseMlp::Load(WeightLoader& w, const std::string& prefix, int64_t hidden,
                                        int64_t inter) {
  DenseMlp m;
  constexpr TpSplit kCol = TpSplit::kColumnParallel;
  GLM_ASSIGN_OR_RETURN(m.gate_up, FusedLinear::Load(w,
                                                    {{prefix + ".gate_proj.weight", inter, kCol},
                                                     {prefix + ".up_proj.weight", inter, kCol}},
                                                    hidden));
  GLM_ASSIGN_OR_RETURN(m.down, w.Linear(prefix + ".down_proj.weight", hidden, inter,
                                        TpSplit::kRowParallel));
  return m;
}

void DenseMlp::Forward(StepContext& ctx, const MatView& x, const MatView& out) const {
  Partial(ctx, x, out, AddsResidual(ctx));
  ReduceResidual(ctx, out);
}

void DenseMlp::Partial(StepContext& ctx, const MatView& x, const MatView& out,
                       bool accumulate) const {
  MatView gu = ctx.ws->Mat(x.rows, gate_up.out_cols());  // [T, gate | up]
  gate_up.Forward(ctx, x, gu);
  const MatView g = gate_up.Part(gu, 0);  // [T, inter_local]
  ctx.backend->SiluMul(g, gate_up.Part(gu, 1), g);
  ctx.backend->Linear(g, down.view, out, accumulate);  // out (+)= [T, H]
}

// ---- Moe --------------------------------------------------------------------------------------

absl::StatusOr<Moe> Moe::Load(WeightLoader& w, const ModelConfig& c, const std::string& prefix) {
  Moe m;
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  if (c.n_group < 1 || c.n_routed_experts % c.n_group != 0 || c.topk_group < 1 ||
      c.topk_group > c.n_group || c.num_experts_per_tok > c.n_routed_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": n_routed_experts=", c.n_routed_experts, " n_group=", c.n_group,
        " topk_group=", c.topk_group, " num_experts_per_tok=", c.num_experts_per_tok,
        " are inconsistent; experts must split evenly into groups and top-k fit in them"));
  }
  GLM_ASSIGN_OR_RETURN(m.router, w.Matrix(prefix + ".gate.weight", c.n_routed_experts, hidden));
  const std::string bias_name = prefix + ".gate.e_score_correction_bias";
  if (w.Has(bias_name)) {
    GLM_ASSIGN_OR_RETURN(m.bias, w.Vector(bias_name, c.n_routed_experts));
  } else {
    m.bias = w.Upload(std::vector<float>(c.n_routed_experts, 0.0f), 1, c.n_routed_experts);
  }
  // Routed experts keep gate and up apart: MoeExperts reads each expert's weights by view. With
  // TP each rank holds every expert's share of the intermediate width ([inter / tp_size, H]
  // gate and up, [H, inter / tp_size] down).
  constexpr TpSplit kCol = TpSplit::kColumnParallel, kRow = TpSplit::kRowParallel;
  for (int e = 0; e < c.n_routed_experts; ++e) {
    const std::string p = absl::StrCat(prefix, ".experts.", e);
    GLM_ASSIGN_OR_RETURN(DeviceMatrix gate, w.Linear(p + ".gate_proj.weight", inter, hidden, kCol));
    GLM_ASSIGN_OR_RETURN(DeviceMatrix up, w.Linear(p + ".up_proj.weight", inter, hidden, kCol));
    GLM_ASSIGN_OR_RETURN(DeviceMatrix down,
                         w.Linear(p + ".down_proj.weight", hidden, inter, kRow));
    m.gate_views.push_back(gate.view);
    m.up_views.push_back(up.view);
    m.down_views.push_back(down.view);
    m.expert_weights.push_back(std::move(gate));
    m.expert_weights.push_back(std::move(up));
    m.expert_weights.push_back(std::move(down));
  }
  GLM_ASSIGN_OR_RETURN(m.shared, DenseMlp::Load(w, prefix + ".shared_experts", hidden,
                                                inter * std::max(1, c.n_shared_experts)));
  m.num_routed = static_cast<int32_t>(c.n_routed_experts);
  // The shared expert as expert num_routed of MoeExperts: only where it has the routed experts'
  // shape and storage (every expert of a MoeExperts call must) and gate | up are one group.
  if (c.n_routed_experts > 0 && m.shared.gate_up.num_groups() == 1) {
    const MatView sg = m.shared.gate_up.WeightPart(0), su = m.shared.gate_up.WeightPart(1);
    const MatView &sd = m.shared.down.view, &rg = m.gate_views[0], &rd = m.down_views[0];
    m.shared_folds = sg.rows == rg.rows && sg.cols == rg.cols && sg.dtype == rg.dtype &&
                     su.dtype == rg.dtype && sd.dtype == rg.dtype && sd.rows == rd.rows &&
                     sd.cols == rd.cols;
    if (m.shared_folds) {
      m.gate_views.push_back(sg);
      m.up_views.push_back(su);
      m.down_views.push_back(sd);
    }
  }
  m.top_k = c.num_experts_per_tok;
  m.n_group = c.n_group;
  m.topk_group = c.topk_group;
  m.renormalize = c.norm_topk_prob;
  m.scale = static_cast<float>(c.routed_scaling_factor);
  return m;
}

void Moe::Forward(StepContext& ctx, const MatView& x, const MatView& out) const {
  MatView logits = ctx.ws->Mat(x.rows, router.view.rows);  // [T, n_routed_experts], fp32 router
  ctx.backend->Linear(x, router.view, logits, false);
  Experts(ctx, x, logits, out);
}

void Moe::ForwardNormed(StepContext& ctx, const MatView& h, const RmsNormLayer& norm,
                        const MatView& x, const MatView& out) const {
  MatView logits = ctx.ws->Mat(h.rows, router.view.rows);  // [T, n_routed_experts], fp32 router
  ctx.backend->RmsNormLinear(h, norm.weight.data(), norm.eps, x, router.view, logits, false);
  Experts(ctx, x, logits, out);
}

void Moe::Experts(StepContext& ctx, const MatView& x, const MatView& logits,
                  const MatView& out) const {
  const int64_t T = x.rows;
  const bool fold = shared_folds && T <= shared_fold_max_tokens;
  const int k = fold ? top_k + 1 : top_k;  // experts per token given to MoeExperts
  MoeRouteArgs r;
  r.bias = bias.data(), r.n_group = n_group, r.topk_group = topk_group, r.top_k = top_k;
  r.renormalize = renormalize, r.scale = scale, r.appended = fold ? num_routed : -1;
  r.ids = ctx.ws->Ints(T * k);        // [T, k]
  r.weights = ctx.ws->Floats(T * k);  // [T, k]
  // The shared expert and then the routed experts accumulate onto out (the residual stream;
  // MoeExperts is out +=): no Fill and no Add launch. With TP, ranks other than 0 start from
  // zero instead, and one all-reduce sums the ranks' partial experts onto the residual (tp.h).
  const bool adds = AddsResidual(ctx);
  if (!adds) ctx.backend->Fill(out, 0.0f);
  if (!fold) shared.Partial(ctx, x, out, /*accumulate=*/true);  // out += [T, H]
  ExpertWeights ew{gate_views.data(), up_views.data(), down_views.data(),
                   fold ? num_routed + 1 : num_routed};
  ctx.backend->MoeRouteExperts(logits, r, x, ew, out);  // routes, then out += experts
  ReduceResidual(ctx, out);
}

// ---- Indexer ----------------------------------------------------------------------------------

absl::StatusOr<Indexer> Indexer::Load(WeightLoader& w, const ModelConfig& c,
                                      const std::string& prefix) {
  Indexer ix;
  GLM_ASSIGN_OR_RETURN(ix.k_norm_w, w.Vector(prefix + ".k_norm.weight", c.index_head_dim));
  GLM_ASSIGN_OR_RETURN(ix.k_norm_b, w.Vector(prefix + ".k_norm.bias", c.index_head_dim));
  return ix;
}

void Indexer::WriteKeys(StepContext& ctx, const MatView& k, const LayerKv& kv) const {
  const ModelConfig& c = *ctx.config;
  const int64_t T = ctx.num_rows, head_dim = c.index_head_dim;
  const int num_freqs = static_cast<int>(c.qk_rope_head_dim / 2);
  ctx.backend->LayerNorm(k, k_norm_w.data(), k_norm_b.data(),
                         static_cast<float>(c.indexer_norm_eps), k);
  ctx.backend->RopeInterleaved(HeadsView{k.data, T, 1, head_dim, k.ld, 0}, ctx.positions,
                               ctx.inv_freq, num_freqs);
  if (kv.dtype == KvDType::kFp8) {
    ctx.backend->WriteIndexKeysFp8(k, ctx.new_slots, kv.index_fp8);
  } else {
    ctx.backend->ScatterRows(k, ctx.new_slots, kv.index_keys);
  }
}

HeadsView Indexer::QueryHeads(const StepContext& ctx, const MatView& q) const {
  const ModelConfig& c = *ctx.config;
  const int64_t head_dim = c.index_head_dim;
  return HeadsView{q.data, ctx.num_rows, c.index_n_heads, head_dim, q.ld, head_dim};
}

void Indexer::Select(StepContext& ctx, const HeadsView& qh, const MatView& w,
                     const LayerKv& kv) const {
  const ModelConfig& c = *ctx.config;
  const int64_t n_heads = c.index_n_heads, head_dim = c.index_head_dim;
  const bool fp8 = kv.dtype == KvDType::kFp8;
  IndexerTopKArgs args;
  args.q = qh;
  args.weights = w;
  if (fp8) {
    args.keys = MatView{nullptr, kv.index_fp8.num_slots, head_dim, head_dim};  // dims only
    args.keys_fp8 = kv.index_fp8;
  } else {
    args.keys = kv.index_keys;
  }
  args.table = ctx.table;
  args.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n_heads)));
  args.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  args.top_k = static_cast<int32_t>(c.index_topk);
  args.out = ctx.topk;
  ctx.backend->IndexerTopK(args);
  ctx.topk_valid = true;
}

// ---- MlaAttention -----------------------------------------------------------------------------

absl::StatusOr<MlaAttention> MlaAttention::Load(WeightLoader& w, const ModelConfig& c,
                                                const std::string& prefix, bool has_indexer) {
  MlaAttention m;
  // nh: every head (the checkpoint's shapes); m.num_heads: this rank's (the stored shapes).
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nope = c.qk_nope_head_dim,
                rope = c.qk_rope_head_dim, vd = c.v_head_dim, kvr = c.kv_lora_rank;
  if (nh % w.tp().size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": num_attention_heads=", nh, " does not split across tp_size=", w.tp().size,
        " ranks; use a tp_size that divides it"));
  }
  m.num_heads = nh / w.tp().size;
  constexpr TpSplit kByHead = TpSplit::kColumnParallel;  // rows are head-major
  std::vector<LinearPart> a_parts = {{prefix + ".q_a_proj.weight", c.q_lora_rank},
                                     {prefix + ".kv_a_proj_with_mqa.weight", kvr + rope}};
  std::vector<LinearPart> b_parts = {{prefix + ".q_b_proj.weight", nh * (nope + rope), kByHead}};
  if (has_indexer) {
    const std::string ix = prefix + ".indexer";
    a_parts.push_back({ix + ".wk.weight", c.index_head_dim});
    a_parts.push_back({ix + ".weights_proj.weight", c.index_n_heads});
    b_parts.push_back({ix + ".wq_b.weight", c.index_n_heads * c.index_head_dim});
  }
  GLM_ASSIGN_OR_RETURN(m.a_proj, FusedLinear::Load(w, a_parts, H));
  GLM_ASSIGN_OR_RETURN(m.b_proj, FusedLinear::Load(w, b_parts, c.q_lora_rank));
  GLM_ASSIGN_OR_RETURN(m.q_a_norm, w.Vector(prefix + ".q_a_layernorm.weight", c.q_lora_rank));
  GLM_ASSIGN_OR_RETURN(m.kv_a_norm, w.Vector(prefix + ".kv_a_layernorm.weight", kvr));
  const std::string kv_b_name = prefix + ".kv_b_proj.weight";
  // fp32 models (and any model loaded with AttentionPolicy::absorb_fp32) keep kv_b in fp32 plus
  // a transposed W_UK^T copy; narrow models keep kv_b as stored and absorb with AbsorbPerHead.
  // The tensor is read from the source once either way.
  const bool fp32_absorb = w.mode() == LinearWeightMode::kF32 || w.absorb_fp32();
  std::vector<float> kv_b_host;  // the fp32 path's host copy, this rank's heads
  const int64_t lnh = m.num_heads;
  if (fp32_absorb) {
    GLM_ASSIGN_OR_RETURN(kv_b_host, w.Host(kv_b_name, nh * (nope + vd), kvr, kByHead));
    m.kv_b = w.UploadLinearF32(kv_b_host, lnh * (nope + vd), kvr);
  } else {
    // keep_quantized false: AbsorbPerHead takes no INT4 / INT8 / NVFP4 weight (layers.h).
    GLM_ASSIGN_OR_RETURN(m.kv_b, w.LinearRows({{kv_b_name, nh * (nope + vd), kByHead,
                                                /*keep_quantized=*/false}},
                                              kvr));
  }
  if (!kv_b_host.empty()) {
    // W_UK^T per head: w_uk_t[h][c][d] = kv_b[h * (nope + vd) + d][c], d < nope.
    std::vector<float> uk_t(lnh * kvr * nope);
    for (int64_t h = 0; h < lnh; ++h) {
      for (int64_t d = 0; d < nope; ++d) {
        const float* row = kv_b_host.data() + (h * (nope + vd) + d) * kvr;
        for (int64_t ci = 0; ci < kvr; ++ci) uk_t[(h * kvr + ci) * nope + d] = row[ci];
      }
    }
    m.w_uk_t = w.Upload(uk_t, lnh * kvr, nope);
  }
  GLM_ASSIGN_OR_RETURN(m.o_proj,
                       w.Linear(prefix + ".o_proj.weight", H, nh * vd, TpSplit::kRowParallel));
  if (has_indexer) {
    GLM_ASSIGN_OR_RETURN(Indexer ix, Indexer::Load(w, c, prefix + ".indexer"));
    m.indexer = std::make_unique<Indexer>(std::move(ix));
  }
  return m;
}

void MlaAttention::Forward(StepContext& ctx, const MatView& h, const RmsNormLayer& norm,
                           const LayerKv& kv, const MatView& out) const {
  const ModelConfig& c = *ctx.config;
  const int64_t T = ctx.num_rows, nh = num_heads, nope = c.qk_nope_head_dim,
                rope = c.qk_rope_head_dim, kvr = c.kv_lora_rank, qk = nope + rope;
  const int num_freqs = static_cast<int>(rope / 2);
  Backend* b = ctx.backend;
  const float latent_eps = static_cast<float>(c.latent_norm_eps);

  // One Linear for everything computed from the normed input a = norm(h), one for everything from
  // the query latent; each norm runs inside its Linear where the backend can (at batch 1 two
  // launches fewer on the step's critical path).
  MatView a = ctx.ws->Mat(T, h.cols);                 // [T, H] norm(h)
  MatView a_out = ctx.ws->Mat(T, a_proj.out_cols());  // [T, q_a | kv_a (| wk | weights_proj)]
  a_proj.ForwardNormed(ctx, h, norm.weight.data(), norm.eps, a, a_out);

  // The KV path (the latent's norm, RoPE and cache write; the indexer key's) needs nothing but
  // a_out: a side branch, concurrent with the query path below up to JoinSide (at batch 1 these
  // are six short kernels that would otherwise wait for each other and for q_b).
  b->BeginSide();
  const MatView lat = a_proj.Part(a_out, kKvA);  // [T, kv_lora_rank + rope]: c_kv | k_pe
  b->RmsNorm(lat.Cols(0, kvr), kv_a_norm.data(), latent_eps, lat.Cols(0, kvr));
  b->RopeInterleaved(HeadsView{lat.data + kvr, T, 1, rope, lat.ld, 0}, ctx.positions, ctx.inv_freq,
                     num_freqs);
  if (kv.dtype == KvDType::kFp8) {
    b->WriteLatentFp8(lat, ctx.new_slots, kv.latent_fp8);
  } else {
    b->ScatterRows(lat, ctx.new_slots, kv.latent);
  }
  if (indexer != nullptr) indexer->WriteKeys(ctx, a_proj.Part(a_out, kIndexK), kv);
  b->EndSide();

  const MatView cq = a_proj.Part(a_out, kQa);               // [T, q_lora_rank]
  const MatView cq_normed = ctx.ws->Mat(T, c.q_lora_rank);  // q_a_layernorm(cq)
  MatView b_out = ctx.ws->Mat(T, b_proj.out_cols());        // [T, q_b (| wq_b)]
  b_proj.ForwardNormed(ctx, cq, q_a_norm.data(), latent_eps, cq_normed, b_out);
  const MatView q = b_proj.Part(b_out, kQb);  // [T, nh * (nope + rope)], this rank's heads
  HeadsView qh{q.data, T, nh, qk, q.ld, qk};  // [T, nh, nope + rope]
  HeadsView index_qh;
  if (indexer != nullptr) {
    // The query's RoPE and the indexer query's, one op (one launch on the GPU).
    index_qh = indexer->QueryHeads(ctx, b_proj.Part(b_out, kIndexQ));
    b->RopeInterleavedBoth(qh.Dims(nope, rope), index_qh, ctx.positions, ctx.inv_freq, num_freqs);
  } else {
    b->RopeInterleaved(qh.Dims(nope, rope), ctx.positions, ctx.inv_freq, num_freqs);
  }
  b->JoinSide();  // the cache holds this step's latents and keys from here on
  // Tried (commit 5a7c7d2, H200, GLM-5 widths, fp8): W_UK absorbed on a second side branch while
  // the indexer scores and selects; 1-2 % slower per layer (ms/layer in order -> side: batch 1
  // 0.237 -> 0.240 at 4K, 0.290 -> 0.297 at 128K; batch 8 0.824 -> 0.841, 1.036 -> 1.035), the
  // fork and join edges costing more than W_UK's ~6 us on the critical path. So it stays in order.

  if (indexer != nullptr) indexer->Select(ctx, index_qh, a_proj.Part(a_out, kIndexW), kv);
  // else: an IndexShare "shared" layer reuses ctx.topk (Forward guarantees it is set).

  MatView o = ctx.ws->Mat(T, nh * c.v_head_dim);  // [T, nh * v_head_dim]
  if (ctx.all_absorbed) {
    Absorbed(ctx, qh, 0, T, kv, o, /*after_select=*/indexer != nullptr);
  } else {
    std::vector<const SeqRows*> expanded;
    for (const SeqRows& s : ctx.seqs) {
      if (s.expanded) {
        expanded.push_back(&s);
      } else {
        Absorbed(ctx, qh, s.row_begin, s.num_rows, kv, o);
      }
    }
    Expanded(ctx, qh, expanded, kv, o);
  }
  // out += o . o_proj^T [T, H]: this rank's heads' share, summed over the TP group (tp.h).
  b->Linear(o, o_proj.view, out, /*accumulate=*/AddsResidual(ctx));
  ReduceResidual(ctx, out);
}

void MlaAttention::Absorbed(StepContext& ctx, const HeadsView& q, int64_t row_begin,
                            int64_t num_rows, const LayerKv& kv, const MatView& o,
                            bool after_select) const {
  const ModelConfig& c = *ctx.config;
  const int64_t nh = num_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
                kvr = c.kv_lora_rank, vd = c.v_head_dim;
  Backend* b = ctx.backend;
  HeadsView qr = q.Rows(row_begin, num_rows);
  // q_lat = q_nope . W_UK: [n, nh, kv_lora_rank]
  MatView q_lat = ctx.ws->Mat(num_rows, nh * kvr);
  HeadsView q_lat_h{q_lat.data, num_rows, nh, kvr, nh * kvr, kvr};
  const bool fp32_path = w_uk_t.buffer != nullptr;
  if (fp32_path) {
    b->LinearPerHead(qr.Dims(0, nope), w_uk_t.data(), kvr * nope, nope, q_lat_h);
  } else if (after_select) {
    // q_nope is b_proj's output (complete before the indexer began) and q_lat is new: neither is
    // touched by Select, so the product may run beside the indexer's last kernel.
    b->AbsorbPerHeadBesidePrevious(qr.Dims(0, nope), kv_b.view, nope + vd, 0,
                                   Backend::PerHeadContract::kRows, q_lat_h);
  } else {
    b->AbsorbPerHead(qr.Dims(0, nope), kv_b.view, nope + vd, 0, Backend::PerHeadContract::kRows,
                     q_lat_h);
  }
  MatView o_lat = ctx.ws->Mat(num_rows, nh * kvr);  // [n, nh, kv_lora_rank]
  HeadsView o_lat_h{o_lat.data, num_rows, nh, kvr, nh * kvr, kvr};
  AttentionArgs args;
  args.q_a = q_lat_h;
  args.q_b = qr.Dims(nope, rope);
  if (kv.dtype == KvDType::kFp8) {  // the views give dims only (backend.h)
    const int64_t slots = kv.latent_fp8.num_slots;
    args.k_a = HeadsView{nullptr, slots, nh, kvr, 0, 0};
    args.k_b = HeadsView{nullptr, slots, nh, rope, 0, 0};
    args.latent_fp8 = kv.latent_fp8;
  } else {
    const int64_t slots = kv.latent.rows, ld = kv.latent.ld;
    args.k_a = HeadsView{kv.latent.data, slots, nh, kvr, ld, 0};
    args.k_b = HeadsView{kv.latent.data + kvr, slots, nh, rope, ld, 0};
  }
  args.v = args.k_a;
  args.table = ctx.table;
  args.table.row_offset += row_begin;
  args.table.row_num_keys += row_begin;
  args.indices = ctx.topk + row_begin * c.index_topk;
  args.index_width = static_cast<int32_t>(c.index_topk);
  args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(nope + rope)));
  args.out = o_lat_h;
  b->Attention(args);
  // o = o_lat . W_UV^T per head; W_UV[h] = kv_b rows h * (nope + vd) + nope .. + vd.
  HeadsView oh{o.data + row_begin * o.ld, num_rows, nh, vd, o.ld, vd};
  if (fp32_path) {
    b->LinearPerHead(o_lat_h, kv_b.data() + nope * kvr, (nope + vd) * kvr, kvr, oh);
  } else {
    b->AbsorbPerHead(o_lat_h, kv_b.view, nope + vd, nope, Backend::PerHeadContract::kCols, oh);
  }
}

void MlaAttention::Expanded(StepContext& ctx, const HeadsView& q,
                            const std::vector<const SeqRows*>& seqs, const LayerKv& kv,
                            const MatView& o) const {
  if (seqs.empty()) return;
  const ModelConfig& c = *ctx.config;
  const int64_t nh = num_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
                kvr = c.kv_lora_rank, vd = c.v_head_dim;
  Backend* b = ctx.backend;
  // Every expanded sequence's cache, one after another, so that kv_b_proj multiplies them all in
  // one product (a narrow kv_b is widened once per layer and step, not once per sequence).
  std::vector<int64_t> first_key(seqs.size());
  int64_t total_keys = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    first_key[i] = total_keys;
    total_keys += seqs[i]->start_pos + seqs[i]->num_rows;
  }
  MatView lat = ctx.ws->Mat(total_keys, kvr + rope);  // [sum S, kvr + rope] the sequences' caches
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MatView rows = lat.Rows(first_key[i], seqs[i]->start_pos + seqs[i]->num_rows);
    const int32_t* slots = ctx.table.slots + seqs[i]->key_offset;
    if (kv.dtype == KvDType::kFp8) {  // dequantized to fp32 rows
      b->GatherLatentFp8(kv.latent_fp8, slots, rows);
    } else {
      b->GatherRows(kv.latent, slots, rows);
    }
  }
  MatView kvx = ctx.ws->Mat(total_keys, nh * (nope + vd));  // [sum S, nh, nope + vd]
  if (w_uk_t.buffer != nullptr) {  // the fp32 path
    b->Linear(lat.Cols(0, kvr), kv_b.view, kvx, false);
  } else {
    // Weight-only, like the absorbed form (AbsorbPerHead over all of kv_b_proj as one head):
    // both forms are fp32 math on the same widened weights, so a sequence's result does not
    // depend on which form the scheduler's chunking picked (the narrow Linear would round lat
    // to bf16 / e4m3 here and not in the absorbed form).
    const int64_t rows = nh * (nope + vd);
    b->AbsorbPerHead(HeadsView{lat.data, total_keys, 1, kvr, lat.ld, 0}, kv_b.view, rows, 0,
                     Backend::PerHeadContract::kCols,
                     HeadsView{kvx.data, total_keys, 1, rows, kvx.ld, 0});
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqRows& s = *seqs[i];
    const int64_t num_keys = s.start_pos + s.num_rows;
    const MatView skv = kvx.Rows(first_key[i], num_keys);  // this sequence's keys and values
    const MatView slat = lat.Rows(first_key[i], num_keys);
    AttentionArgs args;
    args.q_a = q.Rows(s.row_begin, s.num_rows).Dims(0, nope);
    args.q_b = q.Rows(s.row_begin, s.num_rows).Dims(nope, rope);
    args.k_a = HeadsView{skv.data, num_keys, nh, nope, skv.ld, nope + vd};
    args.k_b = HeadsView{slat.data + kvr, num_keys, nh, rope, slat.ld, 0};
    args.v = HeadsView{skv.data + nope, num_keys, nh, vd, skv.ld, nope + vd};
    args.table.slots = ctx.identity;
    args.table.row_offset = ctx.zeros;
    args.table.row_num_keys = ctx.table.row_num_keys + s.row_begin;
    args.table.max_num_keys = static_cast<int32_t>(num_keys);
    args.indices = ctx.topk + s.row_begin * c.index_topk;
    args.index_width = static_cast<int32_t>(c.index_topk);
    args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(nope + rope)));
    args.out = HeadsView{o.data + s.row_begin * o.ld, s.num_rows, nh, vd, o.ld, vd};
    b->Attention(args);
  }
}

// ---- DecoderLayer -----------------------------------------------------------------------------

absl::StatusOr<DecoderLayer> DecoderLayer::Load(WeightLoader& w, const ModelConfig& c,
                                                int layer_idx) {
  DecoderLayer d;
  d.layer_idx = layer_idx;
  const std::string p = absl::StrCat("model.layers.", layer_idx);
  GLM_ASSIGN_OR_RETURN(d.input_norm.weight, w.Vector(p + ".input_layernorm.weight", c.hidden_size));
  GLM_ASSIGN_OR_RETURN(d.post_norm.weight,
                       w.Vector(p + ".post_attention_layernorm.weight", c.hidden_size));
  d.input_norm.eps = d.post_norm.eps = static_cast<float>(c.rms_norm_eps);
  GLM_ASSIGN_OR_RETURN(d.attn, MlaAttention::Load(w, c, p + ".self_attn", c.HasIndexer(layer_idx)));
  if (c.IsMoeLayer(layer_idx)) {
    GLM_ASSIGN_OR_RETURN(Moe moe, Moe::Load(w, c, p + ".mlp"));
    d.moe = std::make_unique<Moe>(std::move(moe));
  } else {
    GLM_ASSIGN_OR_RETURN(DenseMlp mlp,
                         DenseMlp::Load(w, p + ".mlp", c.hidden_size, c.intermediate_size));
    d.mlp = std::make_unique<DenseMlp>(std::move(mlp));
  }
  return d;
}

void DecoderLayer::Forward(StepContext& ctx, const MatView& h, const LayerKv& kv) const {
  const int64_t T = h.rows, H = h.cols;
  MatView x = ctx.ws->Mat(T, H);  // [T, H] the MoE's / MLP's normed input
  // Each sublayer's last Linear (and MoeExperts) accumulates onto h: no separate Add launch.
  // The norms run inside the next Linear where the backend can (a_proj's, the router's).
  attn.Forward(ctx, h, input_norm, kv, h);
  if (moe != nullptr) {
    moe->ForwardNormed(ctx, h, post_norm, x, h);
  } else {
    post_norm.Forward(ctx, h, x);
    mlp->Forward(ctx, x, h);
  }
}

}  // namespace glm::engine
