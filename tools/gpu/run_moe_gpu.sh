#!/usr/bin/env bash
# MoE on the GPU (issue 4): the decode kernels of cuda_ops_moe.cu and the warp-per-row MoeRoute
# (kernels/moe_route), on a GPU machine over a build made elsewhere. Builds nothing.
# On the CPU machine first:
#   cmake -S . -B build-moe -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-moe -j2 --target moe_route_test cuda_moe_test cuda_ops_test \
#     cuda_narrow_test cuda_ops_bench glm-bench-cuda-decode
#   BUILD_DIR=build-moe STAGE_DIR=.gpurun-moe BINS="build-moe/kernels/moe_route_test \
#     build-moe/engine/backend/cuda/cuda_moe_test build-moe/engine/backend/cuda/cuda_ops_test \
#     build-moe/engine/backend/cuda/cuda_narrow_test build-moe/engine/backend/cuda/cuda_ops_bench \
#     build-moe/engine/model/bench/glm-bench-cuda-decode" tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine (carry .gpurun-moe): tools/gpu/run_moe_gpu.sh
# Steps (each under a time limit; SKIP_PROFILE=1 / SKIP_MEMCHECK=1 drop the last ones;
# SKIP_ROUTE=1 drops moe_route_test and its memcheck, SKIP_NARROW=1 cuda_narrow_test;
# MEMCHECK_FILTER (default '*Graph*') picks the cuda_moe_test cases under memcheck):
#   moe_route_test; cuda_moe_test (every MoeExperts path x fp32/bf16/fp8 vs the CPU backend,
#   graph replay = eager); the MoE cases of cuda_ops_test and cuda_narrow_test; cuda_ops_bench
#   --only moe (MoeRoute per launch in a graph; GLM-5 widths, fp8 / bf16, batch 1 / 8 / 16 /
#   32 / 64, each path, fraction of a D2D copy); MoeRoute alone under ncu;
#   tools/gpu/profile_decode.sh at batch 1 and 8 (ncu per-kernel times of one decode step);
#   compute-sanitizer memcheck of moe_route_test and cuda_moe_test.
# Logs in $OUT (or /tmp/glm-moe-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-moe}
bin=$stage/bin
out=${OUT:-/tmp/glm-moe-out}
mkdir -p "$out"
source tools/gpu/common.sh
gpu_env "$stage"
summary=()
GPU_STEP_LOG=$out/moe.log
GPU_STEP_GREP="^\[  (PASSED|FAILED) |^\[  FAILED|max \|gpu|^moe[ _]|^d2d|ERROR SUMMARY|Failure|error"
GPU_STEP_HEAD=120
step() { gpu_step "$@"; }  # step NAME TIMEOUT_S CMD... (tools/gpu/common.sh)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[[ -z ${SKIP_ROUTE:-} ]] && step moe_route_test 20 "$bin/moe_route_test"
step cuda_moe_test 45 "$bin/cuda_moe_test"
step "cuda_ops_test Moe" 40 "$bin/cuda_ops_test" --gtest_filter='*Moe*'
[[ -z ${SKIP_NARROW:-} ]] && step "cuda_narrow_test Moe" 40 "$bin/cuda_narrow_test" --gtest_filter='*Moe*'
step "cuda_ops_bench moe" 45 "$bin/cuda_ops_bench" --only moe --iters 20
if [[ -z ${SKIP_PROFILE:-} ]] && command -v ncu >/dev/null; then
  # MoeRoute alone under ncu (caches flushed as in profile_decode.sh), 1 / 8 / 64 rows: the eager launch of each case (kernel) and its graphs of 50 launches (one result).
  timeout 40 ncu --metrics gpu__time_duration.sum --csv --graph-profiling graph \
    "$bin/cuda_ops_bench" --only route --iters 1 >"$out/ncu_route.csv" 2>&1
  python3 - "$out/ncu_route.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
agg = collections.OrderedDict()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    key = (r.get("Kernel Name", "?").split("(")[0][:60], r.get("Grid Size", "-"))
    v = float(r["Metric Value"].replace(",", ""))
    agg.setdefault(key, []).append(v / 1000 if r["Metric Unit"] in ("ns", "nsecond") else v)
for (k, g), v in agg.items():
    print(f"ncu {k} grid {g}: {len(v)} launches, median {sorted(v)[len(v)//2]:.2f} us")
PY
fi
if [[ -z ${SKIP_PROFILE:-} ]]; then
  for b in 1 8; do
    t0=$SECONDS
    OUT=$out timeout 50 tools/gpu/profile_decode.sh "$stage" "$b" >"$out/profile_b$b.txt" 2>&1
    echo "== profile_decode batch $b (rc $?, $((SECONDS - t0))s)"
    head -n 40 "$out/profile_b$b.txt"
  done
fi
if [[ -z ${SKIP_MEMCHECK:-} ]] && command -v compute-sanitizer >/dev/null; then
  [[ -z ${SKIP_ROUTE:-} ]] && step "memcheck moe_route_test" 60 compute-sanitizer --tool memcheck \
    --error-exitcode 7 "$bin/moe_route_test"
  step "memcheck cuda_moe_test ${MEMCHECK_FILTER:-*Graph*}" "${MEMCHECK_LIMIT:-90}" \
    compute-sanitizer --tool memcheck --error-exitcode 7 "$bin/cuda_moe_test" \
    --gtest_filter="${MEMCHECK_FILTER:-*Graph*}"
fi
grep -hE "^\[  FAILED  \]" "$out/moe.log" | sort -u | head -n 40
echo "== summary"
printf '%s\n' "${summary[@]}"
