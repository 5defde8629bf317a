#!/usr/bin/env bash
# Every GPU check of the tree in one call on a GPU machine, over a build made elsewhere (the
# session's device time is short: one machine start for all of it). Builds nothing. First, here:
#   cmake -S . -B build-gpu -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gpu -j2 --target $(tools/gpu/run_all_gpu.sh --targets)
#   BUILD_DIR=build-gpu STAGE_DIR=.gpurun-all BINS="$(tools/gpu/run_all_gpu.sh --bins build-gpu)" \
#     tools/gpu/stage_build.sh
# then pack it (the test binaries share most bytes: a large xz dictionary packs ~320 MB into ~10 MB,
# under the device tool's 64 MiB transfer limit):
#   mkdir -p .gpurun-pack && tar -cf - .gpurun-all | xz -T1 --lzma2=preset=6,dict=384MiB \
#     > .gpurun-pack/all.tar.xz
# carry .gpurun-pack and run `tar -xJf .gpurun-pack/all.tar.xz && tools/gpu/run_all_gpu.sh
# .gpurun-all` from the repo root there. (Build after the sources stop changing: an object
# compiled while its source was edited looks up to date to ninja; `touch` the sources if unsure.)
# Steps: every GPU test binary (kernels, CUDA backend and heavy ops, graphs, narrow weights,
# sampling, golden fixtures through cuda in fp32 and bf16/fp8), the real-NCCL test through the
# dlopen'd table (torch's libnccl), compute-sanitizer memcheck of the model/graph tests, the
# GLM-5-width decode table (batch 1/8/64, 4K/128K, fp32 vs fp8 KV, graphs on), and the kernel
# benches (sampling, GEMV, small ops, MoE, KV). More steps: eager (graphs off), profile (ncu).
# Logs in $OUT (or /tmp/glm-all-gpu-out); the summary comes last. Env: STEPS (default
# "tests nccl memcheck table bench").
set -uo pipefail
cd "$(dirname "$0")/../.."
tests=(argmax_test rmsnorm_test rope_test silu_mul_test topk_plan_test topk_radix_test
  layernorm_test rows_test moe_route_test sample_test gemm_bf16_test gemm_fp8_block_test
  quant_fp8_group_test gemv_narrow_test cuda_backend_test cublaslt_matmul_test cuda_ops_test
  cuda_moe_test cuda_moe_progress_test cuda_kv_fp8_test cuda_model_test cuda_graph_test cuda_narrow_test
  create_backend_test sample_backend_test engine_golden_test engine_golden_narrow_test
  engine_kv_fp8_test per_head_gemv_test per_head_narrow_test cuda_indexer_test launch_test)
others=(nccl_gpu_test glm-run glm-bench-cuda-decode gemv_bench smallops_bench cuda_ops_bench
  cuda_kv_bench cuda_indexer_bench per_head_narrow_bench)
if [[ ${1:-} == --targets ]]; then
  echo "${tests[@]} ${others[@]}"
  exit 0
fi
if [[ ${1:-} == --bins ]]; then
  for t in "${tests[@]}" "${others[@]}"; do find "$2" -name "$t" -type f -perm -u+x | head -n 1; done |
    tr '\n' ' '
  exit 0
fi
stage=${1:-.gpurun-all}
bin=$stage/bin
out=${OUT:-/tmp/glm-all-gpu-out}
steps=${STEPS:-tests nccl memcheck table bench}
mkdir -p "$out"
source tools/gpu/common.sh
gpu_env "$stage"
export GLM_RUN_BINARY=$PWD/$bin/glm-run
summary=()
# Not gpu_step: the summary line carries each step's last gtest/sanitizer verdict (notes use it).
step() {  # step NAME LOG TIMEOUT_S CMD...
  local name=$1 log=$2 limit=$3
  shift 3
  local t0=$SECONDS
  echo "== $name: $*" >>"$out/$log"
  timeout "$limit" "$@" >>"$out/$log" 2>&1
  local rc=$?
  local last
  last=$(tail -n 200 "$out/$log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY|tests? (passed|failed)" | tail -n 1)
  summary+=("$(printf '%-30s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$last")")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/env.log"
for s in $steps; do
  case $s in
    tests)
      for t in "${tests[@]}"; do step "$t" tests.log 240 "$bin/$t"; done
      ;;
    nccl)
      step nccl_gpu_test nccl.log 120 env BIN="$bin/nccl_gpu_test" OUT="$out" tools/gpu/run_nccl_test.sh
      ;;
    memcheck)
      for t in cuda_graph_test cuda_model_test; do
        step "memcheck $t" memcheck.log 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/$t"
      done
      # The tensor-core attention / indexer kernels and the MoE paths on their small cases.
      step "memcheck cuda_kv_fp8_test TC" memcheck.log 200 compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$bin/cuda_kv_fp8_test" --gtest_filter='*TensorCore*'
      step "memcheck cuda_indexer_test" memcheck.log 200 compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$bin/cuda_indexer_test" --gtest_filter='*SanitizerSubset*'
      step "memcheck cuda_moe_test" memcheck.log 200 compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$bin/cuda_moe_test" --gtest_filter='*Mma*:*Listed*:*RouteExperts*:*Streamed*'
      ;;
    table)
      # The decode-step table of docs/benchmarks.md: fp8 weights, fp32 and fp8 KV in one process,
      # CUDA graphs on.
      step "decode table" table.log 300 "$bin/glm-bench-cuda-decode" --dtype fp8 --kv-dtype both \
        --layers 1,2 --batches 1,8,64 --contexts 4096,131072 --steps 8 --graphs on
      ;;
    eager)
      for kv in fp32 fp8; do
        step "decode eager kv=$kv" table.log 200 "$bin/glm-bench-cuda-decode" --dtype fp8 \
          --kv-dtype "$kv" --layers 1,2 --batches 1,8 --contexts 4096 --steps 8 --graphs off
      done
      ;;
    profile)
      step "profile decode (fp8 KV)" profile.log 150 env OUT="$out/profile" \
        tools/gpu/profile_decode.sh "$stage" "1 8" --kv-dtype fp8
      ;;
    bench)
      step "sample bench" bench.log 120 "$bin/sample_test" --gtest_also_run_disabled_tests \
        --gtest_filter='*Bench*'
      [[ -x $bin/gemv_bench ]] && step gemv_bench bench.log 120 "$bin/gemv_bench" --quick
      [[ -x $bin/smallops_bench ]] && step smallops_bench bench.log 120 "$bin/smallops_bench"
      [[ -x $bin/cuda_ops_bench ]] && step "cuda_ops_bench moe" bench.log 120 \
        "$bin/cuda_ops_bench" --only moe --iters 10
      [[ -x $bin/cuda_kv_bench ]] && step "cuda_kv_bench" bench.log 120 "$bin/cuda_kv_bench" \
        --rows 1,8 --keys 4096,131072 --trials 3
      [[ -x $bin/cuda_indexer_bench ]] && step "cuda_indexer_bench" bench.log 120 \
        "$bin/cuda_indexer_bench" --score-only 1 --rows 1,8,64 --keys 4096,131072 --trials 3
      [[ -x $bin/per_head_narrow_bench ]] && step "per_head_narrow_bench" bench.log 60 \
        "$bin/per_head_narrow_bench"
      ;;
  esac
done
echo "== summary"
printf '%s\n' "${summary[@]}"
