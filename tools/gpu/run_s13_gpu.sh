#!/usr/bin/env bash
# The thirteenth session's GPU runs (issue 4) in one call, over a stage made as run_all_gpu.sh's
# header says (a partial stage is fine for the steps that need only some binaries):
# - timeline: the decode step's graph replays traced kernel by kernel (kernel_timeline.sh: CUPTI
#   activity records, programmatic-launch overlap included), glm-bench-cuda-decode at GLM-5
#   widths, fp8 weights and KV, 1 vs 6 layers, one process per shape in SHAPES (default
#   "1x4096 1x131072"); full timelines in $OUT/timeline-BxC.txt, the per-kernel table printed
#   (KEEP_CSV=1: the raw traces too, $OUT/trace-BxC.csv.xz);
# - decode: glm-bench-cuda-decode, BATCHES (default 1,2,8) at 4K and 128K, one process per A/B
#   name in ABS (default "none": the plain table);
# - qtests: the test binaries in QTESTS (default "per_head_gemv_test cuda_moe_test cuda_ops_test");
# - tests: every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck").
# From the repo root there (carry the pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   STEPS="..." tools/gpu/run_s13_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-s13-out). STEPS (default "timeline").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-s13-out}"
steps=${STEPS:-timeline}
decode_grep="^== (decode step|summary)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)"
decode_args=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --steps 16 --graphs on)
for s in $steps; do
  case $s in
    timeline)
      for shape in ${SHAPES:-1x4096 1x131072}; do
        b=${shape%x*} c=${shape#*x}
        GPU_STEP_GREP="$decode_grep|^kernel_(trace|timeline)|^== sequence|^-- per kernel|^ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+  |summed adds" \
          GPU_STEP_HEAD=${TIMELINE_HEAD:-70} GPU_STEP_FILE=$out/timeline-${shape}.txt \
          gpu_step "timeline-$shape" 300 tools/gpu/kernel_timeline.sh "/tmp/trace-$shape.csv" \
          "$bin/glm-bench-cuda-decode" "${decode_args[@]}" --batches "$b" --contexts "$c"
        [[ ${KEEP_CSV:-0} == 1 ]] && xz -T4 -c "/tmp/trace-$shape.csv" >"$out/trace-$shape.csv.xz"
      done
      ;;
    decode)
      for ab in ${ABS:-none}; do
        extra=()
        [[ $ab != none ]] && extra=(--ab "$ab")
        GPU_STEP_GREP=$decode_grep gpu_step "decode-$ab" 330 "$bin/glm-bench-cuda-decode" \
          "${decode_args[@]}" --batches "${BATCHES:-1,2,8}" --contexts 4096,131072 "${extra[@]}"
      done
      ;;
    qtests)
      for t in ${QTESTS:-per_head_gemv_test cuda_moe_test cuda_ops_test}; do
        GPU_STEP_GREP="^\[  (PASSED|FAILED) |^\[  FAILED|tests? ran" gpu_step "$t" 300 "$bin/$t"
      done
      ;;
    tests)
      gpu_tests_step
      ;;
    *) echo "unknown step $s (qtests, timeline, decode, tests)" ;;
  esac
done
gpu_run_end
