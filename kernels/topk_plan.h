// Launch plan for topk_radix (topk_radix.cuh): how many CTAs work on one row (a worker group),
// how many groups run at once, the columns each CTA owns and the shared memory it asks for.
// Pure host code, so the plan for any chip can be checked on a machine with no GPU.
//
// Rules (never more than the device gives):
// - smem_bytes <= smem_optin_per_block, and blocks_per_sm * (smem_bytes + reserved) <= smem_per_sm,
//   blocks_per_sm * kTopkThreads <= max_threads_per_sm, blocks_per_sm <= max_blocks_per_sm_cap.
// - A multi-CTA group meets at a spin barrier, so every CTA of the launch must be resident at once:
//   total_ctas <= num_sms * blocks_per_sm (the launcher also uses cudaLaunchCooperativeKernel,
//   which refuses a grid that cannot be co-resident instead of hanging).
// - Preferred: each CTA caches its chunk of the row in shared memory as radix keys (one read of
//   HBM); rows beyond what the resident groups hold are taken in rounds. When the row is too
//   long for the resident CTAs' shared memory (the GB10 failure in
//   ../shared/specs/glm5-architecture.md §6.2), or the cached plan would need
//   kTopkStreamRounds+ rounds and streaming chunks stay short, the plan streams instead: no key
//   cache, the chunk is read from global memory for pass 0 and the candidate compaction (and on
//   every pass if a CTA's candidates overflow). It never gives up for lack of shared memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device_limits.h"

namespace glm::kernels {

inline constexpr int kTopkThreads = 512;  // threads per CTA of topk_radix
// Shared memory every topk_radix CTA uses besides the key cache: histogram (256 u32), suffix
// sums (256 u32), scalars; rounded up to 16 B.
inline constexpr int kTopkFixedSmemBytes = 2304;
// Candidate buffer: after the first radix pass each CTA copies the keys still in play (and
// their columns) into shared memory, so later passes and the emission scan those instead of the
// whole chunk; a CTA with more candidates than fit falls back to scanning its chunk. Capacity:
// chunk / 8 (multiple of 32, at most kTopkMaxCandidates) when caching; when streaming the largest
// of 4x, 2x, 1x, 0.5x kTopkStreamCandidates that keeps the register-limited residency; 8 bytes
// each (key + column).
inline constexpr int kTopkMaxCandidates = 4096;
inline constexpr int kTopkStreamCandidates = 2048;
// kAuto streams when the cached plan would need this many rounds of rows per group.
inline constexpr int64_t kTopkStreamRounds = 3;
// kAuto never streams chunks longer than this (columns per CTA).
inline constexpr int64_t kTopkStreamMaxChunk = 65536;
// Fewest columns per CTA worth a CTA of its own (8 per thread): shorter rows use fewer CTAs.
inline constexpr int kTopkMinChunk = 4096;
// Per-row global state of a multi-CTA group (histograms, barrier counters, output cursors);
// the workspace holds one per row and is zeroed before each launch. Must equal
// sizeof(topk_detail::RowState) (checked in topk_radix.cu).
inline constexpr size_t kTopkRowStateBytes = 4 * 256 * 4 + 8 * 4;

struct TopkPlan {
  int64_t rows = 0;
  int64_t max_len = 0;
  int k = 0;
  int ctas_per_group = 1;   // CTAs that split one row
  int64_t num_groups = 0;   // groups launched; rows go round-robin over groups
  int64_t chunk = 0;        // columns per CTA (multiple of 4); ctas_per_group * chunk >= max_len
  bool cache_in_smem = true;  // false: streaming (re-read the chunk on each pass)
  int candidates = 0;         // candidate buffer entries per CTA (0: none)
  bool cooperative = false;   // multi-CTA groups: launched with cudaLaunchCooperativeKernel
  int smem_bytes = 0;         // dynamic shared memory per CTA
  int blocks_per_sm = 0;      // residency the plan assumes (verified by the launcher)
  int64_t total_ctas = 0;     // grid size = num_groups * ctas_per_group
  size_t workspace_bytes = 0; // rows * kTopkRowStateBytes when cooperative, else 0

  std::string DebugString() const;
};

// Candidate capacity for a chunk (0 = streaming) and the dynamic shared memory of a CTA.
int64_t TopkCandidates(int64_t chunk, bool with_cand);
int64_t TopkSmemBytes(int64_t chunk, bool cache, bool with_cand);

// Plans top-k over `rows` rows of at most `max_len` fp32 scores, k >= 1. Errors only for invalid
// arguments (non-positive sizes, a device with no SMs or too little shared memory for the fixed
// part); any valid row length gets a plan that fits.
// kAuto picks; kCached prefers caching (streams only when nothing cached fits); kStreaming
// always streams (tests and benches compare the two).
enum class TopkPath { kAuto, kCached, kStreaming };

absl::StatusOr<TopkPlan> PlanTopk(const DeviceLimits& limits, int64_t rows, int64_t max_len,
                                  int k, TopkPath path = TopkPath::kAuto);

}  // namespace glm::kernels
