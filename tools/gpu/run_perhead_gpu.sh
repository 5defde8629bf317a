#!/usr/bin/env bash
# Absorbed-MLA per-head products on the narrow kv_b_proj (kernels/per_head_narrow,
# Backend::AbsorbPerHead) on a GPU machine, over a build made elsewhere. Builds nothing.
# On the CPU machine first:
#   cmake -S . -B build-perhead -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-perhead -j2 --target per_head_narrow_test per_head_narrow_bench \
#     cuda_backend_test engine_golden_narrow_test glm-bench-cuda-decode
#   BUILD_DIR=build-perhead STAGE_DIR=.gpurun-perhead BINS="..." tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine: tools/gpu/run_perhead_gpu.sh .gpurun-perhead
# Steps: per_head_narrow_test (kernel vs fp64 host reference, exactness, NaN, determinism,
# graph replay); cuda_backend_test AbsorbPerHead (cuda vs cpu backend, bf16 / fp8 / fp32 weights)
# and LinearPerHead (the fp32 path); engine_golden_narrow_test (cuda narrow vs cpu narrow and cpu
# narrow vs transformers on every fixture); memcheck of per_head_narrow_test (odd shapes, NaN); per_head_narrow_bench
# (new kernel vs the fp32 cuBLASLt path in the same process, D2D baseline); the decode step
# glm-bench-cuda-decode --dtype fp8 --kv-dtype fp8 --layers 1,2 --batches 1,8 before
# (GLM_MLA_ABSORB_FP32=1: fp32 W_UK^T / kv_b copies + cuBLASLt, the previous path) and after.
# Logs in $OUT (or /tmp/glm-perhead-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-perhead}" "${OUT:-/tmp/glm-perhead-out}"
GPU_STEP_LOG=$out/perhead.log
GPU_STEP_GREP="model weights on|^\[  (PASSED|FAILED) |^\[ +(OK|FAILED) +\]|AbsorbPerHead.*max|rel diff|ERROR SUMMARY|Failure|^(W_U|op |D2D|device)|^ +[0-9]+ +[0-9]+ +[0-9.]+|^== [0-9d]|^ *batch|loaded in|free .* GiB"
GPU_STEP_HEAD=200
GPU_STEP_WIDTH=44
step() { gpu_step "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# Wall-clock budget (s) for all steps (GPU_STEP_BUDGET, tools/gpu/common.sh): the device run is
# capped; steps are ordered by value and later ones are clipped or skipped.
GPU_STEP_BUDGET=${BUDGET_S:-105}
step per_head_narrow_test 40 "$bin/per_head_narrow_test"
step "cuda_backend_test AbsorbPerHead/LinearPerHead" 40 "$bin/cuda_backend_test" \
  --gtest_filter='*AbsorbPerHead*:*LinearPerHead*'
step engine_golden_narrow_test 40 "$bin/engine_golden_narrow_test"
step per_head_narrow_bench 30 "$bin/per_head_narrow_bench"
args=(--dtype fp8 --kv-dtype fp8 --layers 1,2 --batches 1,8 --contexts 4096 --steps 8 --graphs on)
step "decode after" 40 "$bin/glm-bench-cuda-decode" "${args[@]}"
step "decode before (GLM_MLA_ABSORB_FP32=1)" 40 env GLM_MLA_ABSORB_FP32=1 \
  "$bin/glm-bench-cuda-decode" "${args[@]}"
if command -v compute-sanitizer >/dev/null; then
  step "memcheck per_head_narrow_test" 30 compute-sanitizer --tool memcheck --error-exitcode 7 \
    "$bin/per_head_narrow_test" --gtest_filter='*OddShapes*:*NanInX*:*OneHot*:*Widen*'
fi
grep -hE "^\[  FAILED  \]" "$out/perhead.log" | sort -u | head -n 40
gpu_run_end
