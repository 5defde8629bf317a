// Launchers of the DSA indexer (dsa_indexer.h): input checks, the score kernel and select path by
// shape, chunk sizing and workspace.
//
// NOTE: the choices by shape, each from an H200 A/B in one process (cuda_indexer_bench unless
// named; the decode figures are glm-bench-cuda-decode ms/layer):
// - Score chunks aim at 2 CTAs per SM over all rows (a batch-1 decode spreads its row over the
//   whole GPU); 1 / 4 / 8 measured no better at 4K..128K keys.
// - Tensor-core scores for fp8 keys at dim 128: IndexerTopK fp8 8 x 4K 27.7 -> 17.4 us, 64 x 128K
//   3826 -> 896 us against the fp32 kernel (measured in commit df0df80). {2,2,2} keeps the next
//   step's key words in flight at 2 CTAs per SM (8 x 128K 174 -> 148 us, commit 1e3ef2c); calls of
//   >= 8 rows or rows of > 16K keys take {4,8,0} on chunks for its resident CTAs per SM (at most
//   4): 8 x 128K 148.8 -> 119.2 us, decode 8 x 128K 0.950 -> 0.914, while 1 x 4K stays faster on
//   {2,2,2} (14.9 vs 15.4 us) (measured in commit ba5ebe0).
// - Select: the short-row kernel while a thread owns at most kItems keys (16K keys; 1 x 4K select
//   12.8 -> 6.3 us against the single-CTA passes, commit 097caa1; at 50K keys its per-key
//   histogram aggregation makes it 58 us against the multi-CTA passes' 36); the multi-CTA passes
//   for fewer rows than SMs with longer rows (1 x 128K IndexerTopK 159 -> 96 us, commit f8c9425;
//   with the output over the whole GPU the select alone 48.3 -> 16.4 us, commit 468013b, decode
//   1 x 128K 0.285 -> 0.253, commit 1e3ef2c); the single-CTA passes when the rows alone fill the
//   GPU.
#include "kernels/dsa_indexer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "kernels/dsa_indexer_score.cuh"
#include "kernels/dsa_indexer_select.cuh"
#include "kernels/kv_fp8_layout.h"
#include "kernels/launch.cuh"
#include "kernels/op_util.h"

