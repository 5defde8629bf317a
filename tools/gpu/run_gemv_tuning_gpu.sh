#!/usr/bin/env bash
# One GPU call for the decode GEMV's latency knobs (kernels/gemv_narrow, GemvNarrowTuning), over a
# build made elsewhere. Builds nothing. On the CPU machine first:
#   cmake --build build-gemv -j2 --target gemv_narrow_test gemv_bench cuda_narrow_test \
#     cuda_graph_test engine_golden_narrow_test glm-bench-cuda-decode
#   BUILD_DIR=build-gemv STAGE_DIR=.gpurun-gemv BINS="build-gemv/kernels/gemv_narrow_test \
#     build-gemv/kernels/gemv_bench build-gemv/engine/backend/cuda/cuda_narrow_test \
#     build-gemv/engine/backend/cuda/cuda_graph_test build-gemv/engine/engine_golden_narrow_test \
#     build-gemv/engine/model/bench/glm-bench-cuda-decode" tools/gpu/stage_build.sh
#   mkdir -p .gpurun-gemv.pack && tar -cf - .gpurun-gemv | xz -T2 -6 > .gpurun-gemv.pack/x.tar.xz
# then on the GPU machine (carry .gpurun-gemv.pack), repo root: tools/gpu/run_gemv_tuning_gpu.sh
# (~65 s on an H200). Steps: the four tests and the memcheck of gemv_narrow_test's small cases in
# parallel (their host references are CPU-bound), gemv_bench --fp8-only alone (every knob A/B and
# the previous kernel in one process), then glm-bench-cuda-decode with the default knobs and with
# GLM_GEMV_TUNING=previous while BUDGET (s, default 130) lasts. Logs in $OUT (/tmp/gemvout).
set -uo pipefail
cd "$(dirname "$0")/../.."
budget=${BUDGET:-130}
t0=$SECONDS
left() { echo $((budget - (SECONDS - t0))); }
[[ -f .gpurun-gemv.pack/x.tar.xz ]] && tar -xJf .gpurun-gemv.pack/x.tar.xz
source tools/gpu/common.sh
gpu_env .gpurun-gemv
bin=.gpurun-gemv/bin
out=${OUT:-/tmp/gemvout}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
L=$(($(left) < 45 ? $(left) : 45))
(timeout $L $bin/gemv_narrow_test >$out/t_gemv.log 2>&1; echo "gemv_narrow_test rc=$?" >>$out/t_gemv.log) &
(timeout $L $bin/cuda_narrow_test >$out/t_narrow.log 2>&1; echo "cuda_narrow_test rc=$?" >>$out/t_narrow.log) &
(timeout $L $bin/cuda_graph_test >$out/t_graph.log 2>&1; echo "cuda_graph_test rc=$?" >>$out/t_graph.log) &
(timeout $L $bin/engine_golden_narrow_test >$out/t_golden.log 2>&1
  echo "engine_golden_narrow_test rc=$?" >>$out/t_golden.log) &
(timeout $L compute-sanitizer --tool memcheck --error-exitcode 7 $bin/gemv_narrow_test \
  --gtest_filter='*ActivationNumerics*:*NonFinite*:*Deterministic*:*Overlapped*:*Rejects*' \
  >$out/t_memcheck.log 2>&1; echo "memcheck rc=$?" >>$out/t_memcheck.log) &
wait
for f in "$out"/t_*.log; do
  grep -hE "rc=|^\[  (PASSED|FAILED) |FAILED  \]|ERROR SUMMARY|Failure" "$f" | head -n 25
done
L=$(($(left) < 40 ? $(left) : 40))
if ((L > 8)); then
  timeout $L $bin/gemv_bench --fp8-only >$out/bench.log 2>&1
  echo "gemv_bench rc=$? at $((SECONDS - t0))s"
  cat "$out/bench.log"
fi
for tun in default previous; do
  L=$(left)
  ((L > 20)) || continue
  echo "== glm-bench-cuda-decode GLM_GEMV_TUNING=$tun"
  env $([[ $tun == previous ]] && echo GLM_GEMV_TUNING=previous) timeout $L \
    $bin/glm-bench-cuda-decode --dtype fp8 --kv-dtype fp8 --layers 1,2 --batches 1,8 \
    --contexts 4096 --steps 8 --graphs on >$out/decode_$tun.log 2>&1
  echo "rc=$? at $((SECONDS - t0))s"
  grep -A3 "ms/layer from 1 vs 2" "$out/decode_$tun.log"
done
