#!/usr/bin/env bash
# The eighth session's GPU runs (issue 4: fewer launches on the batch-1 critical path) in one call,
# over the all-tests stage (run_all_gpu.sh's header says how to build, stage and pack
# .gpurun-all; this session's stage also holds the previous session's glm-bench-cuda-decode as
# old/glm-bench-cuda-decode for the old-vs-new A/B):
# - tests: every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck");
# - decode: glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers, graphs on,
#   batch 1 / 2 / 8 at 4K and 128K with --ab fuseroute (routing inside the MoE gate|up decode
#   kernel; batch 8 does not fuse: the run's noise);
# - (removed: ukside, --ab ukside at batch 1 / 8, W_UK on a side branch during the indexer: 1-2 %
#   slower, so the code went too; this script at commit 5a7c7d2 runs it);
# - moepaths (not in the default): cuda_ops_bench --only moe (every MoE path per call at batch 1,
#   8, ...: the decode kernels vs the token-group kernels' cp.async ring), cut off after 90 s;
# - oldnew: the previous session's bench binary and this one alternately (old, new, old, new) at
#   batch 1 / 8, 4K: every change of the session together, the RoPE merge included (no knob);
# - profile: the batch-1 per-kernel profile (profile_decode.sh, ncu, eager).
# From the repo root there (carry .gpurun-pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   tools/gpu/run_s8_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-s8-out). STEPS (default "tests decode oldnew profile").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-s8-out}"
steps=${STEPS:-tests decode oldnew profile}
GPU_STEP_GREP="^== (decode step|MoE routing)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|^\[  (PASSED|FAILED) |rc=|^\| |^moe "
GPU_STEP_HEAD=80
decode_args=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --steps 16 --graphs on)
for s in $steps; do
  case $s in
    tests)
      gpu_tests_step
      ;;
    decode)
      gpu_step "decode-ab-fuseroute" 330 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
        --batches 1,2,8 --contexts 4096,131072 --ab fuseroute
      ;;
    moepaths)
      gpu_moepaths_step
      ;;
    oldnew)
      for round in 1 2; do
        gpu_step "decode-old-$round" 120 "$stage/old/glm-bench-cuda-decode" "${decode_args[@]}" \
          --batches 1,8 --contexts 4096
        gpu_step "decode-new-$round" 120 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
          --batches 1,8 --contexts 4096
      done
      ;;
    profile)
      gpu_profile_step 1
      ;;
    *) echo "unknown step $s (tests, decode, moepaths, oldnew, profile)" ;;
  esac
done
gpu_run_end
