#!/usr/bin/env bash
# The sixth session's GPU runs (issue 4) in one call, over the all-tests stage (run_all_gpu.sh's
# header says how to build, stage and pack .gpurun-all):
# - every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck");
# - launch_test with its disabled early-start control (does a programmatic launch start before
#   the previous kernel ends, eagerly and in a graph?);
# - glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers, graphs on,
#   --ab shared: the shared expert folded into MoeExperts vs its own three launches, alternating
#   rounds in the same models, at batch 1 / 8 / 64 (--shared-fold-max 64 folds all three);
# - step "big" (not in the default): the same A/B at batch 128 / 256 (eager: graphs stop at 64),
#   to see whether the fold's 64-row limit should be higher;
# - step "mma" (not in the default): --ab mma at batch 128 / 256 / 512, the tensor-core MoE range
#   up to 4096 pairs (the default since this session) vs up to 1024 (before).
# From the repo root there (carry .gpurun-pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   tools/gpu/run_fold_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-fold-out). STEPS (default "tests launch ab") picks parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-fold-out}"
steps=${STEPS:-tests launch ab}
GPU_STEP_GREP="^== (decode step|shared expert|side|programmatic)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|^\[  (PASSED|FAILED) |rc="
GPU_STEP_HEAD=60
dec=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --batches 1,8,64 --steps 16 --graphs on)
for s in $steps; do
  case $s in
    tests)
      gpu_tests_step
      ;;
    launch)
      gpu_step "launch-control" 60 "$bin/launch_test" --gtest_also_run_disabled_tests
      ;;
    ab)
      gpu_step "decode-ab-shared" 330 "$bin/glm-bench-cuda-decode" "${dec[@]}" \
        --contexts 4096,131072 --ab shared --shared-fold-max 64
      ;;
    big)
      gpu_step "decode-ab-shared-big" 330 "$bin/glm-bench-cuda-decode" --dtype fp8 --kv-dtype fp8 \
        --layers 1,6 --batches 128,256 --steps 8 --graphs on --contexts 4096 --ab shared \
        --shared-fold-max 256
      ;;
    mma)
      gpu_step "decode-ab-mma" 330 "$bin/glm-bench-cuda-decode" --dtype fp8 --kv-dtype fp8 \
        --layers 1,6 --batches 128,256,512 --steps 6 --graphs on --contexts 4096 --ab mma
      ;;
    *) echo "unknown step $s (tests, launch, ab, big, mma)" ;;
  esac
done
gpu_run_end