namespace glm::kernels {
namespace dsa_indexer {
namespace {

using Select = IndexerPolicy::Select;
using Score = IndexerPolicy::Score;

constexpr const char* kOp = "DsaIndexerTopK";
constexpr const char* kSelectOp = "DsaIndexerSelect";
constexpr int kScoreCtasPerSm = 2;    // CTAs per SM the score chunks aim at (the NOTE above)
constexpr int kWideRows = 8;          // {4,8,0} where a call has at least this many rows ...
constexpr int kWideKeys = 16 * 1024;  // ... or rows of more than this many keys
constexpr int kWideMaxCtasPerSm = 4;  // its registers allow no more

// The select path for rows of at most max_keys keys (the NOTE above; `forced` from the policy).
Select ChooseSelect(int64_t rows, int64_t max_keys, const detail::DeviceInfo& info,
                    Select forced) {
  const Select long_rows = rows < info.num_sms && max_keys > int64_t{kSelectThreads} * kItems
                               ? Select::kMultiCta
                               : Select::kSingleCta;
  // The row must fit the device's opt-in shared memory (H200: ~56K keys; GB10's 99 KiB: ~24K).
  const bool short_fits = max_keys <= kShortMaxKeys &&
                          ShortSmemBytes(max_keys) + kShortStaticSmem <= info.smem_optin;
  switch (forced) {
    case Select::kSingleCta:
    case Select::kMultiCta:
      return forced;
    case Select::kShortRow:
      if (short_fits) return Select::kShortRow;
      break;
    case Select::kByShape:
      break;
  }
  return short_fits && detail::CeilDiv(max_keys, kSelectThreads) <= kItems ? Select::kShortRow
                                                                           : long_rows;
}

// Whether a tensor-core score kernel takes this call: fp8 keys, index_head_dim == kTcDim, a
// block_size that keeps every key row 16-byte aligned (a multiple of 4: 132-byte tokens), an
// sm_80+ device (mma.sync bf16), its query fragments within the opt-in shared memory, and a
// policy that does not force the fp32 kernel.
bool UseTcScore(bool fp8, int dim, int block_size, int heads_pad, const detail::DeviceInfo& info,
                Score score) {
  if (!fp8 || dim != kTcDim || block_size % 4 != 0 || score == Score::kFp32) return false;
  if (TcSmemBytes(heads_pad) + 4 * 256 > info.smem_optin) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 8;
}

template <int kMinBlocks, int kKGroup, int kAhead>
absl::Status LaunchTcScoreAs(const ScoreParams& p, int64_t ctas, int64_t smem,
                             const detail::DeviceInfo& info, cudaStream_t stream) {
  static_assert(kTcKsteps % kKGroup == 0, "k-step groups must tile the k-steps");
  const auto kernel = IndexerScoreTcKernel<kMinBlocks, kKGroup, kAhead>;
  GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(kernel, smem, info, kOp));
  LaunchKernel(kernel, static_cast<unsigned>(ctas), kTcThreads, smem, stream, p);
  GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
  return absl::OkStatus();
}

// CTAs per SM of the {4,8,0} kernel that stay resident at `smem` bytes of dynamic shared memory
// (occupancy query: registers, shared memory per SM; a GB10 keeps 3 of its 25.7 KiB CTAs), in
// [1, kWideMaxCtasPerSm].
absl::StatusOr<int> WideResidentCtas(int64_t smem, const detail::DeviceInfo& info) {
  const auto kernel = IndexerScoreTcKernel<4, 8, 0>;
  GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(kernel, smem, info, kOp));
  // Cached per (kernel, device, smem): eager steps make no occupancy query per call.
  return std::clamp(detail::CachedCtasPerSm(kernel, kTcThreads, smem), 1, kWideMaxCtasPerSm);
}

// Radix passes with a histogram in the workspace: 4 for the multi-CTA passes, else pass 0 only.
int HistPasses(Select path) { return path == Select::kMultiCta ? kHistPasses : 1; }

int64_t OutputChunks(int64_t max_keys) { return detail::CeilDiv(max_keys, kOutChunk); }

// Zeroed workspace of a selection (slot 1): the histograms [rows, HistPasses(path), 256] u32,
// then (multi-CTA passes) IndexerOutputKernel's look-back words [rows, OutputChunks] u64.
size_t SelectScratchBytes(Select path, int64_t rows, int64_t max_keys) {
  size_t bytes = static_cast<size_t>(rows) * HistPasses(path) * 256 * 4;
  if (path == Select::kMultiCta) bytes += static_cast<size_t>(rows) * OutputChunks(max_keys) * 8;
  return bytes;
}

// IndexerHistKernel chunks: ~2 CTAs per SM over all rows, a multiple of kHistChunkAlign keys each.
void HistChunks(int64_t rows, int64_t max_keys, const detail::DeviceInfo& info, int64_t* len,
                int64_t* chunks) {
  const int64_t per_row = std::max<int64_t>(1, detail::CeilDiv(int64_t{2} * info.num_sms, rows));
  *len = detail::CeilDiv(detail::CeilDiv(max_keys, per_row), kHistChunkAlign) * kHistChunkAlign;
  *chunks = detail::CeilDiv(max_keys, *len);
}

// The selection over scores [rows, ld] (ld a multiple of 4, rows 16-byte aligned, every row's
// num_keys <= ld). hist: SelectScratchBytes(path, ...) zeroed but for pass 0's histogram, complete
// (kSingleCta / kMultiCta; unused by kShortRow).
absl::Status LaunchSelect(Select path, const float* scores, int64_t ld, uint32_t* hist,
                          int64_t rows, const int32_t* row_num_keys, int64_t max_keys, int top_k,
                          int32_t* out, const detail::DeviceInfo& info, cudaStream_t stream) {
  if (path == Select::kShortRow) {
    const int64_t smem = ShortSmemBytes(max_keys);
    GLM_RETURN_IF_ERROR(detail::UseDynamicSmem(IndexerSelectShortKernel, smem, info, kOp));
    LaunchKernel(IndexerSelectShortKernel, static_cast<unsigned>(rows), kSelectThreads, smem,
                 stream, scores, ld, row_num_keys, top_k, out);
    GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
    return absl::OkStatus();
  }
  if (path == Select::kMultiCta) {
    const int64_t chunks = OutputChunks(max_keys);
    if (rows * chunks > 0x7fffffff) {
      return absl::InvalidArgumentError(absl::StrCat("cuda ", kOp, ": ", rows * chunks,
                                                     " output CTAs exceed the grid limit"));
    }
    int64_t hchunk_len = 0, hchunks = 0;
    HistChunks(rows, max_keys, info, &hchunk_len, &hchunks);
    for (int pass = 1; pass < kHistPasses; ++pass) {
      LaunchKernel(IndexerHistKernel, static_cast<unsigned>(rows * hchunks), kHistThreads, 0,
                   stream, scores, ld, hist, row_num_keys, top_k, pass, kHistPasses,
                   static_cast<int>(hchunks), static_cast<int>(hchunk_len));
      GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
    }
    auto* lookback = reinterpret_cast<unsigned long long*>(hist + rows * kHistPasses * 256);
    LaunchKernel(IndexerOutputKernel, static_cast<unsigned>(rows * chunks), kOutThreads, 0,
                 stream, scores, ld, hist, row_num_keys, top_k, static_cast<int>(chunks),
                 lookback, out);
    GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
    return absl::OkStatus();
  }
  LaunchKernel(IndexerSelectKernel, static_cast<unsigned>(rows), kSelectThreads, 0, stream, scores,
               ld, hist, row_num_keys, top_k, out);
  GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
  return absl::OkStatus();
}

// Every row has num_keys <= top_k: 0..num_keys-1 then -1, nothing scored.
absl::Status LaunchAllKeys(int64_t rows, const int32_t* row_num_keys, int top_k, int32_t* out,
                           cudaStream_t stream) {
  LaunchKernel(IndexerSelectKernel, static_cast<unsigned>(rows), kSelectThreads, 0, stream,
               nullptr, 0, nullptr, row_num_keys, top_k, out);
  GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
  return absl::OkStatus();
}

absl::Status SelectOnly(const float* scores, int64_t ld, int64_t rows,
                        const int32_t* row_num_keys, int32_t max_num_keys, int top_k,
                        int32_t* out, const IndexerPolicy& policy, int64_t smem_cap_bytes,
                        DsaIndexerWorkspace workspace, cudaStream_t stream,
                        DsaIndexerLaunch* launched) {
  if (launched != nullptr) *launched = DsaIndexerLaunch{};
  if (rows == 0 || top_k <= 0) return absl::OkStatus();
  if (rows < 0 || rows > 0x7fffffff || ld % 4 != 0 || ld < max_num_keys ||
      !detail::Aligned16(scores)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kSelectOp, ": scores [", rows, ", ", ld, "] need ld a multiple of 4 and >= ",
        "max_num_keys (", max_num_keys, "), 16-byte aligned data, 0 <= rows < 2^31"));
  }
  GLM_ASSIGN_OR_RETURN(const detail::DeviceInfo info,
                       detail::CurrentDeviceInfo(kSelectOp, smem_cap_bytes));
  if (max_num_keys <= top_k) return LaunchAllKeys(rows, row_num_keys, top_k, out, stream);
  const Select path = ChooseSelect(rows, max_num_keys, info, policy.select);
  if (launched != nullptr) {
    launched->select = path;
    launched->scores_ld = ld;
  }
  uint32_t* hist = nullptr;
  if (path != Select::kShortRow) {
    const size_t bytes = SelectScratchBytes(path, rows, max_num_keys);
    GLM_ASSIGN_OR_RETURN(void* h, workspace(1, bytes));
    hist = static_cast<uint32_t*>(h);
    GLM_OP_RETURN_IF_ERROR(kSelectOp, cudaMemsetAsync(hist, 0, bytes, stream));
    int64_t len = 0, chunks = 0;
    HistChunks(rows, max_num_keys, info, &len, &chunks);
    LaunchKernel(IndexerHistKernel, static_cast<unsigned>(rows * chunks), kHistThreads, 0, stream,
                 scores, ld, hist, row_num_keys, top_k, 0, HistPasses(path),
                 static_cast<int>(chunks), static_cast<int>(len));
    GLM_OP_RETURN_IF_ERROR(kSelectOp, cudaGetLastError());
  }
  return LaunchSelect(path, scores, ld, hist, rows, row_num_keys, max_num_keys, top_k, out, info,
                      stream);
}

