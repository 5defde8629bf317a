// Path selection of the CUDA MoeExperts (cuda_ops_moe.cu) for tests and benches: the decode
// shapes (tokens x top_k <= kMoeDecodeMaxPairs with 16-byte weight rows) run the weight-streaming
// decode kernels that route from ids in registers; up to kMoeListedMaxPairs pairs (decode
// batches 9..512 tokens with top-8) the token-group listed kernels (per-expert token lists built
// by a one-CTA device routing kernel, split into groups of up to 4 rows; each weight chunk is
// read once per group); larger shapes the tiled grouped GEMM. The previous decode GEMV (routing
// kernel + per-expert CTAs), the per-row listed kernels (a pass over the weights per token row)
// and both listed kernels at any size up to kMoeListedForceMaxPairs, and the tiled GEMM stay
// reachable so a test can check every path against the CPU backend and a bench can report
// before / after in one process.
#pragma once

namespace glm::engine::cuda {

inline constexpr int kMoeDecodeMaxPairs = 64;
inline constexpr int kMoeListedMaxPairs = 4096;  // kAuto's cut-over to the tiled GEMM
inline constexpr int kMoeListedForceMaxPairs = 4096;
// kAuto runs fp8 experts on the tensor cores (MoeMmaKernel) for kMoeMmaAutoMinPairs..
// kMoeMmaAutoMaxPairs pairs (decode batches 65..512 with top-8; below, the decode or the
// token-group kernels: see the measurements at the end); the environment variable
// GLM_CUDA_MOE_MMA=0 (read once) keeps kAuto on the token-group kernels.
inline constexpr int kMoeMmaAutoMinPairs = 513;
inline constexpr int kMoeMmaAutoMaxPairs = 4096;

enum class MoeDecodePath {
  kAuto,        // MoeDecodeKernel (<= 64 pairs; bf16 weights: the token-group kernels, measured
                // faster there), token-group listed decode (<= 4096), tiled (default)
  kLegacyGemv,  // MoeRouteKernel + MoeGemvKernel + MoeCombineKernel (before the decode kernels;
                // <= 64 pairs, else tiled)
  kTiled,       // the grouped GEMM at every size
  kListed,      // MoeListRouteKernel + MoeDecodeListKernel at every size <= 4096 pairs (else
                // tiled): the listed decode before the token-group kernels
  kGrouped,     // MoeListRouteKernel + MoeGroupKernel at every size <= 4096 pairs (else tiled)
  kMma,         // fp8 weights: MoeListRouteKernel + MoeSplitKernel + MoeMmaKernel (tensor cores)
                // at every size <= 4096 pairs (else tiled); bf16 / fp32 weights as kGrouped
};

// The kernels the last MoeExperts call of this process launched (tests check the selection).
enum class MoeRanPath { kNone, kDecode, kListed, kGrouped, kLegacyGemv, kTiled, kMma };
MoeRanPath LastMoeRanPath();

// Process-wide; takes effect at the next MoeExperts call (not for already captured graphs).
void SetMoeDecodePath(MoeDecodePath path);

// Token rows per unit of the token-group kernels (MoeGroupKernel), clamped to 1..4 (default 4:
// the register accumulators' limit at 128 registers); process-wide, a bench knob. Results do
// not depend on it (each token row's sums are computed alike whatever its unit).
void SetMoeGroupTokens(int tokens);

// The top of kAuto's tensor-core range (default kMoeMmaAutoMaxPairs), clamped to
// kMoeMmaAutoMinPairs..kMoeListedForceMaxPairs; process-wide, a bench knob (glm-bench-cuda-decode
// --ab mma), taking effect at the next MoeExperts call.
void SetMoeMmaAutoMaxPairs(int pairs);
int MoeMmaAutoMaxPairs();

// The decode kernels' (<= kMoeDecodeMaxPairs) grid: balanced (default) takes the fewest warps
// that still run the tasks in the same number of rounds, so that every warp has as many tasks
// (cuda_ops_moe.cu DecodeBlocks); false: every resident CTA (before). Process-wide, a bench knob
// (glm-bench-cuda-decode --ab moegrid); no result depends on it.
void SetMoeDecodeBalancedGrid(bool balanced);
bool MoeDecodeBalancedGrid();

// The decode kernels' weight chunks: through a shared-memory ring per warp by cp.async (true,
// the default, where it costs the kernel no resident CTAs) or a register double buffer (false,
// before). The same bytes, values and order: no result depends on it. With the ring, fp8 steps
// (other types' only where every routing slot holds one pair) run each warp's tasks back to back
// (no pipeline restart per task). Process-wide, a bench knob (glm-bench-cuda-decode --ab async).
// The ring's kernel also runs 3 CTAs per SM (its chunks in flight hold no registers), the
// register kernel 2. Measured on an H200 (GLM-5 widths, fp8, 256 experts top-8; cuda_ops_bench
// --only moe, us per call, ring vs registers): batch 1 87.1 vs 91.4, 64 pairs 591 vs 664; decode
// step (graphs, --ab async, ms/layer registers -> ring) batch 1 0.238 -> 0.227 (4K), 0.292 ->
// 0.282 (128K); batch 2 0.365 -> 0.350 (4K), 0.469 -> 0.451 (128K).
void SetMoeDecodeAsyncCopies(bool on);
bool MoeDecodeAsyncCopies();
// Whether the last MoeExperts / MoeRouteExperts call ran the decode kernels with the ring.
bool LastMoeDecodeAsync();
// Whether the last decode kernel that ran on the current device streamed its warps' tasks back
// to back through the ring (DecodeStream: fp8, or every routing slot one pair; rows of whole
// chunk iterations). Synchronizes the device; for tests.
bool MoeDecodeStreamedOnDevice();

// MoeRouteExperts: decode steps of at most this many tokens (default kMoeRouteFuseMaxTokens,
// clamped to 0..kMoeRouteMaxFuseTokens; 0 = never) route inside the gate|up decode kernel, where
// every warp routes every token itself (RouteRowWarp, MoeRoute's arithmetic) instead of waiting
// for MoeRoute's launch. Process-wide, a bench knob (glm-bench-cuda-decode --ab fuseroute);
// results do not depend on it. Measured on an H200 (GLM-5 widths, fp8, graphs; --ab fuseroute,
// ms/layer off -> on, two runs): batch 1 0.241 -> 0.239 and 0.236 -> 0.236 (4K), 0.295 -> 0.291
// and 0.289 -> 0.289 (128K): neutral to 1 %; batch 2 fused 0.363 -> 0.367, 0.474 -> 0.475 (each
// warp routing two tokens costs what the launch saved): hence 1.
inline constexpr int kMoeRouteFuseMaxTokens = 1;
inline constexpr int kMoeRouteMaxFuseTokens = 7;  // 64 pairs of the decode kernels, top-8 + 1
void SetMoeRouteFuseMaxTokens(int tokens);
int MoeRouteFuseMaxTokens();
// Whether the last MoeExperts / MoeRouteExperts call routed inside the gate|up kernel.
bool LastMoeRouteFused();

// Decode steps of at most this many tokens (default kMoeOneLaunchMaxTokens, clamped to
// 0..kMoeDecodeMaxPairs; 0 = never) on the decode kernels run gate|up, down and the combine in
// one launch (cuda_ops_moe.cu MoeDecodeOneKernel: dataflow counters between the phases, the same
// bits as the three launches); past it, three launches. Process-wide, a bench knob
// (glm-bench-cuda-decode --ab onelaunch).
// Off by default: measured slower on an H200 (GLM-5 widths, fp8, 256 experts top-8;
// cuda_ops_bench --only moe, us per call, one launch vs three): batch 1 101.8 vs 91.3, batch 8
// (64 pairs, no shared expert) 734 vs 667; bf16 batch 1 182.0 vs 169.4; decode step (graphs,
// --ab onelaunch, ms/layer) batch 1 0.239 -> 0.248 (4K), 0.291 -> 0.302 (128K), batch 2 0.362 ->
// 0.392. Earlier forms were slower still (act through L2 only 193 us; an acquire per down task and
// the fences between tasks ~104 us). What is left: the round-robin tasks give 40 % of the warps
// one gate|up task more (3x a down task's bytes: ~6 % above the mean), where the two kernels'
// balanced grids give every warp the same; and each task's fence.
inline constexpr int kMoeOneLaunchMaxTokens = 0;
void SetMoeOneLaunchMaxTokens(int tokens);
int MoeOneLaunchMaxTokens();
// Whether the last MoeExperts / MoeRouteExperts call ran MoeDecodeOneKernel.
bool LastMoeOneLaunch();

// Moves whenever one of the settings above that changes launches of already captured steps
// changes (SetMoeMmaAutoMaxPairs, SetMoeDecodeBalancedGrid, SetMoeDecodeAsyncCopies,
// SetMoeRouteFuseMaxTokens, SetMoeOneLaunchMaxTokens): the CUDA backend's scratch_epoch includes
// it, so decode graphs are recaptured.
int64_t MoeSettingsGeneration();

// Tried on an H200 at GLM-5 widths (256 experts top-8) and removed as slower than the kernels
// above: L2 prefetch 4 / 8 chunk iterations ahead in the decode kernels, 6-19 % slower at batch
// 1 / 8; decode tasks fetched from a device counter (warps that finish early take more), 4-7 %
// slower at batch 1, equal at batch 8; fp8 widened with integer ops instead of the e4m3
// conversion instructions, 20-30 % slower; listed decode fp8 with 2 / 4 token rows per pass
// (1 CTA per SM) instead of 1, us per call at batch 8 / 16 / 32 / 64: 1 row 640 / 1225 / 2386 /
// 4716, 2 rows 857 / 1570 / 2837 / 5105, 4 rows 854 / 1555 / 2755 / 4705; a cap on the decode
// kernels' CTAs per SM was a bench knob with no recorded gain. (And in
// kernels/moe_route: a rolled top-k loop over shared memory, 11.9 vs 8.7 us per launch.)
// The combine inside MoeDecodeKernel<down> (each warp, after its last task: a release fence, one
// arrival per task at its column group's counter, the last arrival summing that group into out;
// the same bits), decode step (graphs, fp8, ms/layer, combine launch -> inside): one column
// group per pass with the pairs' loads in a chain 0.220 -> 0.227 (4K), 0.241 -> 0.248 (128K);
// every completed group on its own lanes with the loads batched 0.220 -> 0.223, 0.242 -> 0.244
// (batch 2 and 8 within 1 %). Kernel timeline: the down kernel's share of the step 35.2 -> 41.9
// us against the combine launch's 3.4-5.7 (programmatic launch already hides most of that
// boundary; the fences and arrivals at every warp's end do not overlap anything). Also a
// combine kernel with every pair's loads issued first (no gain: 5.7-5.8 -> 5.9 us).
// Token-group kernels (MoeGroupKernel), same bench, us per call at fp8 batch 16 / 32 / 64 / 128
// (kept: 1140 / 2019 / 3535 / 6445): 8-row token groups with the pieces of a chunk one at a time
// (to fit 128 registers, with spills) and fp8 weights multiplied by the block scale as widened
// (one FMUL per weight value) instead of scaling each 4-term partial dot: 1386 / 2414 / 3920 /
// 6841 (4-row groups in that kernel 1385 / 2414 / 3910 / 7207); that kernel at 1 CTA per SM
// without the 128-register cap (164 to 184 registers): 2111 / 3608 / 5579 (batch 16..64), bf16
// 2318 / 3799 / 6306 vs 1846 / 2953 / 4545 at 2 CTAs. 2-row groups (kept kernel): 1164 / 2104 /
// 4014 / 8073. The kAuto cut-over to the tiled GEMM: batch 512 (4096 pairs) fp8 24.5 ms token
// groups vs 53.6 ms tiled, bf16 22.9 vs 57.8; batch 8 (64 pairs) stays on MoeDecodeKernel
// (fp8 629 us, token groups 624).
// fp8 on tensor cores (MoeMmaKernel, first version: 64-wide chunks straight from global memory
// into registers, one chunk prefetched, no shared memory, 2 CTAs of 8 warps per SM), same bench
// (--iters 10), us per call at batch 8 / 16 / 32 / 64 / 128: mma 941 / 1651 / 2697 / 3515 / 4372
// (0.53 / 0.55 / 0.56 / 0.54 / 0.51 of D2D), token groups 618 / 1146 / 2058 / 3451 / 6381: the mma
// kernel streams at a flat ~0.55 of D2D whatever the batch (latency bound: 2 KiB of weight loads
// in flight per warp, against the token-group kernel's 8 KiB cp.async ring), while the token
// groups slow down with rows per expert; hence kAuto's mma range 513..1024 pairs (batch 64 equal
// within 2 %, batch 128 1.46x faster). 1025..4096 pairs, measured later in the decode step
// (glm-bench-cuda-decode --ab mma, H200, GLM-5 widths, fp8, 4K context, ms/layer token groups ->
// mma): batch 256 16.08 -> 9.58, batch 512 33.45 -> 19.50 (batch 128, mma both ways: 4.61 /
// 4.52); hence the range's top at 4096 pairs, the token-group kernels' own limit. Next step: a
// deeper weight pipeline (cp.async ring as MoeGroupKernel) for batches 16..64.

}  // namespace glm::engine::cuda
