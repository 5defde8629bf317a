#!/usr/bin/env bash
# The tenth session's GPU runs (issue 4: what limits the fp8 weight streams at batch 1) in one
# call, over a stage made as run_all_gpu.sh's header says (a partial stage is fine for the steps
# that need only some binaries):
# - moetest: cuda_moe_test alone (the expectations corrected after the ninth session's flip);
# - widen: tools/gpu/fp8_widen_bench.cu compiled there with nvcc and run (fp8 -> f32 / f16
#   widening methods on a 100 MB stream, against loads only and the D2D copy), and the SASS of
#   its kernels (cuobjdump) for the instruction mix;
# - ncu: Nsight Compute's full set on the batch-1 decode step's fp8 weight streams (the MoE
#   decode kernels and the GEMVs; glm-bench-cuda-decode, 1 layer, eager): pipe utilization,
#   issue slots, stall reasons;
# - tests: every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck");
# - racecheck: compute-sanitizer racecheck on the streamed MoE decode test (the cp.async ring in
#   shared memory);
# - decode: glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers, graphs on,
#   batch 1 / 2 / 8 at 4K and 128K (with AB="--ab NAME" appended when set; this session's:
#   AB="--ab async", the MoE decode kernels' cp.async ring and streamed tasks vs registers);
# - moegrid: the decode step at batch 1 / 2, 4K, --ab moegrid (the balanced MoE decode grid vs
#   every resident CTA, now that the streamed tasks have no per-task restart);
# - moepaths: cuda_ops_bench --only moe; gemv: gemv_bench --fp8-only;
# - profile: the batch-1 per-kernel profile (profile_decode.sh, ncu, eager).
# From the repo root there (carry the pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   STEPS="..." tools/gpu/run_s10_gpu.sh .gpurun-all
# (the session's final run: STEPS="tests racecheck decode moegrid moepaths profile" AB="--ab async")
# Logs in $OUT (default /tmp/glm-s10-out). STEPS (default "moetest widen ncu").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-s10-out}"
steps=${STEPS:-moetest widen ncu}
GPU_STEP_GREP="^== (decode step|MoE decode)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|^\[  (PASSED|FAILED) |rc=|^\| |^moe |GB/s|mismatches"
GPU_STEP_HEAD=80
decode_args=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --steps 16 --graphs on)
for s in $steps; do
  case $s in
    moetest)
      gpu_step "cuda_moe_test" 300 "$bin/cuda_moe_test"
      ;;
    widen)
      gpu_step "widen-build" 120 nvcc -O3 -arch=sm_90a -I. -o "$out/fp8_widen_bench" \
        tools/gpu/fp8_widen_bench.cu
      gpu_step "widen" 120 "$out/fp8_widen_bench"
      cuobjdump -sass "$out/fp8_widen_bench" >"$out/widen.sass" 2>&1
      ;;
    ncu)
      # shellcheck disable=SC2086  # AB: extra bench flags
      gpu_step "ncu-streams" 400 ncu --set full --import-source no \
        -k 'regex:MoeDecodeKernel|GemvNarrowKernel' --launch-skip 6 --launch-count 10 \
        "$bin/glm-bench-cuda-decode" --layers 1 --batches 1 --contexts 4096 --dtype fp8 \
        --kv-dtype fp8 --steps 1 --warmup 1 --graphs off
      ;;
    tests)
      gpu_tests_step
      ;;
    racecheck)
      gpu_step "racecheck-moe-streamed" 300 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$bin/cuda_moe_test" --gtest_filter='*Streamed*:*GraphReplay*'
      ;;
    decode)
      # shellcheck disable=SC2086  # AB: "--ab NAME" or empty
      gpu_step "decode" 330 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
        --batches 1,2,8 --contexts 4096,131072 ${AB:-}
      ;;
    moegrid)
      gpu_step "decode-moegrid" 330 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
        --batches 1,2 --contexts 4096 --ab moegrid
      ;;
    moepaths)
      gpu_moepaths_step
      ;;
    gemv)
      gpu_step "gemv" 120 "$bin/gemv_bench" --fp8-only
      ;;
    profile)
      gpu_profile_step 1
      ;;
    *) echo "unknown step $s (moetest, widen, ncu, tests, racecheck, decode, moegrid, moepaths, gemv, profile)" ;;
  esac
done
gpu_run_end
