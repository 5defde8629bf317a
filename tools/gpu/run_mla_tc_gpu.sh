#!/usr/bin/env bash
# Tensor-core MLA decode attention over the fp8 latent cache (cuda_ops_attention.cu,
# AttentionTcKernel; issue 4), on a GPU machine over a build made elsewhere. Builds nothing.
# On the CPU machine first:
#   cmake --build build-mla-tc -j2 --target cuda_kv_fp8_test cuda_kv_bench glm-bench-cuda-decode
#   BUILD_DIR=build-mla-tc STAGE_DIR=.gpurun-mla-tc BINS="build-mla-tc/engine/backend/cuda/cuda_kv_fp8_test \
#     build-mla-tc/engine/backend/cuda/cuda_kv_bench build-mla-tc/engine/model/bench/glm-bench-cuda-decode" \
#     tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine (carry .gpurun-mla-tc): tools/gpu/run_mla_tc_gpu.sh
# Steps (STEPS="tests memcheck bench decode" picks some; BUDGET_S caps the wall time):
#   tests:    cuda_kv_fp8_test (the tensor-core path vs the CPU backend and the staged path, graph
#             replay == eager; the existing fp8 tests through the default path);
#   memcheck: compute-sanitizer memcheck of the tensor-core test;
#   bench:    cuda_kv_bench attention rows 1 / 8 / 64 x 2048 selected of 4K / 128K keys (legacy,
#             staged, tensor core, default; µs and the speedup over staged, in one process);
#   decode:   glm-bench-cuda-decode --dtype fp8 --kv-dtype fp8, batches 1 / 8 / 64, 4096 context.
# Logs in $OUT (or /tmp/glm-mla-tc-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-mla-tc}" "${OUT:-/tmp/glm-mla-tc-out}"
steps=${STEPS:-tests memcheck bench decode}
GPU_STEP_LOG=$out/mla_tc.log
GPU_STEP_BUDGET=${BUDGET_S:-}
GPU_STEP_GREP="^\[  (PASSED|FAILED) |^\[  FAILED|^tc rows|ERROR SUMMARY|Failure|Expected|Which is|actual|error|^(attn|attention)|speedup|D2D|ms/layer|^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+"
GPU_STEP_HEAD=120
step() { gpu_step "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for s in $steps; do
  case $s in
    tests)
      step cuda_kv_fp8_test 60 "$bin/cuda_kv_fp8_test" --gtest_filter='*Attention*:*Latent*'
      ;;
    memcheck)
      if command -v compute-sanitizer >/dev/null; then
        step "memcheck tensor-core test" 60 compute-sanitizer --tool memcheck --error-exitcode 7 \
          "$bin/cuda_kv_fp8_test" --gtest_filter='*AttentionTensorCore*'
      fi
      ;;
    bench)
      step cuda_kv_bench 60 "$bin/cuda_kv_bench" --rows 1,8,64 --keys 4096,131072 --trials 3 \
        --calls 10
      ;;
    decode)
      step "decode fp8 weights, fp8 KV" 90 "$bin/glm-bench-cuda-decode" --dtype fp8 \
        --kv-dtype fp8 --layers 1,2 --batches 1,8,64 --contexts 4096 --steps 8 --graphs on
      ;;
  esac
done
gpu_run_end
