#!/usr/bin/env bash
# Decode-size small ops (issue 4): RmsNorm / RopeInterleaved single-row kernels and the small-M
# fp32 GEMV (kernels/per_head_gemv.h: CudaBackend::LinearPerHead and fp32 Linear at <= 16 rows)
# on a GPU machine, over a build made elsewhere (builds nothing). On the CPU machine first:
#   cmake --build build-smallops -j2 --target rmsnorm_test rope_test per_head_gemv_test \
#     smallops_bench cuda_backend_test cuda_model_test cuda_graph_test glm-bench-cuda-decode
#   BUILD_DIR=build-smallops STAGE_DIR=.gpurun-smallops \
#     BINS="build-smallops/kernels/rmsnorm_test build-smallops/kernels/rope_test
#           build-smallops/kernels/per_head_gemv_test build-smallops/kernels/smallops_bench
#           build-smallops/engine/backend/cuda/cuda_backend_test
#           build-smallops/engine/backend/cuda/cuda_model_test
#           build-smallops/engine/backend/cuda/cuda_graph_test
#           build-smallops/engine/model/bench/glm-bench-cuda-decode" tools/gpu/stage_build.sh
# then on the GPU machine, from the repo root: tools/gpu/run_smallops_gpu.sh .gpurun-smallops
# Steps: tests (kernels vs fp64 host references; the backend vs the CPU backend), memcheck
# (compute-sanitizer on the new test), bench (smallops_bench: µs eager / graph, GB/s vs D2D
# copy), profile (profile_decode.sh at batch 1 and 8), model (graph replay == eager bitwise; the
# model on cuda vs cpu).
# Logs in $OUT (or /tmp/glm-smallops-out); summary last. STEPS picks steps (default all).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-smallops}
bin=$stage/bin
out=${OUT:-/tmp/glm-smallops-out}
steps=${STEPS:-tests memcheck bench profile model}
mkdir -p "$out"
source tools/gpu/common.sh
gpu_env "$stage"
summary=()
GPU_STEP_GREP="^\[  (PASSED|FAILED) |FAILED  \]|ERROR SUMMARY|Failure|max_diff"
GPU_STEP_HEAD=20
GPU_STEP_INDENT='   '
GPU_STEP_WIDTH=32
step() { gpu_step "$@"; }  # step NAME TIMEOUT_S CMD... (tools/gpu/common.sh; log $out/NAME.log)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv,noheader
for s in $steps; do
  case $s in
    tests)
      for t in rmsnorm_test rope_test per_head_gemv_test cuda_backend_test; do
        [[ -x $bin/$t ]] && step "$t" 40 "$bin/$t"
      done
      ;;
    model)
      [[ -x $bin/cuda_graph_test ]] && step cuda_graph_test 40 "$bin/cuda_graph_test" \
        --gtest_filter='*Bitwise*:*Eager*:*Replay*'
      [[ -x $bin/cuda_model_test ]] && step cuda_model_test 40 "$bin/cuda_model_test"
      ;;
    memcheck)
      step "memcheck per_head_gemv_test" 40 compute-sanitizer --tool memcheck \
        --error-exitcode 1 "$bin/per_head_gemv_test"
      ;;
    bench)
      step smallops_bench 30 "$bin/smallops_bench"
      cat "$out/smallops_bench.log"
      ;;
    profile)
      [[ -x $bin/glm-bench-cuda-decode ]] && OUT=$out step profile_decode 50 \
        tools/gpu/profile_decode.sh "$stage" "1 8"
      head -c 9000 "$out/profile_decode.log"
      ;;
  esac
done
echo "== summary"
printf '%s\n' "${summary[@]}"
