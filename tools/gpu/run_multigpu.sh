#!/usr/bin/env bash
# TP over NCCL between GPUs, on a machine with 2+ GPUs (the nvidia-h100-x2 / -x4 kinds), over a
# staged build (tools/gpu/stage_build.sh; run_all_gpu.sh's "multigpu" step calls this). Builds
# nothing. Runs, each under a timeout:
#   nccl_gpu_test         the FunctionTable's all-reduce across every visible GPU (+ bandwidth)
#   engine_nccl_gpu_test  TP 2 over NCCL = the single-GPU greedy tokens on the golden fixtures,
#                         two ranks on one GPU take the host path, a killed rank fails the head
#                         within seconds
# The binaries link neither NCCL nor CUDA's runtime directly for NCCL: GLM_NCCL_LIBRARY names
# libnccl.so.2 (default: the nvidia-nccl wheel torch bundles, else any copy under site-packages).
# On the CPU machine:
#   cmake --build build-gpu -j2 --target nccl_gpu_test engine_nccl_gpu_test
#   BUILD_DIR=build-gpu STAGE_DIR=.gpurun-multi BINS="$(find build-gpu -type f \( -name \
#     nccl_gpu_test -o -name engine_nccl_gpu_test \) | tr '\n' ' ')" tools/gpu/stage_build.sh
# (the transport rule and the stage groups around it are CPU tests: pipeline.tp_transport_test.)
# then on the GPU machine, from the repo root: tools/gpu/run_multigpu.sh .gpurun-multi
# Env: OUT (logs; default /tmp/glm-gpu-out), NCCL_DEBUG (default WARN). NVLink multicast stays
# off (gpu_env: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
stage=${1:-${STAGE_DIR:-.gpurun-all}}
bin=$stage/bin
out=${OUT:-/tmp/glm-gpu-out}
mkdir -p "$out"
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
[[ -d $bin ]] || { echo "no staged binaries in $bin (see the header of $0)"; exit 2; }
gpu_env "$stage"

if [[ -z ${GLM_NCCL_LIBRARY:-} ]]; then
  GLM_NCCL_LIBRARY=$(python3 -c 'import nvidia.nccl, glob, os; print((glob.glob(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so*")) or [""])[0])' 2>/dev/null)
fi
if [[ -z ${GLM_CUDART_LIBRARY:-} ]]; then
  GLM_CUDART_LIBRARY=$(python3 -c 'import nvidia.cuda_runtime, glob, os; print((glob.glob(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib", "libcudart.so*")) or [""])[0])' 2>/dev/null)
  [[ -n $GLM_CUDART_LIBRARY ]] || GLM_CUDART_LIBRARY=$(find /usr/local/cuda/lib64 -maxdepth 1 -name "libcudart.so*" 2>/dev/null | sort | head -n 1)
fi
export GLM_NCCL_LIBRARY GLM_CUDART_LIBRARY
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
echo "GLM_NCCL_LIBRARY=${GLM_NCCL_LIBRARY:-<not found>}"
echo "GLM_CUDART_LIBRARY=${GLM_CUDART_LIBRARY:-<not found>}"
nvidia-smi -L 2>/dev/null
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
((gpus >= 2)) || echo "note: $gpus GPU(s) visible; the 2-GPU tests skip (use a -x2 or -x4 kind)"

summary=()
verdict_grep='^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|GB/s|TP 2 over NCCL|request ended'
for t in nccl_gpu_test engine_nccl_gpu_test; do
  if [[ ! -x $bin/$t ]]; then
    summary+=("$(printf '%-40s not staged' "$t")")
    continue
  fi
  GPU_STEP_GREP=$verdict_grep gpu_step "$t" multigpu.log 500 "$bin/$t"
done
echo "== summary"
printf '%s\n' "${summary[@]}"
grep -q "FAILED\|rc=[1-9]" <(printf '%s\n' "${summary[@]}") && exit 1
exit 0
