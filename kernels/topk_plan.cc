#include "kernels/topk_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace glm::kernels {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// Blocks per SM allowed by threads and the kernel cap, before shared memory.
int MaxBlocksByThreads(const DeviceLimits& l) {
  int b = l.max_threads_per_sm / kTopkThreads;
  if (l.max_blocks_per_sm_cap > 0) b = std::min(b, l.max_blocks_per_sm_cap);
  return b;
}

// Blocks per SM that fit `smem` bytes each.
int BlocksBySmem(const DeviceLimits& l, int64_t smem) {
  return static_cast<int>(l.smem_per_sm / (smem + l.reserved_smem_per_block));
}

// Largest multiple-of-4 chunk whose cached smem fits `budget` (0 if none).
int64_t MaxCachedChunk(int64_t budget, bool with_cand) {
  int64_t lo = 0, hi = std::max<int64_t>(0, (budget - kTopkFixedSmemBytes) / 4 / 4);
  while (lo < hi) {  // largest m with TopkSmemBytes(4m) <= budget
    const int64_t mid = (lo + hi + 1) / 2;
    if (TopkSmemBytes(4 * mid, true, with_cand) <= budget) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return 4 * lo;
}

}  // namespace

int64_t TopkCandidates(int64_t chunk, bool with_cand) {
  if (!with_cand) return 0;
  if (chunk == 0) return kTopkStreamCandidates;  // streaming
  return std::max<int64_t>(32, std::min<int64_t>(kTopkMaxCandidates, chunk / 8 / 32 * 32));
}

int64_t TopkSmemBytes(int64_t chunk, bool cache, bool with_cand) {
  return kTopkFixedSmemBytes + 8 * TopkCandidates(cache ? chunk : 0, with_cand) +
         (cache ? 4 * chunk : 0);
}

std::string TopkPlan::DebugString() const {
  return absl::StrCat("rows=", rows, " max_len=", max_len, " k=", k,
                      " ctas_per_group=", ctas_per_group, " num_groups=", num_groups,
                      " chunk=", chunk, " candidates=", candidates, " mode=", cache_in_smem ? "smem" : "stream",
                      " cooperative=", cooperative, " smem_bytes=", smem_bytes,
                      " blocks_per_sm=", blocks_per_sm, " total_ctas=", total_ctas,
                      " workspace_bytes=", workspace_bytes);
}

