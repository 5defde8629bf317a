# shellcheck shell=bash
# Sourced by tools/gpu/run_all_gpu.sh (from the repo root).

# find_cublaslt: the binaries link cuBLASLt dynamically (libcublasLt.so.13, ~0.5 GiB, never
# staged); put the GPU machine's own copy on LD_LIBRARY_PATH: the loader cache, the CUDA toolkit,
# Python's nvidia-* wheels (torch bundles one), then a file-system search. Returns 1 when none.
find_cublaslt() {
  ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so.13 ' && return 0
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    if [[ -e $d/libcublasLt.so.13 ]]; then
      LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      export LD_LIBRARY_PATH
      return 0
    fi
  done
  local f
  f=$(python3 - <<'PY' 2>/dev/null
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for r in roots:
    for f in glob.glob(r + "/nvidia/**/libcublasLt.so.13*", recursive=True):
        print(f); raise SystemExit
PY
  )
  [[ -z $f ]] && f=$(find / -xdev -name 'libcublasLt.so.13*' 2>/dev/null | head -n 1)
  [[ -z $f ]] && return 1
  LD_LIBRARY_PATH=$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
}

# nvlink_multicast_off: NVLink multicast (NVLS) stays off in every process these scripts start;
# the lent multi-GPU machines must not use it (nothing here calls cuMulticastCreate either).
nvlink_multicast_off() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

# gpu_env STAGE: the environment the staged binaries need (call from the repo root): the staged
# libraries (STAGE/lib) first on LD_LIBRARY_PATH, the machine's cuBLASLt (find_cublaslt; a
# warning when missing), GLM_GOLDEN_DIR = tests/golden, GLM_RUN_BINARY = STAGE/bin/glm-run,
# NVLink multicast off (nvlink_multicast_off).
gpu_env() {
  local stage=$1
  nvlink_multicast_off
  export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  find_cublaslt || echo "libcublasLt.so.13 not found; the CUDA binaries will fail to start"
  export LD_LIBRARY_PATH
  export GLM_GOLDEN_DIR=$PWD/tests/golden
  export GLM_RUN_BINARY=$PWD/$stage/bin/glm-run
}

# gpu_step NAME LOG LIMIT_S CMD...: runs CMD under `timeout LIMIT_S`, appending a "== NAME: CMD"
# header and CMD's output to $out/LOG. Prints the header and the lines of this run that match
# GPU_STEP_GREP (extended regex; unset or empty: none), at most GPU_STEP_HEAD (default 80) of
# them, and appends "NAME rc=RC SECONDSs VERDICT" to the caller's `summary` array (VERDICT: the
# run's last gtest / compute-sanitizer verdict line; rc 124 is a timeout). With GPU_STEP_BUDGET
# set (a wall-clock budget in s, against $SECONDS) a step that would start with < 5 s left is
# skipped and limits are clipped to what is left. The caller sets $out. Returns CMD's status.
gpu_step() {
  # shellcheck disable=SC2154  # out: set by the caller
  local name=$1 log=$out/$2 limit=$3
  shift 3
  if [[ -n ${GPU_STEP_BUDGET:-} ]]; then
    local left=$((GPU_STEP_BUDGET - SECONDS))
    if ((left < 5)); then
      summary+=("$(printf '%-40s skipped (budget)' "$name")")
      return 0
    fi
    ((limit > left)) && limit=$left
  fi
  touch "$log"
  local t0=$SECONDS first rc verdict
  first=$(($(wc -l <"$log") + 2))
  echo "== $name: $*" | tee -a "$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  rc=$?
  if [[ -n ${GPU_STEP_GREP:-} ]]; then
    tail -n +"$first" "$log" | grep -E "$GPU_STEP_GREP" | head -n "${GPU_STEP_HEAD:-80}"
  fi
  verdict=$(tail -n +"$first" "$log" |
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY|RACECHECK SUMMARY|tests? (passed|failed)" |
    tail -n 1)
  ((rc == 124)) && verdict="TIMEOUT after ${limit}s; $verdict"
  summary+=("$(printf '%-40s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$verdict")")
  return "$rc"
}
