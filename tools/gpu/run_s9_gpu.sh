#!/usr/bin/env bash
# The ninth session's GPU runs (issue 4: the MoE decode kernels in one launch) in one call, over
# the all-tests stage (run_all_gpu.sh's header says how to build, stage and pack .gpurun-all):
# - tests: every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck"),
#   cuda_moe_progress_test among them (the one-launch kernel on two free SMs);
# - decode: glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers, graphs on,
#   batch 1 / 2 / 8 at 4K and 128K with --ab onelaunch (gate|up, down and combine in one launch
#   vs three; off by default, measured slower; batch 8 is past 64 pairs: the run's noise);
# - moepaths: cuda_ops_bench --only moe (every MoE path per call; "auto" vs "auto 1 launch"; bf16
#   now on the token-group kernels at decode sizes), cut off after 90 s;
# - profile: the batch-1 per-kernel profile (profile_decode.sh, ncu, eager).
# From the repo root there (carry .gpurun-pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   tools/gpu/run_s9_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-s9-out). STEPS (default "tests decode moepaths profile").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-s9-out}"
steps=${STEPS:-tests decode moepaths profile}
GPU_STEP_GREP="^== (decode step|MoE decode)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|^\[  (PASSED|FAILED) |rc=|^\| |^moe |^one-launch"
GPU_STEP_HEAD=80
decode_args=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --steps 16 --graphs on)
for s in $steps; do
  case $s in
    tests)
      gpu_tests_step
      ;;
    decode)
      gpu_step "decode-ab-onelaunch" 330 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
        --batches 1,2,8 --contexts 4096,131072 --ab onelaunch
      ;;
    moepaths)
      gpu_moepaths_step
      ;;
    profile)
      gpu_profile_step 1
      ;;
    *) echo "unknown step $s (tests, decode, moepaths, profile)" ;;
  esac
done
gpu_run_end
