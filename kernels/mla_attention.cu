// MLA attention launcher (mla_attention.h): input checks, the kernel choice by shape and the
// launch plan (head groups, key tiles, splits) from the device's SM count, opt-in shared memory
// (under KernelPolicy::smem_cap_bytes) and each kernel's occupancy. Device code in
// mla_attention.cuh.
// NOTE: shared memory per block is read from the device (GB10 ~99 KiB, H200 ~227 KiB opt-in):
// the absorbed GLM-5 split kernel (da 512 + db 64, G 16) needs ~41 KiB, the tensor-core kernel
// ~97 KiB with 16 heads per CTA and ~219 KiB with 64.
#include "kernels/mla_attention.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/kv_fp8_layout.h"
#include "kernels/launch.cuh"
#include "kernels/mla_attention.cuh"
#include "kernels/op_util.h"

namespace glm::kernels {
namespace {

using namespace mla_attention;  // NOLINT: the kernels and their constants

constexpr const char* kOp = "Attention";

int64_t SmemBytes(int g, int dq) {
  return int64_t{4} * (int64_t{g} * dq + int64_t{kTile} * g + kTile + 3 * g);
}

// Staged path: queries, `tile` staged key rows of row_bytes, scores, rows, m / l / corr.
int64_t StagedSmemBytes(int g, int dq, int tile, int64_t row_bytes) {
  return int64_t{4} * (int64_t{g} * dq + int64_t{tile} * g + tile + 3 * g) + tile * row_bytes;
}

// Resident CTAs per SM of the staged AttentionSplitKernel<16, CPT, kFp8> with `smem` dynamic
// bytes on the current device (cached per (device, smem); sizing only, never correctness).
template <int CPT, bool kFp8>
int CtasPerSm(int64_t smem) {
  return detail::CachedCtasPerSm(AttentionSplitKernel<16, CPT, kFp8, true>, kThreads, smem);
}

template <int G, int CPT, bool kFp8, bool kStage>
absl::Status Launch(const Params& p, int64_t num_ctas, int64_t smem,
                    const detail::DeviceInfo& info, cudaStream_t stream) {
  GLM_RETURN_IF_ERROR(
      detail::UseDynamicSmem(AttentionSplitKernel<G, CPT, kFp8, kStage>, smem, info, kOp));
  LaunchKernel(AttentionSplitKernel<G, CPT, kFp8, kStage>, static_cast<unsigned>(num_ctas),
               kThreads, smem, stream, p);
  return detail::CudaCheck(cudaGetLastError(), kOp, "AttentionSplitKernel launch");
}

template <int G, bool kFp8, bool kStage>
absl::Status LaunchCpt(const Params& p, int64_t num_ctas, int64_t smem,
                       const detail::DeviceInfo& info, cudaStream_t stream) {
  const int cpt = static_cast<int>(detail::CeilDiv(p.dv, kThreads));
  if (cpt <= 1) return Launch<G, 1, kFp8, kStage>(p, num_ctas, smem, info, stream);
  if (cpt <= 2) return Launch<G, 2, kFp8, kStage>(p, num_ctas, smem, info, stream);
  return Launch<G, 4, kFp8, kStage>(p, num_ctas, smem, info, stream);
}

// The staged kernel's occupancy for the instantiation Attention will launch.
template <bool kFp8>
int StagedCtasPerSm(int dv, int64_t smem, const detail::DeviceInfo& info) {
  if (smem > info.smem_optin) return 0;
  const int cpt = static_cast<int>(detail::CeilDiv(dv, kThreads));
  if (cpt <= 1) {
    if (!detail::UseDynamicSmem(AttentionSplitKernel<16, 1, kFp8, true>, smem, info, kOp).ok()) {
      return 0;
    }
    return CtasPerSm<1, kFp8>(smem);
  }
  if (cpt <= 2) {
    if (!detail::UseDynamicSmem(AttentionSplitKernel<16, 2, kFp8, true>, smem, info, kOp).ok()) {
      return 0;
    }
    return CtasPerSm<2, kFp8>(smem);
  }
  if (!detail::UseDynamicSmem(AttentionSplitKernel<16, 4, kFp8, true>, smem, info, kOp).ok()) {
    return 0;
  }
  return CtasPerSm<4, kFp8>(smem);
}

// Resident CTAs per SM of AttentionTcKernel<MT> on the current device; 0 when its shared memory
// does not fit (sizing only).
template <int MT>
int TcCtasPerSm(const detail::DeviceInfo& info) {
  using C = TcCfg<MT>;
  if (C::kSmem > info.smem_optin ||
      !detail::UseDynamicSmem(AttentionTcKernel<MT>, C::kSmem, info, kOp).ok()) {
    return 0;
  }
  return detail::CachedCtasPerSm(AttentionTcKernel<MT>, C::kThreads, C::kSmem);
}

// Splits for `base` CTAs of `tiles` key tiles each on `slots` resident CTA slots: the fewest
// splits among those with the fewest tile-rounds (waves x tiles per CTA).
int64_t TcSplits(int64_t base, int64_t tiles, int64_t slots) {
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= std::min<int64_t>(tiles, kMaxSplitsWide); ++s) {
    const int64_t per = detail::CeilDiv(tiles, s);
    if (detail::CeilDiv(tiles, per) != s) continue;  // same split_len as a smaller s
    const int64_t cost = detail::CeilDiv(base * s, slots) * per;
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

// The split partials of rows x heads x splits (acc [.., dv] in workspace slot 0, (m, l) in
// slot 1) into p; nothing when one split writes out directly.
absl::Status BindPartials(Params& p, int64_t rows, int64_t heads, int64_t splits,
                          MlaWorkspace workspace) {
  if (splits <= 1) return absl::OkStatus();
  const size_t parts = static_cast<size_t>(rows * heads * splits);
  GLM_ASSIGN_OR_RETURN(void* acc, workspace(0, parts * p.dv * sizeof(float)));
  GLM_ASSIGN_OR_RETURN(void* ml, workspace(1, parts * 2 * sizeof(float)));
  p.part_acc = static_cast<float*>(acc);
  p.part_ml = static_cast<float*>(ml);
  return absl::OkStatus();
}

// The tensor-core path (fp8 latent cache, 512 + 64 dims, heads a multiple of 16); returns false
// (nothing launched) when the shape or the device does not fit it.
// force_mt (1, 2, 4; AttentionPolicy::tc_heads_per_cta / 16): only that head group size (16 MT
// heads); 0: by shape.
absl::StatusOr<bool> LaunchTc(Params& p, int64_t rows, int64_t heads, int64_t n_max,
                              int force_mt, MlaWorkspace workspace, const detail::DeviceInfo& info,
                              cudaStream_t stream) {
  if (p.kv8 == nullptr || p.da != kTcKvr || p.db != kTcRope || p.dv != kTcKvr ||
      p.kv8_rs != kTcRawRow || heads % 16 != 0) {
    return false;
  }
  // Head group: the largest (most key-tile reuse) whose CTAs (at most one tile per split) fill
  // >= 90 % of the device's resident slots; else the one filling most (H200, 64 heads, 2048
  // selected: batch 1 runs 32 heads per CTA, batch 8 and 64 run 64).
  const int64_t tiles_max =
      std::min<int64_t>(detail::CeilDiv(std::max<int64_t>(n_max, 1), kTcTile), kMaxSplitsWide);
  int mt = 0, occ = 0;
  double best_fill = -1;
  for (const int cand : {4, 2, 1}) {
    if (heads % (16 * cand) != 0 || (force_mt != 0 && cand != force_mt)) continue;
    const int o =
        cand == 4 ? TcCtasPerSm<4>(info) : cand == 2 ? TcCtasPerSm<2>(info) : TcCtasPerSm<1>(info);
    if (o <= 0) continue;
    const double fill = std::min(
        1.0, static_cast<double>(rows * (heads / (16 * cand)) * tiles_max) /
                 (static_cast<double>(o) * info.num_sms));
    if (fill > best_fill + 1e-9) mt = cand, occ = o, best_fill = fill;
    if (fill >= 0.9) break;
  }
  if (mt == 0) return false;
  p.head_groups = static_cast<int32_t>(heads / (16 * mt));
  const int64_t base = rows * p.head_groups;
  const int64_t tiles = detail::CeilDiv(std::max<int64_t>(n_max, 1), kTcTile);
  const int64_t splits0 = TcSplits(base, tiles, int64_t{occ} * info.num_sms);
  const int64_t split_len = detail::CeilDiv(tiles, splits0) * kTcTile;
  const int64_t splits = std::max<int64_t>(1, detail::CeilDiv(n_max, split_len));
  p.num_splits = static_cast<int32_t>(splits), p.split_len = static_cast<int32_t>(split_len);
  const int64_t num_ctas = base * splits;
  if (num_ctas > 0x7fffffff || rows * heads > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda Attention: ", num_ctas, " CTAs exceed the grid limit"));
  }
  GLM_RETURN_IF_ERROR(BindPartials(p, rows, heads, splits, workspace));
  const unsigned grid = static_cast<unsigned>(num_ctas);
  if (mt == 4) {
    LaunchKernel(AttentionTcKernel<4>, grid, TcCfg<4>::kThreads, TcCfg<4>::kSmem, stream, p);
  } else if (mt == 2) {
    LaunchKernel(AttentionTcKernel<2>, grid, TcCfg<2>::kThreads, TcCfg<2>::kSmem, stream, p);
  } else {
    LaunchKernel(AttentionTcKernel<1>, grid, TcCfg<1>::kThreads, TcCfg<1>::kSmem, stream, p);
  }
  GLM_RETURN_IF_ERROR(detail::CudaCheck(cudaGetLastError(), kOp, "AttentionTcKernel launch"));
  if (splits > 1) {
    const dim3 cgrid(static_cast<unsigned>(rows * heads),
                     static_cast<unsigned>(detail::CeilDiv(p.dv, 128)));
    LaunchKernel(AttentionCombineWideKernel, cgrid, kCombineThreads, 0, stream, p);
    GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
  }
  return true;
}


bool VecOk(const MlaHeads& x) {
  return detail::Aligned16(x.data) && x.row_stride % 4 == 0 && x.head_stride % 4 == 0 &&
         x.dim % 4 == 0;
}

bool VecOk(const MlaHeadsOut& x) {
  return detail::Aligned16(x.data) && x.row_stride % 4 == 0 && x.head_stride % 4 == 0 &&
         x.dim % 4 == 0;
}

}  // namespace

absl::StatusOr<MlaAttentionPath> MlaAttention(const MlaAttentionArgs& a,
                                              const AttentionPolicy& policy,
                                              int64_t smem_cap_bytes, MlaWorkspace workspace,
                                              cudaStream_t stream) {
  const int64_t rows = a.q_a.rows, heads = a.q_a.heads;
  if (rows == 0 || heads == 0) return MlaAttentionPath::kSplit;
  if (a.k_a.dim != a.q_a.dim || a.k_b.dim != a.q_b.dim || a.out.dim != a.v.dim ||
      a.q_b.heads != heads || a.out.heads != heads || a.out.rows != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda Attention: mismatched shapes q_a dim ", a.q_a.dim, " k_a dim ", a.k_a.dim,
        ", q_b dim ", a.q_b.dim, " k_b dim ", a.k_b.dim, ", v dim ", a.v.dim, " out dim ",
        a.out.dim, ", heads q_a/q_b/out ", heads, "/", a.q_b.heads, "/", a.out.heads));
  }
  for (const MlaHeads* x : {&a.q_a, &a.q_b, &a.k_a, &a.k_b, &a.v}) {
    if (!VecOk(*x) && x->dim > 0) {
      return absl::InvalidArgumentError(
          "cuda Attention: every view needs 16-byte aligned data, row/head strides and dims that "
          "are multiples of 4 floats (float4 loads)");
    }
  }
  if (!VecOk(a.out) && a.out.dim > 0) {
    return absl::InvalidArgumentError(
        "cuda Attention: every view needs 16-byte aligned data, row/head strides and dims that "
        "are multiples of 4 floats (float4 loads)");
  }
  if (a.v.dim > 4 * kThreads) {
    return absl::InvalidArgumentError(absl::StrCat("cuda Attention: dv ", a.v.dim,
                                                   " > 1024 is not supported"));
  }
  GLM_ASSIGN_OR_RETURN(const detail::DeviceInfo info,
                       detail::CurrentDeviceInfo(kOp, smem_cap_bytes));

