#!/usr/bin/env bash
# bf16 / fp8 block-scaled weights (issue 4, --dtype): the cuda backend against the cpu backend,
# which implements the same narrow numerics (engine/backend/cpu/cpu_narrow.h), on a GPU machine
# over a build made elsewhere. Builds nothing. On the CPU machine first:
#   cmake -S . -B build-narrow -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-narrow -j2 --target cuda_narrow_test engine_golden_narrow_test glm-run
#   BUILD_DIR=build-narrow STAGE_DIR=.gpurun-narrow BINS="build-narrow/engine/backend/cuda/\
#cuda_narrow_test build-narrow/engine/engine_golden_narrow_test build-narrow/engine/glm-run" \
#     tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine: tools/gpu/run_narrow_gpu.sh .gpurun-narrow
# Steps: cuda_narrow_test (Linear bf16/fp8 and MoeExperts bf16/fp8, cuda vs the cpu backend on
# the same effective operands); engine_golden_narrow_test (every golden fixture x dtype: the cpu
# backend with narrow weights vs transformers' fp32 golden, and the cuda backend with narrow
# weights vs the cpu backend with narrow weights: prompt logits and greedy ids of every case,
# divergence margins; weight bytes per dtype); glm-run --dtype auto on tiny-fp8, cuda and cpu
# (the same greedy ids expected). MEMCHECK=1 adds compute-sanitizer memcheck of cuda_narrow_test
# and of glm-run --dtype auto / bf16. Logs in $OUT (or /tmp/glm-narrow-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-narrow}" "${OUT:-/tmp/glm-narrow-out}"
golden=$PWD/tests/golden
GPU_STEP_LOG=$out/narrow.log
GPU_STEP_GREP="^\[  (PASSED|FAILED) |rel diff|greedy|max \|gpu|ERROR SUMMARY|Failure|^[0-9,]+\$"
GPU_STEP_HEAD=120
GPU_STEP_WIDTH=44
step() { gpu_step "$@"; }  # step NAME TIMEOUT_S CMD... (tools/gpu/common.sh)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step cuda_narrow_test 60 "$bin/cuda_narrow_test"
step engine_golden_narrow_test 90 env GLM_GOLDEN_DIR="$golden" \
  "$bin/engine_golden_narrow_test"
fx=$golden/tiny-fp8
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/reference.json'))['prompt_ids'])))")
for be in cuda cpu; do
  step "glm-run --backend $be --dtype auto tiny-fp8" 30 "$bin/glm-run" --backend $be \
    --dtype auto --model "$fx" --tokens "$ids" --max-tokens 32 --ignore-eos
done
if [[ ${MEMCHECK:-0} == 1 ]]; then
  if command -v compute-sanitizer >/dev/null; then
    step "memcheck cuda_narrow_test" 240 compute-sanitizer --tool memcheck --error-exitcode 7 \
      "$bin/cuda_narrow_test"
    for dt in auto bf16; do
      step "memcheck glm-run --dtype $dt tiny-fp8" 120 compute-sanitizer --tool memcheck \
        --error-exitcode 7 "$bin/glm-run" --backend cuda --dtype $dt --model "$fx" \
        --tokens "$ids" --max-tokens 8 --ignore-eos
    done
  else
    summary+=("memcheck: compute-sanitizer not found")
  fi
fi
grep -hE "^\[  FAILED  \]" "$out/narrow.log" | sort -u | head -n 40
gpu_run_end
