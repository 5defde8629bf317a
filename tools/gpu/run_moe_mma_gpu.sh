#!/usr/bin/env bash
# fp8 MoE experts on tensor cores (MoeMmaKernel, issue 4) on a GPU machine, one call, over a
# build made elsewhere. Builds nothing. On the CPU machine first:
#   cmake --build build-moe-mma -j2 --target cuda_moe_test cuda_narrow_test cuda_graph_test \
#     cuda_ops_bench glm-bench-cuda-decode
#   BUILD_DIR=build-moe-mma STAGE_DIR=.gpurun-moe-mma BINS="build-moe-mma/engine/backend/cuda/cuda_moe_test \
#     build-moe-mma/engine/backend/cuda/cuda_narrow_test build-moe-mma/engine/backend/cuda/cuda_graph_test \
#     build-moe-mma/engine/backend/cuda/cuda_ops_bench build-moe-mma/engine/model/bench/glm-bench-cuda-decode" \
#     tools/gpu/stage_build.sh
# then on the GPU machine (carry .gpurun-moe-mma): tools/gpu/run_moe_mma_gpu.sh
# Benches first on a quiet GPU (cuda_ops_bench --only moe: mma vs the token-group kernels in one
# process; the decode bench with the tensor-core kernels and with GLM_CUDA_MOE_MMA=0), then the
# tests in parallel: cuda_moe_test, cuda_graph_test '*Bitwise*', cuda_narrow_test '*Moe*',
# compute-sanitizer memcheck of cuda_moe_test '*Mma*'. BUDGET (s, default 100) bounds it all.
# QUICK=1 runs the bench's quick set (GLM_BENCH_MOE_QUICK: fp8, batches 8..128).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-moe-mma}
bin=$stage/bin
out=${OUT:-/tmp/glm-moe-mma-out}
mkdir -p "$out"
source tools/gpu/common.sh
gpu_env "$stage"
summary=()
GPU_STEP_BUDGET=${BUDGET:-100}
GPU_STEP_GREP="^\[  (PASSED|FAILED) |^\[  FAILED|^moe|^d2d|ERROR SUMMARY|Failure|error|ms/layer|batch|MiB|layer"
GPU_STEP_HEAD=80
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[[ -n ${QUICK:-} ]] && export GLM_BENCH_MOE_QUICK=1
gpu_step "cuda_ops_bench moe" 30 "$bin/cuda_ops_bench" --only moe --iters 10
dec=(--dtype fp8 --kv-dtype fp8 --layers 1,2 --batches 16,64 --contexts 4096 --steps 8 --graphs on)
gpu_step "decode mma" 25 "$bin/glm-bench-cuda-decode" "${dec[@]}"
GLM_CUDA_MOE_MMA=0 gpu_step "decode grouped" 25 "$bin/glm-bench-cuda-decode" "${dec[@]}"
# Tests, concurrently (each its own log).
left=$((GPU_STEP_BUDGET - SECONDS - 3)); ((left < 10)) && left=10
t0=$SECONDS
timeout "$left" "$bin/cuda_moe_test" >"$out/moe_test.log" 2>&1 & p1=$!
timeout "$left" "$bin/cuda_graph_test" --gtest_filter='*Bitwise*' >"$out/graph.log" 2>&1 & p2=$!
timeout "$((left < 60 ? left : 60))" "$bin/cuda_narrow_test" --gtest_filter='*Moe*' >"$out/narrow.log" 2>&1 & p3=$!
timeout "$left" compute-sanitizer --tool memcheck --error-exitcode 7 "$bin/cuda_moe_test" \
  --gtest_filter='*Mma*' >"$out/memcheck.log" 2>&1 & p4=$!
for n in "1 moe_test" "2 graph" "3 narrow" "4 memcheck"; do
  read -r i name <<<"$n"; pid_var=p$i
  wait "${!pid_var}"; rc=$?
  echo "== $name rc=$rc ($((SECONDS - t0))s)"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|ERROR SUMMARY|error|fp8 (mma|auto)|Mma" "$out/$name.log" | head -n 60
  summary+=("$name rc=$rc")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
