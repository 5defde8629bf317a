#!/usr/bin/env bash
# Runs the CUDA kernel tests and benchmarks on a GPU machine over a build made elsewhere. Builds
# nothing. On the CPU machine first:
#   cmake -S . -B build-gpu -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gpu -j2 --target topk_plan_test topk_radix_test rmsnorm_test rope_test \
#     silu_mul_test argmax_test topk_radix_bench
#   tools/gpu/stage_build.sh         # stripped binaries + the shared libraries the GPU image
#                                    # lacks -> .gpurun/ (git-ignored)
# then carry .gpurun (or build-gpu plus the libraries) to the GPU machine and run this from the
# repo root.
# Steps: kernel tests (device limits as reported), top-k tests with shared memory capped to
# GB10's 99 KiB, compute-sanitizer memcheck on the top-k test, racecheck on a short top-k case,
# topk_radix_bench (D2D roofline + top-k + small ops), torch.topk on the same shapes.
# Logs go to $OUT (or /tmp/glm-gpu-out); a summary is printed last.
# Env: BIN_DIR (default .gpurun/bin if present, else build-gpu/kernels), STEPS (default "tests cap99k memcheck racecheck bench torch").
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/glm-gpu-out}
steps=${STEPS:-tests cap99k memcheck racecheck bench torch}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.gpurun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
if [[ -d .gpurun/bin ]]; then bin=${BIN_DIR:-.gpurun/bin}; else bin=${BIN_DIR:-build-gpu/kernels}; fi
summary=()

step() {  # step NAME LOG TIMEOUT_S CMD...
  local name=$1 log=$2 limit=$3
  shift 3
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$out/$log"
  timeout "$limit" "$@" >>"$out/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? (passed|failed)|ERROR SUMMARY|FAILED TEST" \
    "$out/$log" | tail -n 4 | sed 's/^/   /'
  return 0
}

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  uname -r
} >"$out/env.log" 2>&1
cat "$out/env.log"

for s in $steps; do
  case $s in
    tests)
      for t in topk_plan rmsnorm rope silu_mul argmax topk_radix; do
        step "$t" tests.log 240 "$bin/${t}_test"
      done
      ;;
    cap99k)
      step "topk_radix cap 99KiB" cap99k.log 240 env GLM_KERNELS_SMEM_CAP_BYTES=101376 \
        "$bin/topk_radix_test"
      step "topk_radix cap 99KiB 48sm" cap99k.log 240 env GLM_KERNELS_SMEM_CAP_BYTES=101376 \
        GLM_KERNELS_MAX_SMS=48 "$bin/topk_radix_test" --gtest_filter='*Rows1M*:*Rows128K*:*PrintsPlans*'
      ;;
    memcheck)
      step "memcheck topk_radix" memcheck.log 300 compute-sanitizer --tool memcheck \
        --error-exitcode 7 "$bin/topk_radix_test"
      step "memcheck small ops" memcheck.log 200 bash -c \
        "for t in rmsnorm rope silu_mul argmax; do compute-sanitizer --tool memcheck --error-exitcode 7 $bin/\${t}_test || exit 7; done"
      ;;
    racecheck)
      step "racecheck topk_radix 2K/128K" memcheck.log 240 compute-sanitizer --tool racecheck \
        --error-exitcode 7 "$bin/topk_radix_test" --gtest_filter='*ShortRows2K*:*Rows128K*'
      ;;
    bench)
      step "topk_radix_bench" bench.log 240 "$bin/topk_radix_bench"
      step "topk_radix_bench gb10-like" bench.log 200 env GLM_KERNELS_SMEM_CAP_BYTES=101376 \
        GLM_KERNELS_MAX_SMS=48 "$bin/topk_radix_bench" --quick
      ;;
    torch)
      step "torch.topk" torch.log 240 python3 tools/gpu/topk_torch_bench.py
      ;;
  esac
done

echo
echo "== bench"
sed -n '/^device:/,$p' "$out/bench.log" 2>/dev/null
echo "== torch"
cat "$out/torch.log" 2>/dev/null | grep -v "^== "
echo "== summary"
printf '%s\n' "${summary[@]}"
