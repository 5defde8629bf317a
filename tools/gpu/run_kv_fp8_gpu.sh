#!/usr/bin/env bash
# fp8 KV cache on the GPU (issue 4; engine/backend/kv_fp8_layout.h), on a GPU machine over a
# build made elsewhere. Builds nothing. On the CPU machine first:
#   cmake -S . -B build-kv -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-kv -j2 --target cuda_kv_fp8_test engine_kv_fp8_test cuda_ops_test \
#     cuda_graph_test cuda_kv_bench glm-bench-cuda-decode
#   BUILD_DIR=build-kv STAGE_DIR=.gpurun-kv BINS="build-kv/engine/backend/cuda/cuda_kv_fp8_test \
#     build-kv/engine/engine_kv_fp8_test build-kv/engine/backend/cuda/cuda_ops_test \
#     build-kv/engine/backend/cuda/cuda_graph_test build-kv/engine/backend/cuda/cuda_kv_bench \
#     build-kv/engine/model/bench/glm-bench-cuda-decode" tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine (carry .gpurun-kv): tools/gpu/run_kv_fp8_gpu.sh
# Steps (each under a time limit; STEPS="tests memcheck bench decode" picks some):
#   tests:    cuda_kv_fp8_test (fp8 writes bit-exact vs the CPU backend, fp8 Attention /
#             IndexerTopK vs the CPU backend), engine_kv_fp8_test (golden fixtures through fp8 KV
#             on cpu and cuda; cuda fp8 vs cpu fp8), the Attention / Indexer cases of
#             cuda_ops_test and cuda_graph_test (the fp32 kernels changed too: SM-sized indexer
#             chunks, the new combine);
#   memcheck: compute-sanitizer memcheck of the bit-exact cases of cuda_kv_fp8_test;
#   bench:    cuda_kv_bench (fp32 vs fp8 IndexerTopK / Attention at batch 1 / 8 / 64, 4K / 128K
#             keys, µs and fraction of a D2D copy);
#   decode:   glm-bench-cuda-decode --dtype fp8 --kv-dtype both (fp8 weights; fp32 vs fp8 KV
#             ms/layer in one process) at batch 1 / 8, contexts 4096 / 131072;
#   ncu:      per-kernel GPU time (gpu__time_duration) of the fp32 and fp8 attention / indexer
#             kernels at batch 1, 4096 keys (cuda_kv_bench --rows 1 --keys 4096).
# Logs in $OUT (or /tmp/glm-kv-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-kv}" "${OUT:-/tmp/glm-kv-out}"
steps=${STEPS:-tests memcheck bench decode ncu}
GPU_STEP_LOG=$out/kv.log
GPU_STEP_GREP="^\[  (PASSED|FAILED) |^\[  FAILED|rel diff|greedy|ERROR SUMMARY|Failure|Expected|Which is|actual|error|^(indexer|attention|write)|D2D|ms/layer|fp8/fp32|^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+"
GPU_STEP_HEAD=150
step() { gpu_step "$@"; }  # step NAME TIMEOUT_S CMD... (tools/gpu/common.sh)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for s in $steps; do
  case $s in
    tests)
      step cuda_kv_fp8_test 40 "$bin/cuda_kv_fp8_test"
      step engine_kv_fp8_test 60 "$bin/engine_kv_fp8_test"
      step "cuda_ops_test Attention/Indexer" 40 "$bin/cuda_ops_test" \
        --gtest_filter='*Attention*:*Indexer*'
      step cuda_graph_test 40 "$bin/cuda_graph_test"
      ;;
    memcheck)
      if command -v compute-sanitizer >/dev/null; then
        step "memcheck cuda_kv_fp8_test BitExact" 40 compute-sanitizer --tool memcheck \
          --error-exitcode 7 "$bin/cuda_kv_fp8_test" --gtest_filter='*BitExact*'
      fi
      ;;
    bench)
      step cuda_kv_bench 60 "$bin/cuda_kv_bench"
      ;;
    decode)
      step "decode fp8 weights, fp32 vs fp8 KV" 150 "$bin/glm-bench-cuda-decode" --dtype fp8 \
        --kv-dtype both --batches 1,8 --contexts 4096,131072 --layers 1,2 --steps 16 --warmup 3 --graphs on
      ;;
    ncu)
      if command -v ncu >/dev/null; then
        step "ncu batch 1, 4096 keys" 90 ncu --metrics gpu__time_duration.sum \
          --kernel-name regex:'Attention|Indexer|WriteLatent|WriteIndex' --launch-count 64 \
          "$bin/cuda_kv_bench" --rows 1 --keys 4096 --trials 1 --calls 1
        grep -E "^  [A-Za-z_].*Kernel|gpu__time_duration" "$out/step.log" | paste - - |
          awk '{print $1, $(NF)}' | sort | uniq -c | head -40
      fi
      ;;
  esac
done
gpu_run_end
