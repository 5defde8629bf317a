#!/usr/bin/env bash
# Runs the GEMM tests and bench (kernels/gemm_*, quant_fp8_group) on a GPU machine over a build
# made elsewhere. Builds nothing. On the CPU machine first:
#   cmake -S . -B build-h6 -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-h6 -j2 --target quant_fp8_group_test gemm_bf16_test \
#     gemm_fp8_block_test gemm_bench
#   BUILD_DIR=build-h6 STAGE_DIR=.gpurun-h6 BINS="build-h6/kernels/quant_fp8_group_test \
#     build-h6/kernels/gemm_bf16_test build-h6/kernels/gemm_fp8_block_test \
#     build-h6/kernels/gemm_bench" tools/gpu/stage_build.sh
# then carry .gpurun-h6 to the GPU machine and run this from the repo root.
# The binaries link cuBLASLt dynamically (libcublasLt.so.13); if the loader does not find it,
# this looks in the CUDA toolkit and in Python's nvidia-* wheels (torch bundles one).
# Steps: tests (device limits as reported), the fp8 test with the SM count capped to GB10's 48
# (own kernel's split-K plan changes), gemm_bench, compute-sanitizer memcheck on the three tests.
# Logs go to $OUT (or /tmp/glm-gpu-out); a summary is printed last.
# Env: STAGE_DIR (default .gpurun-h6), STEPS (default "tests sm48 bench memcheck").
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/glm-gpu-out}
stage=${STAGE_DIR:-.gpurun-h6}
steps=${STEPS:-tests sm48 bench memcheck}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ -d $stage/bin ]]; then bin=$stage/bin; else bin=build-h6/kernels; fi

source tools/gpu/common.sh
find_cublaslt || echo "libcublasLt.so.13 not found; the GEMM binaries will not start"
summary=()

step() {  # step NAME LOG TIMEOUT_S CMD...
  local name=$1 log=$2 limit=$3
  shift 3
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$out/$log"
  timeout "$limit" "$@" >>"$out/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? (passed|failed)|ERROR SUMMARY|FAILED TEST|max \|err\||^auto for" \
    "$out/$log" | tail -n 6 | sed 's/^/   /'
  return 0
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  >"$out/env.log" 2>&1
cat "$out/env.log"

for s in $steps; do
  case $s in
    tests)
      for t in quant_fp8_group gemm_bf16 gemm_fp8_block; do
        step "$t" "tests-$t.log" 90 "$bin/${t}_test"
      done
      ;;
    sm48)
      step "gemm_fp8_block 48 SMs" sm48.log 60 env GLM_KERNELS_MAX_SMS=48 \
        "$bin/gemm_fp8_block_test" --gtest_filter='*Sweep*:*Tiling*'
      ;;
    memcheck)
      step "memcheck quant_fp8_group" memcheck.log 40 compute-sanitizer --tool memcheck \
        --error-exitcode 7 "$bin/quant_fp8_group_test"
      step "memcheck gemm_fp8_block" memcheck.log 110 compute-sanitizer --tool memcheck \
        --error-exitcode 7 "$bin/gemm_fp8_block_test"
      step "memcheck gemm_bf16" memcheck.log 60 compute-sanitizer --tool memcheck \
        --error-exitcode 7 "$bin/gemm_bf16_test"
      ;;
    bench)
      step "gemm_bench" bench.log 120 "$bin/gemm_bench"
      ;;
  esac
done

echo
echo "== bench"
sed -n '/^device:/,$p' "$out/bench.log" 2>/dev/null
echo "== summary"
printf '%s\n' "${summary[@]}"
