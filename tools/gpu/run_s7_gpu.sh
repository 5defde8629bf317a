#!/usr/bin/env bash
# The seventh session's GPU runs (issue 4) in one call, over the all-tests stage (run_all_gpu.sh's
# header says how to build, stage and pack .gpurun-all; this session's stage also holds
# smallops_bench and read_pattern_bench, and the previous commit's per_head_narrow_bench as
# old/per_head_narrow_bench for the A/B):
# - tests: every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck");
# - kernels: smallops_bench (MoeRoute, redux rounds vs the shuffle rounds before), the W_UV / W_UK
#   per-head kernels before (old/) and after the conflict-free x layout, read_pattern_bench (the
#   GEMV's access pattern vs longer row runs, and the L2 prefetch ahead of o_proj);
# - decode: glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers, graphs on,
#   batch 1 / 8 / 64 at 4K and 128K, --ab moegrid (the MoE decode kernels' balanced grid);
# - profile: the batch-1 and batch-8 per-kernel profile (profile_decode.sh, ncu, eager);
# - router (not in the default): --ab router at batch 1 / 8, 4K (the one-row fp32 router GEMV vs
#   cuBLASLt; batch 8 does not use it: the run's noise).
# From the repo root there (carry .gpurun-pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   tools/gpu/run_s7_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-s7-out). STEPS (default "tests kernels decode profile").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-s7-out}"
steps=${STEPS:-tests kernels decode profile}
GPU_STEP_GREP="^== (decode step|balanced|one-row)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|^\[  (PASSED|FAILED) |rc=|MoeRoute|shuffle|^\| |W_U"
GPU_STEP_HEAD=80
for s in $steps; do
  case $s in
    tests)
      gpu_tests_step
      ;;
    kernels)
      gpu_step "smallops" 120 "$bin/smallops_bench" --calls 100 --trials 5
      gpu_step "per-head-before" 120 "$stage/old/per_head_narrow_bench"
      gpu_step "per-head-after" 120 "$bin/per_head_narrow_bench"
      gpu_step "read-pattern" 120 "$bin/read_pattern_bench" --iters 30
      ;;
    decode)
      gpu_step "decode-ab-moegrid" 330 "$bin/glm-bench-cuda-decode" --dtype fp8 --kv-dtype fp8 \
        --layers 1,6 --batches 1,8,64 --steps 16 --graphs on --contexts 4096,131072 --ab moegrid
      ;;
    profile)
      gpu_profile_step "1 8"
      ;;
    router)
      gpu_step "decode-ab-router" 330 "$bin/glm-bench-cuda-decode" --dtype fp8 --kv-dtype fp8 \
        --layers 1,6 --batches 1,8 --steps 16 --graphs on --contexts 4096,131072 --ab router
      ;;
    *) echo "unknown step $s (tests, kernels, decode, profile, router)" ;;
  esac
done
gpu_run_end
