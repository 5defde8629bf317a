#!/usr/bin/env bash
# Tensor-core DSA indexer scores over the fp8 indexer cache (cuda_ops_indexer.cu,
# IndexerScoreTcKernel; issue 4), on a GPU machine over a build made elsewhere. Builds nothing.
# On the CPU machine first:
#   cmake --build build-idxtc -j2 --target cuda_indexer_test cuda_indexer_bench glm-bench-cuda-decode
#   BUILD_DIR=build-idxtc STAGE_DIR=.gpurun-idxtc BINS="build-idxtc/engine/backend/cuda/cuda_indexer_test \
#     build-idxtc/engine/backend/cuda/cuda_indexer_bench build-idxtc/engine/model/bench/glm-bench-cuda-decode" \
#     tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine (carry .gpurun-idxtc): tools/gpu/run_idxtc_gpu.sh
# Steps (STEPS="tests bench memcheck decode decode-fp32" picks some; BUDGET_S caps the wall time):
#   tests:       cuda_indexer_test, the fp8 / tensor-core cases (*Large* left out);
#   bench:       cuda_indexer_bench --score-only 1: IndexerTopK fp8 keys, rows 1 / 8 / 64 x 4K /
#                16K / 128K keys, fp32 score kernel vs tensor core in one process (µs, ratio);
#   decode:      glm-bench-cuda-decode --dtype fp8 --kv-dtype fp8 --layers 1,2 --batches 8,64
#                --contexts 4096,131072 --steps 4 --graphs on (default: tensor-core scores);
#   memcheck:    compute-sanitizer memcheck of the SanitizerSubset cases;
#   decode-fp32: the same decode bench with GLM_CUDA_INDEXER_FP32_SCORE=1 (the fp32 score kernel).
# Logs in $OUT (or /tmp/glm-idxtc-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-idxtc}" "${OUT:-/tmp/glm-idxtc-out}"
steps=${STEPS:-tests bench memcheck decode decode-fp32}
GPU_STEP_LOG=$out/idxtc.log
GPU_STEP_BUDGET=${BUDGET_S:-}
GPU_STEP_GREP="^\[  (PASSED|FAILED) |^\[  FAILED|tc-score|ERROR SUMMARY|Failure|Expected|Which is|actual|error|differ|^topk-score|D2D|ms/layer|^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+"
GPU_STEP_HEAD=80
step() { gpu_step "$@"; }
decode_args=(--dtype fp8 --kv-dtype fp8 --layers 1,2 --batches 8,64 --contexts 4096,131072
  --steps 4 --graphs on)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for s in $steps; do
  case $s in
    tests)
      step cuda_indexer_test 40 "$bin/cuda_indexer_test" \
        --gtest_filter='IndexerTopKPathsTest.*:IndexerTcScoreTest.*-*Large*'
      ;;
    bench)
      step cuda_indexer_bench 30 "$bin/cuda_indexer_bench" --score-only 1 --rows 1,8,64 \
        --keys 4096,16384,131072 --trials 3 --calls 10
      ;;
    decode)
      step "decode fp8/fp8 (tc scores)" 40 "$bin/glm-bench-cuda-decode" "${decode_args[@]}"
      ;;
    memcheck)
      if command -v compute-sanitizer >/dev/null; then
        step "memcheck sanitizer subset" 25 compute-sanitizer --tool memcheck --error-exitcode 7 \
          "$bin/cuda_indexer_test" --gtest_filter='IndexerTcScoreTest.SanitizerSubset:IndexerTopKPathsTest.SanitizerSubset'
      fi
      ;;
    decode-fp32)
      step "decode fp8/fp8 (fp32 scores)" 40 env GLM_CUDA_INDEXER_FP32_SCORE=1 \
        "$bin/glm-bench-cuda-decode" "${decode_args[@]}"
      ;;
  esac
done
gpu_run_end
