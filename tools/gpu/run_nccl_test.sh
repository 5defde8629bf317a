#!/usr/bin/env bash
# Runs engine/dist's real-NCCL test (nccl_gpu_test: a 1-rank all-reduce on device memory through
# the FunctionTable, and an n-rank one plus bandwidth figures when 2+ GPUs are visible) on a GPU
# machine, over a staged build (tools/gpu/stage_build.sh; run_all_gpu.sh's "nccl" step calls
# this). Builds nothing. The binary links neither NCCL nor CUDA: it dlopens libnccl.so.2
# (GLM_NCCL_LIBRARY) and the CUDA runtime (GLM_CUDART_LIBRARY); unless those are set it uses the
# copies bundled with torch (the nvidia-nccl / nvidia-cuda-runtime wheels under site-packages),
# else the CUDA toolkit's cudart. nccl_gpu_test builds without CUDA too:
#   cmake --build build-gpu -j2 --target nccl_gpu_test
#   BINS=build-gpu/engine/dist/nccl_gpu_test STAGE_DIR=.gpurun-nccl tools/gpu/stage_build.sh
# Env: STAGE_DIR (default .gpurun-all), BIN (default $STAGE_DIR/bin/nccl_gpu_test).
# Log: $OUT/nccl_gpu_test.log (OUT default /tmp/glm-gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-/tmp/glm-gpu-out}
stage=${STAGE_DIR:-.gpurun-all}
mkdir -p "$out"
bin=${BIN:-$stage/bin/nccl_gpu_test}
[[ -x $bin ]] || { echo "no test binary at $bin (see the header of $0)"; exit 2; }
export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
nvlink_multicast_off

# First file named like $1 under the Python environment's site-packages.
find_in_site_packages() {
  local dirs
  dirs=$(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  local d
  for d in $dirs; do
    [[ -d $d ]] || continue
    find "$d" -name "$1" \( -type f -o -type l \) 2>/dev/null | sort | head -n 1
  done | head -n 1
}

if [[ -z ${GLM_NCCL_LIBRARY:-} ]]; then
  # The nvidia-nccl wheel's package dir first (namespace package: use __path__), then any copy.
  GLM_NCCL_LIBRARY=$(python3 -c 'import nvidia.nccl, glob, os; print((glob.glob(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so*")) or [""])[0])' 2>/dev/null)
  [[ -n $GLM_NCCL_LIBRARY ]] || GLM_NCCL_LIBRARY=$(find_in_site_packages 'libnccl.so*')
fi
if [[ -z ${GLM_CUDART_LIBRARY:-} ]]; then
  GLM_CUDART_LIBRARY=$(find_in_site_packages 'libcudart.so*')
  [[ -n $GLM_CUDART_LIBRARY ]] || GLM_CUDART_LIBRARY=$(find /usr/local/cuda/lib64 -maxdepth 1 -name "libcudart.so*" 2>/dev/null | sort | head -n 1)
fi
export GLM_NCCL_LIBRARY GLM_CUDART_LIBRARY
echo "GLM_NCCL_LIBRARY=${GLM_NCCL_LIBRARY:-<not found>}"
echo "GLM_CUDART_LIBRARY=${GLM_CUDART_LIBRARY:-<not found>}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 300 "$bin" 2>&1 | tee "$out/nccl_gpu_test.log"
rc=${PIPESTATUS[0]}
grep -qE "^\[  SKIPPED \] [0-9]+ test" "$out/nccl_gpu_test.log" && echo "note: some tests skipped (reasons above)"
exit "$rc"