absl::StatusOr<TopkPlan> PlanTopk(const DeviceLimits& l, int64_t rows, int64_t max_len, int k,
                                  TopkPath path) {
  if (rows <= 0 || max_len <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanTopk: rows, max_len and k must be positive (got rows=", rows, " max_len=", max_len,
        " k=", k, ")"));
  }
  if (max_len > (int64_t{1} << 31) - 1 || k > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("PlanTopk: max_len=", max_len, " k=", k,
                                                   " exceed the int32 index range"));
  }
  const int max_blocks = MaxBlocksByThreads(l);
  if (l.num_sms <= 0 || max_blocks <= 0 ||
      l.smem_optin_per_block < kTopkFixedSmemBytes + 4 * 4 ||
      BlocksBySmem(l, kTopkFixedSmemBytes + 16) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanTopk: device limits leave no room for one ", kTopkThreads, "-thread CTA with ",
        kTopkFixedSmemBytes, " B of shared memory (", l.DebugString(), ")"));
  }

  TopkPlan p;
  p.rows = rows;
  p.max_len = max_len;
  p.k = k;
  const int64_t cpg_parallel = std::max<int64_t>(1, CeilDiv(max_len, kTopkMinChunk));

  // Rows that are all output (len <= k): one CTA per row writes the identity, nothing cached.
  if (max_len <= k) {
    p.chunk = RoundUp(max_len, 4);
    p.smem_bytes = kTopkFixedSmemBytes + 16;
    p.blocks_per_sm = std::max(1, std::min(max_blocks, BlocksBySmem(l, p.smem_bytes)));
    p.num_groups = rows;
    p.total_ctas = rows;
    return p;
  }
  // Short rows: one CTA per row, no barrier, so no residency limit on the grid.
  if (cpg_parallel == 1) {
    const int64_t chunk = RoundUp(max_len, 4);
    for (bool with_cand : {true, false}) {
      const int64_t smem = TopkSmemBytes(chunk, true, with_cand);
      if (smem > l.smem_optin_per_block) continue;
      p.chunk = chunk;
      p.candidates = static_cast<int>(TopkCandidates(chunk, with_cand));
      p.smem_bytes = static_cast<int>(smem);
      p.blocks_per_sm = std::max(1, std::min(max_blocks, BlocksBySmem(l, p.smem_bytes)));
      p.num_groups = rows;
      p.total_ctas = rows;
      return p;
    }
  }

  // Cached: every residency level that fits, with a candidate buffer if possible (fewer passes
  // over the chunk), else without; keep the plan with the least work per CTA over the rounds
  // the groups need (rounds = rows per group), ties to the higher residency.
  for (bool with_cand : {true, false}) {
    if (path == TopkPath::kStreaming) break;
    int64_t best_cost = -1;
    for (int o = max_blocks; o >= 1; --o) {
      int64_t budget = std::min<int64_t>(l.smem_optin_per_block,
                                         l.smem_per_sm / o - l.reserved_smem_per_block);
      budget = budget / 16 * 16;
      const int64_t max_chunk = MaxCachedChunk(budget, with_cand);
      if (max_chunk < 1024) continue;
      const int64_t hw = int64_t{l.num_sms} * o;
      const int64_t cpg_min = CeilDiv(max_len, max_chunk);
      if (cpg_min > hw) continue;
      // As many CTAs per row as the row has work for, sharing the machine among the rows, but
      // at least enough that the row fits the caches.
      int64_t cpg = std::max(cpg_min, std::min(cpg_parallel, std::max<int64_t>(1, hw / rows)));
      cpg = std::min(cpg, hw);
      const int64_t chunk = RoundUp(CeilDiv(max_len, cpg), 4);
      cpg = CeilDiv(max_len, chunk);  // drop CTAs the rounding left empty
      const int64_t groups = std::max<int64_t>(1, std::min(rows, hw / cpg));
      const int64_t cost = CeilDiv(rows, groups) * chunk;
      if (best_cost >= 0 && cost >= best_cost) continue;
      best_cost = cost;
      p.ctas_per_group = static_cast<int>(cpg);
      p.chunk = chunk;
      p.cache_in_smem = true;
      p.candidates = static_cast<int>(TopkCandidates(chunk, with_cand));
      p.smem_bytes = static_cast<int>(TopkSmemBytes(chunk, true, with_cand));
      p.blocks_per_sm = o;
      p.num_groups = groups;
    }
    if (best_cost >= 0) break;
  }
  // Streaming: no key cache, so every row's group can be resident at once; it reads HBM at least
  // twice (pass 0, then the candidate compaction). Taken when no cached plan fits, when asked,
  // or (kAuto) when the cached plan needs kTopkStreamRounds or more rounds of rows per group.
  const int64_t cached_rounds = p.chunk > 0 ? CeilDiv(rows, p.num_groups) : 0;
  const bool stream = p.chunk == 0 || path == TopkPath::kStreaming ||
                      (path == TopkPath::kAuto && cached_rounds >= kTopkStreamRounds);
  if (stream) {
    TopkPlan s = p;
    s.cache_in_smem = false;
    // The largest candidate buffer that keeps the residency registers allow (else the smallest
    // that fits at all, else none).
    s.candidates = 0;
    for (int cap : {4 * kTopkStreamCandidates, 2 * kTopkStreamCandidates, kTopkStreamCandidates,
                    kTopkStreamCandidates / 2}) {
      const int64_t smem = kTopkFixedSmemBytes + int64_t{8} * cap;
      if (smem > l.smem_optin_per_block || BlocksBySmem(l, smem) < 1) continue;
      s.candidates = cap;
      if (BlocksBySmem(l, smem) >= max_blocks) break;
    }
    s.smem_bytes = kTopkFixedSmemBytes + 8 * s.candidates;
    s.blocks_per_sm = std::max(1, std::min(max_blocks, BlocksBySmem(l, s.smem_bytes)));
    const int64_t hw = int64_t{l.num_sms} * s.blocks_per_sm;
    int64_t cpg = std::min(cpg_parallel, std::max<int64_t>(1, hw / rows));
    cpg = std::max<int64_t>(1, std::min(cpg, hw));
    s.chunk = RoundUp(CeilDiv(max_len, cpg), 4);
    s.ctas_per_group = static_cast<int>(CeilDiv(max_len, s.chunk));
    s.num_groups = std::max<int64_t>(1, std::min(rows, hw / s.ctas_per_group));
    // kAuto keeps the cached plan unless streaming needs fewer rounds, and streams only when the candidates are likely to fit (a CTA's chunk at most 16 x the
    // buffer, i.e. >= 6 % of it may stay in play after pass 0; otherwise each overflowing CTA
    // re-reads its chunk on every pass) and a CTA's chunk is at most kTopkStreamMaxChunk (one
    // CTA streaming more is bound by one SM's bandwidth). Measured on the H200 (docs/
    // benchmarks.md): streaming won at 43,692 and 87,384 columns per CTA and lost at 131,072;
    // it also reads HBM twice, which favours cached rounds on low-bandwidth parts (GB10).
    const bool cand_fit = s.candidates > 0 && s.chunk <= int64_t{16} * s.candidates &&
                          s.chunk <= kTopkStreamMaxChunk;
    if (p.chunk == 0 || path == TopkPath::kStreaming ||
        (cand_fit && CeilDiv(rows, s.num_groups) < cached_rounds)) {
      p = s;
    }
  }
  p.total_ctas = p.num_groups * p.ctas_per_group;
  p.cooperative = p.ctas_per_group > 1;
  if (!p.cooperative) p.num_groups = rows, p.total_ctas = rows;
  p.workspace_bytes = p.cooperative ? static_cast<size_t>(rows) * kTopkRowStateBytes : 0;
  return p;
}

}  // namespace glm::kernels
