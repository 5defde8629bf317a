#!/usr/bin/env bash
# Batch-1 decode attention (staged split kernel + wide combine) and the indexer's multi-CTA radix
# passes (issue 4) on a GPU machine over a build made elsewhere. Builds nothing. CPU machine:
#   cmake --build build-attn1 -j2 --target cuda_ops_test cuda_kv_fp8_test cuda_graph_test \
#     cuda_model_test cuda_kv_bench glm-bench-cuda-decode
#   BUILD_DIR=build-attn1 STAGE_DIR=.gpurun-attn1 BINS="build-attn1/engine/backend/cuda/cuda_ops_test \
#     build-attn1/engine/backend/cuda/cuda_kv_fp8_test build-attn1/engine/backend/cuda/cuda_graph_test \
#     build-attn1/engine/backend/cuda/cuda_model_test build-attn1/engine/backend/cuda/cuda_kv_bench \
#     build-attn1/engine/model/bench/glm-bench-cuda-decode" tools/gpu/stage_build.sh
# then on the GPU machine (carry .gpurun-attn1), repo root: tools/gpu/run_attn1_gpu.sh
# Steps (STEPS picks some; the whole run stays under BUDGET_S, default 140 s, later steps are
# cut short or skipped):
#   tests:    cuda_ops_test Attention* / Indexer* (both paths vs the CPU backend, staged path
#             deterministic, multi-CTA select == single-CTA select bitwise), cuda_kv_fp8_test,
#             cuda_graph_test, cuda_model_test; the Attention cases again with shared memory
#             capped to GB10's 99 KiB (16-key tiles);
#   memcheck: compute-sanitizer memcheck of the new small cases;
#   bench:    cuda_kv_bench rows 1 / 8, keys 4K / 128K (attn-old / index-old = legacy paths,
#             attn-new / index-new = new paths forced, attention / indexer = default; all in
#             the same process);
#   ncu:      per-kernel gpu__time_duration of cuda_kv_bench's Attention / Indexer kernels
#             (legacy then new, fp32 then fp8), rows 1, 4K and 128K keys;
#   profile:  tools/gpu/profile_decode.sh (batch 1 then 8) on glm-bench-cuda-decode.
# Logs in $OUT (or /tmp/glm-attn1-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-attn1}
bin=$stage/bin
out=${OUT:-/tmp/glm-attn1-out}
steps=${STEPS:-tests memcheck bench ncu profile}
budget=${BUDGET_S:-140}
mkdir -p "$out"
source tools/gpu/common.sh
gpu_env "$stage"
summary=()
GPU_STEP_LOG=$out/attn1.log
GPU_STEP_BUDGET=$budget
GPU_STEP_GREP="^\[  (PASSED|FAILED) |^\[  FAILED|ERROR SUMMARY|Failure|Expected|Which is|error|^(indexer|index-old|index-new|attention|attn-old|attn-new) |D2D"
GPU_STEP_HEAD=80
attn1_after() {  # the per-shape rows of the path-choice tests
  grep -E "^\[(attention|indexer) " "$4" | grep -E "Large|1x|2x|8x|below|long|ties" |
    head -n 40
}
GPU_STEP_AFTER=attn1_after
step() { gpu_step "$@"; }  # step NAME TIMEOUT_S CMD... (tools/gpu/common.sh)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
for s in $steps; do
  case $s in
    tests)
      step "cuda_ops_test Attention/Indexer" 40 "$bin/cuda_ops_test" \
        --gtest_filter='*Attention*:*Indexer*'
      step cuda_kv_fp8_test 20 "$bin/cuda_kv_fp8_test"
      step cuda_graph_test 30 "$bin/cuda_graph_test"
      step cuda_model_test 30 "$bin/cuda_model_test"
      step "cuda_ops_test Attention, smem 99 KiB" 20 env GLM_KERNELS_SMEM_CAP_BYTES=101376 \
        "$bin/cuda_ops_test" --gtest_filter='*Attention*'
      ;;
    memcheck)
      if command -v compute-sanitizer >/dev/null; then
        step "memcheck new cases" 30 compute-sanitizer --tool memcheck --error-exitcode 7 \
          "$bin/cuda_ops_test" --gtest_filter='*keys_below_width*:*causal_long*:*dv96*:*glm5_1x4k*:*glm5_2x4k_ties*:*glm5_8rows_mixed*:*all_ties_1x5k*:*absorbed_all_padding*:*absorbed_no_keys*'
      fi
      ;;
    bench)
      step cuda_kv_bench 30 "$bin/cuda_kv_bench" --rows 1,8 --keys 4096,131072 --trials 3
      ;;
    ncu)
      if command -v ncu >/dev/null; then
        step "ncu kv_bench rows 1" 30 ncu --metrics gpu__time_duration.sum --csv \
          --log-file "$out/ncu_kv.csv" --kernel-name regex:'Attention|Indexer' \
          --launch-count 400 "$bin/cuda_kv_bench" --rows 1 --keys 4096,131072 --trials 1 \
          --calls 1
        python3 - "$out/ncu_kv.csv" <<'PY'
import csv, sys, re
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
# launches in order, consecutive identical names folded (count, min µs)
prev, group = None, []
def flush():
    if group:
        print(f"  {len(group):3d}x min {min(group):8.2f} us  {prev}")
for r in rows:
    name = re.sub(r"\(.*", "", r["Kernel Name"]).split("::")[-1][:70]
    t = float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1.0)
    if name != prev:
        flush(); prev, group = name, []
    group.append(t)
flush()
PY
      fi
      ;;
    profile)
      for b in 1 8; do
        left=$((budget - SECONDS))
        if ((left < 25)); then
          summary+=("profile_decode batch $b skipped (budget)")
          continue
        fi
        t0=$SECONDS
        OUT=$out timeout "$left" tools/gpu/profile_decode.sh "$stage" "$b" 2>&1 |
          tee -a "$out/attn1.log" | grep -E "==|Attention|Indexer|us in the last" | head -20
        summary+=("$(printf '%-40s %4ss' "profile_decode batch $b" "$((SECONDS - t0))")")
      done
      ;;
  esac
done
echo "== summary"
printf '%s\n' "${summary[@]}"
