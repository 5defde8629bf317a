#!/usr/bin/env bash
# Decode CUDA graphs, memory planning and the pointer-check switch (issue 4) on a GPU machine,
# over a build made elsewhere (builds nothing). On the CPU machine first:
#   cmake -S . -B build-h7 -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-h7 -j2 --target cuda_graph_test cuda_model_test cuda_backend_test glm-run \
#     engine_golden_test
#   BUILD_DIR=build-h7 STAGE_DIR=.gpurun-h7 \
#     BINS="build-h7/engine/backend/cuda/cuda_graph_test build-h7/engine/backend/cuda/cuda_model_test
#           build-h7/engine/backend/cuda/cuda_backend_test build-h7/engine/glm-run
#           build-h7/engine/engine_golden_test" \
#     tools/gpu/stage_build.sh
#   cp -L /lib/x86_64-linux-gnu/libpcre2-8.so.0 .gpurun-h7/lib/   # glm-run's tokenizer
# then on the GPU machine, from the repo root: tools/gpu/run_graphs_gpu.sh .gpurun-h7
# Steps: cuda_graph_test (graph == eager bitwise at batch 1/3/8 on random weights and the tiny
# fixtures, bucket crossing, scratch-growth recapture, capture/replay counts, memory plan from a
# fraction and its error, decode step time eager with/without pointer checks vs graph);
# cuda_model_test and cuda_backend_test (cuda vs cpu, with graphs on by default);
# engine_golden_test on cuda (the fixtures through the engine and glm-run, graphs on);
# glm-run --report-memory on tiny-sparse (graphs on, then off: same ids); compute-sanitizer
# memcheck of the graph tests (MEMCHECK=0 skips it). Logs in $OUT (or /tmp/glm-graphs-gpu-out);
# summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-h7}" "${OUT:-/tmp/glm-graphs-gpu-out}"
GPU_STEP_GREP="^\[  (PASSED|FAILED) |FAILED  \]|ERROR SUMMARY|decode step|memory plan|random batch|glm-run:"
GPU_STEP_HEAD=30
GPU_STEP_INDENT='   '
step() { gpu_step "$@"; }  # step NAME TIMEOUT_S CMD... (tools/gpu/common.sh; log $out/NAME.log)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step cuda_graph_test 120 "$bin/cuda_graph_test"
step cuda_model_test 90 "$bin/cuda_model_test"
step cuda_backend_test 90 "$bin/cuda_backend_test"
# The golden fixtures through the engine on cuda (decode batches replay graphs by default).
[[ -x $bin/engine_golden_test ]] && step "engine_golden_test cuda" 90 env \
  GLM_RUN_BINARY="$PWD/$bin/glm-run" "$bin/engine_golden_test" --gtest_filter='*cuda*'
fx=$GLM_GOLDEN_DIR/tiny-sparse
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/reference.json'))['prompt_ids'])))")
for g in on off; do
  step "glm-run report-memory graphs=$g" 60 "$bin/glm-run" --backend cuda --model "$fx" \
    --tokens "$ids" --max-tokens 16 --ignore-eos --cuda-graphs $g --gpu-memory-fraction 0.3 \
    --report-memory
done
echo "   greedy ids graphs on/off:"
tail -n 1 "$out/glm-run_report-memory_graphs_on.log" | sed 's/^/     on:  /'
tail -n 1 "$out/glm-run_report-memory_graphs_off.log" | sed 's/^/     off: /'
if [[ ${MEMCHECK:-1} == 1 ]] && command -v compute-sanitizer >/dev/null; then
  step "memcheck cuda_graph_test" ${MEMCHECK_TIMEOUT:-150} compute-sanitizer --tool memcheck --error-exitcode 7 \
    "$bin/cuda_graph_test" --gtest_filter='*RandomModel*:*ScratchGrowth*'
fi
gpu_run_end
