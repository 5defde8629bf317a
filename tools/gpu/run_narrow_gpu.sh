#!/usr/bin/env bash
# bf16 / fp8 block-scaled weights on the CUDA backend (issue 4, --dtype), on a GPU machine over a
# build made elsewhere. Builds nothing. On the CPU machine first:
#   cmake -S . -B build-h8 -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-h8 -j2 --target cuda_narrow_test engine_golden_narrow_test glm-run
#   BUILD_DIR=build-h8 STAGE_DIR=.gpurun-h8 BINS="build-h8/engine/backend/cuda/cuda_narrow_test \
#     build-h8/engine/engine_golden_narrow_test build-h8/engine/glm-run" tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine: tools/gpu/run_narrow_gpu.sh .gpurun-h8
# Steps: cuda_narrow_test (Linear bf16/fp8 and MoeExperts bf16/fp8 vs the CPU backend on the
# dequantized weights); engine_golden_narrow_test (every golden fixture through cuda with bf16
# weights, tiny-fp8 with auto = e4m3 kept: prompt logits vs transformers, greedy ids, divergence
# margins, weight bytes per dtype); glm-run --dtype auto on tiny-fp8; compute-sanitizer memcheck
# of cuda_narrow_test and of glm-run --dtype auto / bf16. Logs in $OUT (or /tmp/glm-narrow-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-h8}
bin=$stage/bin
out=${OUT:-/tmp/glm-narrow-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
source tools/gpu/common.sh
find_cublaslt || echo "libcublasLt.so.13 not found; the CUDA binaries will fail to start"
golden=$PWD/tests/golden
summary=()
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$out/narrow.log"
  timeout "$limit" "$@" >"$out/step.log" 2>&1
  local rc=$?
  cat "$out/step.log" >>"$out/narrow.log"
  grep -E "^\[  (PASSED|FAILED) |rel diff|greedy|weights |max \|gpu|ERROR SUMMARY|^[0-9,]+$" \
    "$out/step.log" | head -n 80
  summary+=("$(printf '%-44s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step cuda_narrow_test 120 "$bin/cuda_narrow_test"
step engine_golden_narrow_test 240 env GLM_GOLDEN_DIR="$golden" \
  "$bin/engine_golden_narrow_test"
fx=$golden/tiny-fp8
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/reference.json'))['prompt_ids'])))")
echo "reference greedy: $(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/reference.json'))['greedy_ids'])))")"
step "glm-run --dtype auto tiny-fp8" 60 "$bin/glm-run" --backend cuda --dtype auto \
  --model "$fx" --tokens "$ids" --max-tokens 32 --ignore-eos
if command -v compute-sanitizer >/dev/null; then
  step "memcheck cuda_narrow_test" 240 compute-sanitizer --tool memcheck --error-exitcode 7 \
    "$bin/cuda_narrow_test"
  for dt in auto bf16; do
    step "memcheck glm-run --dtype $dt tiny-fp8" 120 compute-sanitizer --tool memcheck \
      --error-exitcode 7 "$bin/glm-run" --backend cuda --dtype $dt --model "$fx" --tokens "$ids" \
      --max-tokens 8 --ignore-eos
  done
else
  summary+=("memcheck: compute-sanitizer not found")
fi
grep -hE "^\[  FAILED  \]" "$out/narrow.log" | sort -u | head -n 40
echo "== summary"
printf '%s\n' "${summary[@]}"