absl::Status TopK(const DsaIndexerArgs& a, const IndexerPolicy& policy, int64_t smem_cap_bytes,
                  DsaIndexerWorkspace workspace, cudaStream_t stream, DsaIndexerLaunch* launched) {
  if (launched != nullptr) *launched = DsaIndexerLaunch{};
  const int64_t rows = a.rows;
  if (rows == 0 || a.top_k <= 0) return absl::OkStatus();
  if (rows < 0 || rows > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", kOp, ": rows (", rows, ") must be in [0, 2^31 - 1]"));
  }
  const int64_t max_keys = a.max_num_keys;
  const bool fp8 = a.keys_fp8 != nullptr;
  if (fp8 &&
      (a.block_size <= 0 || !kv_fp8::IndexShapeOk(a.dim) || !detail::Aligned16(a.keys_fp8))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": the fp8 key cache (dim ", a.dim, ", block_size ", a.block_size,
        ") needs block_size > 0, dim a positive multiple of 4, and 16-byte aligned data"));
  }
  if (max_keys <= a.top_k) return LaunchAllKeys(rows, a.row_num_keys, a.top_k, a.out, stream);

  if (a.dim % 4 != 0 || a.dim <= 0 ||
      (!fp8 && (a.keys_ld % 4 != 0 || !detail::Aligned16(a.keys)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", kOp, ": index_head_dim (", a.dim, ") and the key row stride (", a.keys_ld,
        ") must be positive multiples of 4 with 16-byte aligned keys (float4 loads)"));
  }
  GLM_ASSIGN_OR_RETURN(const detail::DeviceInfo info,
                       detail::CurrentDeviceInfo(kOp, smem_cap_bytes));
  ScoreParams p{};
  p.q = a.q, p.q_rs = a.q_row_stride, p.q_hs = a.q_head_stride;
  p.q_vec = detail::Aligned16(a.q) && a.q_row_stride % 4 == 0 && a.q_head_stride % 4 == 0;
  p.w = a.weights, p.w_ld = a.weights_ld;
  p.keys = a.keys, p.keys_ld = a.keys_ld;
  p.slots = a.slots, p.row_offset = a.row_offset;
  p.row_num_keys = a.row_num_keys;
  p.heads = static_cast<int32_t>(a.heads), p.dim = static_cast<int32_t>(a.dim);
  p.dim_pad = static_cast<int32_t>(detail::CeilDiv(a.dim, 32) * 32);
  p.heads_pad = static_cast<int32_t>(detail::CeilDiv(a.heads, 32) * 32);
  p.top_k = a.top_k;
  // Chunks sized so that rows * chunks covers ~kScoreCtasPerSm CTAs per SM (a batch-1 decode
  // spreads its row over the whole GPU), kTileKeys..kMaxChunk keys each.
  auto chunks_for = [&](int ctas_per_sm) {
    return std::max<int64_t>(1, detail::CeilDiv(int64_t{ctas_per_sm} * info.num_sms, rows));
  };
  const int64_t want_chunks = chunks_for(kScoreCtasPerSm);
  const int64_t chunk_len = std::clamp<int64_t>(
      detail::CeilDiv(detail::CeilDiv(max_keys, want_chunks), kTileKeys) * kTileKeys, kTileKeys,
      kMaxChunk);
  p.chunk_len = static_cast<int32_t>(chunk_len);
  p.chunks = static_cast<int32_t>(detail::CeilDiv(max_keys, chunk_len));
  p.keys8 = fp8 ? a.keys_fp8 : nullptr;
  p.block_size = fp8 ? a.block_size : 1;
  p.weight_scale = a.weight_scale, p.score_scale = a.score_scale;
  p.ld = detail::CeilDiv(max_keys, 4) * 4;
  GLM_ASSIGN_OR_RETURN(void* scores,
                       workspace(0, static_cast<size_t>(rows * p.ld) * sizeof(float)));
  p.scores = static_cast<float*>(scores);
  // The short-row select builds its own pass-0 histogram (no memset, no histogram here).
  const Select path = ChooseSelect(rows, max_keys, info, policy.select);
  p.hist = nullptr;
  p.hist_stride = 256 * HistPasses(path);
  if (path != Select::kShortRow) {
    const size_t hist_bytes = SelectScratchBytes(path, rows, max_keys);
    GLM_ASSIGN_OR_RETURN(void* hist, workspace(1, hist_bytes));
    p.hist = static_cast<uint32_t*>(hist);
    GLM_OP_RETURN_IF_ERROR(kOp, cudaMemsetAsync(hist, 0, hist_bytes, stream));
  }
  if (launched != nullptr) {
    launched->select = path;
    launched->scores_ld = p.ld;
  }
  if (UseTcScore(fp8, p.dim, p.block_size, p.heads_pad, info, policy.score)) {
    // Chunks of kTcTileKeys..kTcMaxChunk keys for the kernel's CTA target: {4,8,0} on chunks for
    // its resident CTAs per SM, {2,2,2} on kScoreCtasPerSm.
    const bool wide =
        policy.score == Score::kTensorCoreWide ||
        (policy.score == Score::kByShape && (rows >= kWideRows || max_keys > kWideKeys));
    const int64_t tc_smem = TcSmemBytes(p.heads_pad);
    int64_t tc_want = want_chunks;
    if (wide) {
      GLM_ASSIGN_OR_RETURN(const int resident, WideResidentCtas(tc_smem, info));
      tc_want = chunks_for(resident);
    }
    const int64_t tc_len = std::clamp<int64_t>(
        detail::CeilDiv(detail::CeilDiv(max_keys, tc_want), kTcTileKeys) * kTcTileKeys,
        kTcTileKeys, kTcMaxChunk);
    ScoreParams tp = p;
    tp.chunk_len = static_cast<int32_t>(tc_len);
    tp.chunks = static_cast<int32_t>(detail::CeilDiv(max_keys, tc_len));
    const int64_t tc_ctas = rows * tp.chunks;
    if (tc_ctas > 0x7fffffff) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda ", kOp, ": ", tc_ctas, " score CTAs exceed the grid limit"));
    }
    // {2,2,2}: its second key buffer needs the registers of 2 CTAs per SM (ptxas -v, sm_90a:
    // {3,2,2} would spill 408 bytes).
    if (wide) {
      GLM_RETURN_IF_ERROR((LaunchTcScoreAs<4, 8, 0>(tp, tc_ctas, tc_smem, info, stream)));
    } else {
      GLM_RETURN_IF_ERROR((LaunchTcScoreAs<2, 2, 2>(tp, tc_ctas, tc_smem, info, stream)));
    }
    if (launched != nullptr) launched->score = wide ? Score::kTensorCoreWide : Score::kTensorCore;
    return LaunchSelect(path, p.scores, p.ld, p.hist, rows, a.row_num_keys, max_keys, a.top_k,
                        a.out, info, stream);
  }
  const int64_t smem = ScoreSmemBytes(p.heads_pad, p.dim_pad);
  GLM_RETURN_IF_ERROR(fp8 ? detail::UseDynamicSmem(IndexerScoreKernel<true>, smem, info, kOp)
                          : detail::UseDynamicSmem(IndexerScoreKernel<false>, smem, info, kOp));
  const int64_t ctas = rows * p.chunks;
  if (ctas > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", kOp, ": ", ctas, " score CTAs exceed the grid limit"));
  }
  if (fp8) {
    LaunchKernel(IndexerScoreKernel<true>, static_cast<unsigned>(ctas), kScoreThreads, smem,
                 stream, p);
  } else {
    LaunchKernel(IndexerScoreKernel<false>, static_cast<unsigned>(ctas), kScoreThreads, smem,
                 stream, p);
  }
  GLM_OP_RETURN_IF_ERROR(kOp, cudaGetLastError());
  if (launched != nullptr) launched->score = Score::kFp32;
  return LaunchSelect(path, p.scores, p.ld, p.hist, rows, a.row_num_keys, max_keys, a.top_k,
                      a.out, info, stream);
}

}  // namespace
}  // namespace dsa_indexer

absl::Status DsaIndexerTopK(const DsaIndexerArgs& args, const IndexerPolicy& policy,
                            int64_t smem_cap_bytes, DsaIndexerWorkspace workspace,
                            cudaStream_t stream, DsaIndexerLaunch* launched) {
  return dsa_indexer::TopK(args, policy, smem_cap_bytes, workspace, stream, launched);
}

absl::Status DsaIndexerSelect(const float* scores, int64_t ld, int64_t rows,
                              const int32_t* row_num_keys, int32_t max_num_keys, int top_k,
                              int32_t* out, const IndexerPolicy& policy, int64_t smem_cap_bytes,
                              DsaIndexerWorkspace workspace, cudaStream_t stream,
                              DsaIndexerLaunch* launched) {
  return dsa_indexer::SelectOnly(scores, ld, rows, row_num_keys, max_num_keys, top_k, out, policy,
                                 smem_cap_bytes, workspace, stream, launched);
}

}  // namespace glm::kernels
