#!/usr/bin/env bash
# Runs the CUDA backend's tests and the golden fixtures through the CUDA backend on a GPU machine,
# over a build made elsewhere. Builds nothing. On the CPU machine first:
#   cmake -S . -B build-h1 -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-h1 -j2 --target cuda_backend_test create_backend_test cuda_model_test \
#     engine_golden_test glm-run layernorm_test rows_test moe_route_test rmsnorm_test rope_test \
#     silu_mul_test
#   BUILD_DIR=build-h1 STAGE_DIR=.gpurun-h1 BINS="<those binaries>" tools/gpu/stage_build.sh
#   cp -L /lib/x86_64-linux-gnu/libpcre2-8.so.0 .gpurun-h1/lib/   # glm-run's tokenizer needs it
# then, from the repo root on the GPU machine: tools/gpu/run_engine_gpu.sh .gpurun-h1
# cuBLASLt is not staged (0.5 GiB): the machine's own libcublasLt.so.13 is found (ldconfig, the
# CUDA toolkit, or a pip wheel under site-packages/nvidia) and put on LD_LIBRARY_PATH.
# Steps: kernel tests of the ops the backend uses; cuda_backend_test (every op vs the CPU backend);
# create_backend_test; cuda_model_test (the model on random weights, cuda vs cpu);
# engine_golden_test on the cuda backend (fixtures in tests/golden: prompt
# logits, greedy ids, chunked/concurrent/prefix-cache/MTP, glm-run); compute-sanitizer memcheck of
# cuda_model_test, the new kernels' tests and glm-run on one fixture. Logs go to $OUT (or
# /tmp/glm-engine-gpu-out); a summary is printed last.
# Env: STEPS (default "kernels backend golden memcheck"), GOLDEN_FILTER (default '*cuda*').
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-h1}
bin=$stage/bin
out=${OUT:-/tmp/glm-engine-gpu-out}
steps=${STEPS:-kernels backend golden memcheck}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=()

source tools/gpu/common.sh  # find_cublaslt

step() {  # step NAME LOG TIMEOUT_S CMD...
  local name=$1 log=$2 limit=$3
  shift 3
  local t0=$SECONDS
  local first
  first=$(($(cat "$out/$log" 2>/dev/null | wc -l) + 1))
  echo "== $name: $*" | tee -a "$out/$log"
  timeout "$limit" "$@" >>"$out/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-34s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
  tail -n +"$first" "$out/$log" |
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? (passed|failed)|ERROR SUMMARY" |
    head -n 3 | sed 's/^/   /'
  return 0
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  if find_cublaslt; then echo "cublasLt: found"; else echo "cublasLt: NOT FOUND"; fi
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$bin/cuda_backend_test" | grep -E "cublas|not found"
} >"$out/env.log" 2>&1
cat "$out/env.log"
find_cublaslt >/dev/null 2>&1
export LD_LIBRARY_PATH

golden_dir=$PWD/tests/golden
for s in $steps; do
  case $s in
    kernels)
      for t in layernorm rows moe_route rmsnorm rope silu_mul; do
        [[ -x $bin/${t}_test ]] && step "${t}_test" kernels.log 60 "$bin/${t}_test"
      done
      ;;
    backend)
      step cuda_backend_test backend.log 180 "$bin/cuda_backend_test"
      step create_backend_test backend.log 60 "$bin/create_backend_test"
      step cuda_model_test backend.log 120 "$bin/cuda_model_test"
      ;;
    golden)
      step "engine_golden_test ${GOLDEN_FILTER:-*cuda*}" golden.log 240 env \
        GLM_GOLDEN_DIR="$golden_dir" GLM_RUN_BINARY="$PWD/$bin/glm-run" \
        "$bin/engine_golden_test" --gtest_filter="${GOLDEN_FILTER:-*cuda*}"
      ;;
    memcheck)
      if command -v compute-sanitizer >/dev/null; then
        for t in cuda_model_test layernorm_test rows_test moe_route_test; do
          step "memcheck $t" memcheck.log 120 compute-sanitizer --tool memcheck \
            --error-exitcode 7 "$bin/$t"
        done
        fx=$golden_dir/tiny-sparse
        ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/reference.json'))['prompt_ids'])))")
        step "memcheck glm-run tiny-sparse" memcheck.log 120 compute-sanitizer --tool memcheck \
          --error-exitcode 7 "$bin/glm-run" --backend cuda --model "$fx" --tokens "$ids" \
          --max-tokens 8 --ignore-eos
      fi
      ;;
  esac
done

echo
echo "== golden logits (max |diff| / max |logit| vs transformers)"
grep -hE "rel diff" "$out/golden.log" 2>/dev/null
grep -hE "^\[  FAILED  \]" "$out"/*.log 2>/dev/null | sort -u | head -n 40
echo "== summary"
printf '%s\n' "${summary[@]}"
