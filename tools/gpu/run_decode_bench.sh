#!/usr/bin/env bash
# Runs glm-bench-cuda-decode (engine/bench/cuda_decode_bench.cc: decode step at GLM-5's layer
# widths vs the HBM roofline) on a GPU machine, over a build made elsewhere. Builds nothing.
# On the CPU machine first:
#   cmake -S . -B build-h10 -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-h10 -j2 --target glm-bench-cuda-decode
#   BUILD_DIR=build-h10 STAGE_DIR=.gpurun-h10 BINS="build-h10/engine/model/bench/glm-bench-cuda-decode" \
#     tools/gpu/stage_build.sh
# then, from the repo root on the GPU machine (carry .gpurun-h10):
#   tools/gpu/run_decode_bench.sh .gpurun-h10 [bench flags, e.g. --dtype bf16]
# The bench reads configs/models/glm-5/config.json (run from the repo root). It needs ~140 GB of
# device memory for the default fp32 run (1- and 2-layer models, batch 64 x 128K KV) and about a
# minute, most of it generating and uploading the random weights. cuBLASLt is not staged: the
# machine's libcublasLt.so.13 is put on LD_LIBRARY_PATH (as run_engine_gpu.sh does).
# Output: stdout and $OUT/${LOG:-decode_bench.log} (OUT default /tmp/glm-decode-bench-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-h10}
shift || true
out=${OUT:-/tmp/glm-decode-bench-out}
log=$out/${LOG:-decode_bench.log}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

source tools/gpu/common.sh  # find_cublaslt

find_cublaslt || echo "libcublasLt.so.13 not found; the bench will fail to start"
export LD_LIBRARY_PATH
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  nproc
  free -g | head -n 2
  git log -1 --format='commit %h %cd' 2>/dev/null
} 2>&1 | tee "$log"
"$stage/bin/glm-bench-cuda-decode" "$@" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