  Params p{};
  p.q_a = a.q_a.data, p.q_a_rs = a.q_a.row_stride, p.q_a_hs = a.q_a.head_stride;
  p.q_b = a.q_b.data, p.q_b_rs = a.q_b.row_stride, p.q_b_hs = a.q_b.head_stride;
  p.k_a = a.k_a.data, p.k_a_rs = a.k_a.row_stride, p.k_a_hs = a.k_a.head_stride;
  p.k_b = a.k_b.data, p.k_b_rs = a.k_b.row_stride, p.k_b_hs = a.k_b.head_stride;
  p.v = a.v.data, p.v_rs = a.v.row_stride, p.v_hs = a.v.head_stride;
  p.out = a.out.data, p.out_rs = a.out.row_stride, p.out_hs = a.out.head_stride;
  p.slots = a.slots, p.row_offset = a.row_offset;
  p.row_num_keys = a.row_num_keys;
  p.indices = a.indices;
  p.index_width = a.indices != nullptr ? static_cast<int32_t>(a.index_width) : 0;
  p.num_heads = static_cast<int32_t>(heads);
  p.da = static_cast<int32_t>(a.q_a.dim), p.db = static_cast<int32_t>(a.q_b.dim);
  p.dv = static_cast<int32_t>(a.v.dim);
  p.scale = a.scale;
  const bool fp8 = a.latent_fp8 != nullptr;
  if (fp8) {
    if (a.kv_lora_rank != p.da || a.kv_lora_rank != p.dv || a.rope_dim != p.db ||
        a.kv_lora_rank % 4 != 0 || a.rope_dim % 4 != 0 || !detail::Aligned16(a.latent_fp8)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda Attention: an fp8 latent cache (kv_lora_rank ", a.kv_lora_rank, ", rope ",
          a.rope_dim, ") needs da == dv == kv_lora_rank (", p.da, ", ", p.dv,
          ") and db == rope (", p.db, "), both multiples of 4, and 16-byte aligned data"));
    }
    p.kv8 = a.latent_fp8;
    p.kv8_rs = kv_fp8::LatentRowBytes(a.kv_lora_rank, a.rope_dim);
    p.kv8_scale_off = static_cast<int32_t>(kv_fp8::LatentScaleOffset(a.kv_lora_rank));
    p.kv8_rope_off = static_cast<int32_t>(kv_fp8::LatentRopeOffset(a.kv_lora_rank));
  }

  const int64_t n_max = a.indices != nullptr ? a.index_width : a.max_num_keys;
  const MlaAttentionPath path = policy.path;
  // Tensor-core path (fp8 latent, GLM-5 widths) wherever it applies, unless another kernel is
  // forced.
  if (fp8 && (path == MlaAttentionPath::kByShape || path == MlaAttentionPath::kTensorCore)) {
    const int force_mt = policy.tc_heads_per_cta == 16   ? 1
                         : policy.tc_heads_per_cta == 32 ? 2
                         : policy.tc_heads_per_cta == 64 ? 4
                                                         : 0;
    GLM_ASSIGN_OR_RETURN(const bool done,
                         LaunchTc(p, rows, heads, n_max, force_mt, workspace, info, stream));
    if (done) return MlaAttentionPath::kTensorCore;
  }

  const int dq = p.da + p.db;
  const bool broadcast =
      fp8 || (a.k_a.head_stride == 0 && a.k_b.head_stride == 0 && a.v.head_stride == 0);
  const int g = broadcast && heads >= 16 && SmemBytes(16, dq) <= info.smem_optin ? 16 : 1;
  p.head_groups = static_cast<int32_t>(detail::CeilDiv(heads, g));

  const int64_t base_ctas = rows * p.head_groups;

  // Staged path (G = 16): tile of 32 keys (16 when 32 do not fit the device's shared memory).
  const int64_t kv_row_bytes = fp8 ? p.kv8_rs : int64_t{4} * dq;
  int tile = 0;
  int64_t staged_smem = 0;
  int ctas_per_sm = 0;
  if (g == 16 && path != MlaAttentionPath::kSplit && kv_row_bytes % 16 == 0) {
    for (const int cand : {32, 16}) {
      const int64_t bytes = StagedSmemBytes(16, dq, cand, kv_row_bytes);
      const int occ = bytes <= info.smem_optin
                          ? (fp8 ? StagedCtasPerSm<true>(p.dv, bytes, info)
                                 : StagedCtasPerSm<false>(p.dv, bytes, info))
                          : 0;
      if (occ > 0) {
        tile = cand, staged_smem = bytes, ctas_per_sm = occ;
        break;
      }
    }
  }
  if (tile > 0) {
    p.tile = tile;
    p.v_staged = fp8 || (a.v.data == a.k_a.data && a.v.row_stride == a.k_a.row_stride &&
                         a.v.head_stride == a.k_a.head_stride && p.dv <= p.da);
    const int64_t want = int64_t{ctas_per_sm} * info.num_sms;
    int64_t splits = 1;
    if (base_ctas < want && n_max > tile) {
      splits = std::min<int64_t>({detail::CeilDiv(want, base_ctas), detail::CeilDiv(n_max, tile),
                                  kMaxSplitsWide});
    }
    const int64_t split_len = detail::CeilDiv(
        detail::CeilDiv(std::max<int64_t>(n_max, 1), splits), tile) * tile;
    splits = std::max<int64_t>(1, detail::CeilDiv(n_max, split_len));
    // NOTE: fp32 rows take the staged kernel only up to 2 tiles per CTA: its tile copy is not
    // overlapped with the previous tile's math, so at 8 tiles per CTA (batch 8) the split kernel
    // is faster (H200, 2048 selected: 185 vs 204 us); fp8 rows (4.5x fewer bytes) always gain.
    if (path == MlaAttentionPath::kStaged || fp8 || split_len <= 2 * tile) {
      p.num_splits = static_cast<int32_t>(splits), p.split_len = static_cast<int32_t>(split_len);
      GLM_RETURN_IF_ERROR(BindPartials(p, rows, heads, splits, workspace));
      const int64_t num_ctas = base_ctas * splits;
      if (num_ctas > 0x7fffffff || rows * heads > 0x7fffffff) {
        return absl::InvalidArgumentError(
            absl::StrCat("cuda Attention: ", num_ctas, " CTAs exceed the grid limit"));
      }
      if (fp8) {
        GLM_RETURN_IF_ERROR((LaunchCpt<16, true, true>(p, num_ctas, staged_smem, info, stream)));
      } else {
        GLM_RETURN_IF_ERROR((LaunchCpt<16, false, true>(p, num_ctas, staged_smem, info, stream)));
      }
      if (splits > 1) {
        const dim3 grid(static_cast<unsigned>(rows * heads),
                        static_cast<unsigned>(detail::CeilDiv(p.dv, 128)));
        LaunchKernel(AttentionCombineWideKernel, grid, kCombineThreads, 0, stream, p);
        GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
      }
      return MlaAttentionPath::kStaged;
    }
  }

  // Split path: tiles of kTile keys read from global memory.
  int64_t splits = 1;
  if (base_ctas < 2 * info.num_sms && n_max > kTile) {
    splits = std::min<int64_t>({detail::CeilDiv(2 * info.num_sms, base_ctas),
                                detail::CeilDiv(n_max, kTile), kMaxSplits});
  }
  const int64_t split_len = std::max<int64_t>(
      kTile, detail::CeilDiv(detail::CeilDiv(std::max<int64_t>(n_max, 1), splits), kTile) * kTile);
  splits = std::max<int64_t>(1, detail::CeilDiv(n_max, split_len));
  p.num_splits = static_cast<int32_t>(splits), p.split_len = static_cast<int32_t>(split_len);
  GLM_RETURN_IF_ERROR(BindPartials(p, rows, heads, splits, workspace));
  const int64_t num_ctas = base_ctas * splits;
  if (num_ctas > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("cuda Attention: ", num_ctas,
                                                   " CTAs exceed the grid limit"));
  }
  const int64_t smem = SmemBytes(g, dq);
  if (fp8) {
    if (g == 16) {
      GLM_RETURN_IF_ERROR((LaunchCpt<16, true, false>(p, num_ctas, smem, info, stream)));
    } else {
      GLM_RETURN_IF_ERROR((LaunchCpt<1, true, false>(p, num_ctas, smem, info, stream)));
    }
  } else if (g == 16) {
    GLM_RETURN_IF_ERROR((LaunchCpt<16, false, false>(p, num_ctas, smem, info, stream)));
  } else {
    GLM_RETURN_IF_ERROR((LaunchCpt<1, false, false>(p, num_ctas, smem, info, stream)));
  }
  if (splits > 1) {
    LaunchKernel(AttentionCombineKernel, static_cast<unsigned>(rows * heads), kThreads, 0, stream,
                 p);
    GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
  }
  return MlaAttentionPath::kSplit;
}

}  // namespace glm::kernels
