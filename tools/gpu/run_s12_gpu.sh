#!/usr/bin/env bash
# The twelfth session's GPU runs (issue 4: RmsNorm inside the decode GEMV, Backend::RmsNormLinear)
# in one call, over a stage made as run_all_gpu.sh's header says (a partial stage is fine for the
# steps that need only some binaries):
# - normtest: the fused norm's tests alone (gemv_narrow_test's and per_head_gemv_test's
#   *FusedRmsNorm* cases, cuda_narrow_test's RmsNormLinear case), then compute-sanitizer memcheck
#   on each and racecheck on the first two;
# - tests: every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck");
# - decode: glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers, graphs on,
#   BATCHES (default 1,2,8) at 4K and 128K, one process per A/B name in ABS (default "normfuse";
#   this session's: normfuse, gemvpf);
# - gemv: gemv_bench --quick (the GEMV alone at GLM-5 shapes);
# - profile: the batch-1 per-kernel profile at 4K (profile_decode.sh, ncu, eager).
# From the repo root there (carry the pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   STEPS="..." tools/gpu/run_s12_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-s12-out). STEPS (default "normtest decode").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-s12-out}"
steps=${STEPS:-normtest decode}
GPU_STEP_GREP="^== (decode step|summary)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|^\[  (PASSED|FAILED) |rc=|^\| |ERROR SUMMARY|RACECHECK SUMMARY"
GPU_STEP_HEAD=120
decode_args=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --steps 16 --graphs on)
norm_filter='*FusedRmsNorm*:*RmsNormLinear*'
for s in $steps; do
  case $s in
    normtest)
      # racecheck on our kernels' tests only: cuda_narrow_test's 64-row case runs cuBLASLt, whose
      # own kernels (nvjet_sm90_*) racecheck reports hazards in.
      for t in gemv_narrow_test per_head_gemv_test cuda_narrow_test; do
        gpu_step "$t-norm" 300 "$bin/$t" --gtest_filter="$norm_filter"
        gpu_step "memcheck-$t-norm" 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
          "$bin/$t" --gtest_filter="$norm_filter"
        [[ $t == cuda_narrow_test ]] && continue
        gpu_step "racecheck-$t-norm" 400 compute-sanitizer --tool racecheck --error-exitcode 9 \
          "$bin/$t" --gtest_filter="$norm_filter"
      done
      ;;
    tests)
      gpu_tests_step
      ;;
    decode)
      for ab in ${ABS:-normfuse}; do
        gpu_step "decode-$ab" 330 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
          --batches "${BATCHES:-1,2,8}" --contexts 4096,131072 --ab "$ab"
      done
      ;;
    gemv)
      gpu_step "gemv_bench" 300 "$bin/gemv_bench" --quick
      ;;
    profile)
      gpu_profile_step 1
      ;;
    *) echo "unknown step $s (normtest, tests, decode, gemv, profile)" ;;
  esac
done
gpu_run_end
