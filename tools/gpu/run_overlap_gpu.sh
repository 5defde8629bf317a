#!/usr/bin/env bash
# The decode-step overlap work of the fifth session (issue 4) on a GPU machine, one call, over the
# all-tests stage (run_all_gpu.sh's header says how to build, stage and pack .gpurun-all):
# - every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck");
# - glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers (ms/layer over five
#   layers: the 1-vs-2 difference moved by +-10 % between model instances), graphs on, three
#   A/B runs: --ab side (the KV path's side branch, alternating rounds in the same models; its main
#   table is the all-on figure), --ab pdl (programmatic dependent launch, the same way) and
#   --fused both (fused Linears; models loaded both ways, so noisier).
# From the repo root there (carry .gpurun-pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   tools/gpu/run_overlap_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-overlap-out); ~7 minutes. STEPS (default "tests ab") picks parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-overlap-out}"
steps=${STEPS:-tests ab}
GPU_STEP_GREP="^== (decode step|KV-path|programmatic|fused)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|rc="
GPU_STEP_HEAD=60
dec=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --batches 1,8,64 --steps 16 --graphs on)
for s in $steps; do
  case $s in
    tests)
      gpu_tests_step
      ;;
    ab)
      gpu_step "decode-ab-side" 300 "$bin/glm-bench-cuda-decode" "${dec[@]}" \
        --contexts 4096,131072 --ab side
      gpu_step "decode-ab-pdl" 200 "$bin/glm-bench-cuda-decode" "${dec[@]}" --contexts 4096 \
        --ab pdl
      gpu_step "decode-fused-both" 300 "$bin/glm-bench-cuda-decode" "${dec[@]}" \
        --contexts 4096 --fused both
      ;;
    *) echo "unknown step $s (tests, ab)" ;;
  esac
done
gpu_run_end
