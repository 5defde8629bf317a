#!/usr/bin/env bash
# The decode GEMV of narrow-weight Linears (kernels/gemv_narrow, NarrowLinear's small-M path) on
# a GPU machine, over a build made elsewhere. Builds nothing. On the CPU machine first:
#   cmake -S . -B build-gemv -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gemv -j2 --target gemv_narrow_test gemv_bench cuda_narrow_test \
#     cuda_graph_test engine_golden_narrow_test glm-bench-cuda-decode
#   BUILD_DIR=build-gemv STAGE_DIR=.gpurun-gemv BINS="build-gemv/kernels/gemv_narrow_test \
#     build-gemv/kernels/gemv_bench build-gemv/engine/backend/cuda/cuda_narrow_test \
#     build-gemv/engine/backend/cuda/cuda_graph_test build-gemv/engine/engine_golden_narrow_test \
#     build-gemv/engine/model/bench/glm-bench-cuda-decode" tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine (carry .gpurun-gemv): tools/gpu/run_gemv_gpu.sh
# Steps: gemv_narrow_test (kernel vs host reference, exact activation numerics, graph == eager);
# cuda_narrow_test, cuda_graph_test, engine_golden_narrow_test (the backend with the GEMV on);
# gemv_bench (µs, GB/s, fraction of D2D, vs cuBLASLt / gemm_fp8_block); profile_decode.sh at
# batch 1 and 8 with the GEMV on and off (GLM_LINEAR_GEMV_MAX_TOKENS=0: the GEMM path);
# compute-sanitizer memcheck of the GEMV test's small cases. Logs in $OUT (or /tmp/glm-gemv-out).
# Env STEPS (default "tests bench profile_on profile_off memcheck") picks the steps; "quick" is
# gemv_narrow_test, gemv_bench, cuda_narrow_test, cuda_graph_test and the memcheck in ~145 s
# (the split-K reduction A/B: gemv_bench's old_us / clu_us / one_us columns).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-gemv}" "${OUT:-/tmp/glm-gemv-out}"
steps=${STEPS:-tests bench profile_on profile_off memcheck}
GPU_STEP_WIDTH=36
gemv_after() { echo "== $1 rc=$2 $3s"; }
GPU_STEP_AFTER=gemv_after
step() {  # step NAME LOG TIMEOUT_S CMD... (tools/gpu/common.sh gpu_step, appending to $out/LOG)
  local name=$1 log=$out/$2
  shift 2
  GPU_STEP_FILE=$log gpu_step "$name" "$@"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for s in $steps; do
  case $s in
    quick)
      step gemv_narrow_test tests.log 30 "$bin/gemv_narrow_test"
      grep -hE "^\[  (PASSED|FAILED) |FAILED  \]|ERROR" "$out/tests.log" | head -n 40
      step gemv_bench bench.log 35 "$bin/gemv_bench"
      cat "$out/bench.log"
      step cuda_narrow_test tests.log 25 "$bin/cuda_narrow_test"
      step cuda_graph_test tests.log 25 "$bin/cuda_graph_test"
      grep -hE "^\[  (PASSED|FAILED) |FAILED  \]|ERROR" "$out/tests.log" | head -n 40
      step "memcheck gemv_narrow_test" memcheck.log 30 compute-sanitizer --tool memcheck \
        --error-exitcode 7 "$bin/gemv_narrow_test" \
        --gtest_filter='*ActivationNumerics*:*NonFinite*:*Deterministic*:*Overlapped*:*Rejects*'
      grep -hE "ERROR SUMMARY|^\[  (PASSED|FAILED) |FAILED  \]" "$out/memcheck.log"
      ;;
    tests)
      step gemv_narrow_test tests.log 60 "$bin/gemv_narrow_test"
      step cuda_narrow_test tests.log 40 "$bin/cuda_narrow_test"
      step cuda_graph_test tests.log 40 "$bin/cuda_graph_test"
      [[ -x $bin/engine_golden_narrow_test ]] &&
        step engine_golden_narrow_test tests.log 40 "$bin/engine_golden_narrow_test"
      grep -hE "^\[  (PASSED|FAILED) |FAILED  \]|^\[.*max err|ERROR" "$out/tests.log" | head -n 60
      ;;
    bench)
      step gemv_bench bench.log 60 "$bin/gemv_bench"
      cat "$out/bench.log"
      ;;
    profile_on)  # the per-launch CSVs and bench logs land in $out
      step "profile_decode gemv on" profile.log 50 tools/gpu/profile_decode.sh "$stage" "1 8"
      ;;
    profile_off)  # GLM_LINEAR_GEMV_MAX_TOKENS=0: the GEMM path; CSVs in /tmp/prof_off
      GLM_LINEAR_GEMV_MAX_TOKENS=0 OUT=/tmp/prof_off step "profile_decode gemv off" profile.log 50 \
        tools/gpu/profile_decode.sh "$stage" "1 8"
      ;;
    memcheck)
      step "memcheck gemv_narrow_test" memcheck.log 30 compute-sanitizer --tool memcheck \
        --error-exitcode 7 "$bin/gemv_narrow_test" \
        --gtest_filter='*ActivationNumerics*:*NonFinite*:*Deterministic*:*Overlapped*:*Rejects*'
      grep -hE "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$out/memcheck.log"
      ;;
  esac
done
cat "$out/profile.log" 2>/dev/null
gpu_run_end
