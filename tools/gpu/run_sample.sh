#!/usr/bin/env bash
# Device sampling on a GPU machine over a build made elsewhere (builds nothing). On the CPU
# machine first:
#   cmake -S . -B build-h9 -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-h9 -j2 --target sample_test sample_backend_test engine_golden_test glm-run
#   BUILD_DIR=build-h9 STAGE_DIR=.gpurun-h9 BINS="<those binaries>" tools/gpu/stage_build.sh
# then from the repo root there: tools/gpu/run_sample.sh .gpurun-h9
# Steps (whichever binaries are staged): sample_test (kernel vs the host rule, batch freedom,
# 20K-draw distribution, guards) with its bench (us per step, batch 1 and 64, vocab 154,880);
# sample_backend_test (cuda backend vs cpu backend); engine_golden_test on cuda (greedy through
# the device sampler) and GoldenSamplingTest (seeded engine on cpu and cuda); compute-sanitizer
# memcheck of sample_test and sample_backend_test, synccheck of sample_test.
# Logs go to $OUT (or /tmp/glm-sample-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
# gpu_env via gpu_run_begin: cuBLASLt (the cuda backend links it; not staged) and GLM_GOLDEN_DIR.
gpu_run_begin "${1:-.gpurun-h9}" "${OUT:-/tmp/glm-sample-out}"
export PATH=$PATH:/usr/local/cuda/bin
GPU_STEP_APPEND=1
GPU_STEP_GREP="FAILED|Failure|ERROR SUMMARY|us/step|tokens equal|PASSED|SKIPPED"
GPU_STEP_HEAD=30
GPU_STEP_WIDTH=22
step() { gpu_step "$@"; }  # step NAME TIMEOUT_S CMD... (tools/gpu/common.sh; log $out/NAME.log)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [[ -x $bin/sample_test ]]; then
  step sample_test 60 "$bin/sample_test" --gtest_also_run_disabled_tests
fi
if [[ -x $bin/sample_backend_test ]]; then
  step sample_backend_test 120 "$bin/sample_backend_test"
fi
if [[ -x $bin/engine_golden_test ]]; then
  # Every golden test on cuda (greedy decode now samples on the device) plus seeded sampling.
  GLM_RUN_BINARY=$PWD/$bin/glm-run step golden 180 "$bin/engine_golden_test" \
    --gtest_filter='*cuda*:GoldenSamplingTest.*'
fi
if [[ -x $bin/sample_test ]] && command -v compute-sanitizer >/dev/null; then
  step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/sample_test" \
    --gtest_filter='-*Distribution*:*Bench*'
  step synccheck 60 compute-sanitizer --tool synccheck --error-exitcode 1 "$bin/sample_test" \
    --gtest_filter='*MatchesHostRule*'
fi
if [[ -x $bin/sample_backend_test ]] && command -v compute-sanitizer >/dev/null; then
  step memcheck_backend 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$bin/sample_backend_test"
fi
printf '%s\n' "${summary[@]}"
