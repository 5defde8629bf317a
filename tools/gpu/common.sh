# Sourced by the tools/gpu/run_*.sh scripts (from the repo root).
#
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

# gpu_env STAGE: the environment every run_*.sh sets up (call from the repo root, after sourcing
# this file): the staged libraries (STAGE/lib) first on LD_LIBRARY_PATH, the machine's cuBLASLt
# (find_cublaslt; a warning when missing), GLM_GOLDEN_DIR = tests/golden.
gpu_env() {
  local stage=$1
  export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  find_cublaslt || echo "libcublasLt.so.13 not found; the CUDA binaries will fail to start"
  export LD_LIBRARY_PATH
  export GLM_GOLDEN_DIR=$PWD/tests/golden
}

# gpu_step NAME TIMEOUT_S CMD...: runs CMD under `timeout`, keeps its output in a log, prints the
# lines worth reading and appends "NAME rc=RC SECONDSs" to the caller's `summary` array. The
# caller sets $out (the output folder) and these shell variables (read at each call):
#   GPU_STEP_LOG     set: one log for all steps; the "== NAME: CMD" header also goes to stdout,
#                    CMD's output goes to $out/step.log (shown from there) and is appended to it.
#                    unset: one log per step, $out/NAME.log (' ', '/', '=' in NAME become '_'),
#                    the header only in the log.
#   GPU_STEP_APPEND  (per-step logs) 1: append to an existing log; else start it afresh.
#   GPU_STEP_FILE    (per-step logs) this log file instead of $out/NAME.log (appended to).
#   GPU_STEP_GREP    extended regex of the lines to print (empty: none);
#   GPU_STEP_HEAD    at most this many of them (default 120); GPU_STEP_INDENT prefixes each.
#   GPU_STEP_WIDTH   width of the name column in the summary line (default 40).
#   GPU_STEP_BUDGET  set: a wall-clock budget (s, against $SECONDS): a step that would start with
#                    < 5 s left is skipped ("skipped (budget)"), limits are clipped to what is left.
#   GPU_STEP_AFTER   set: a function called as AFTER NAME RC SECONDS LOGFILE after the step.
gpu_step() {
  local name=$1 limit=$2
  shift 2
  local width=${GPU_STEP_WIDTH:-40}
  if [[ -n ${GPU_STEP_BUDGET:-} ]]; then
    local left=$((GPU_STEP_BUDGET - SECONDS))
    if ((left < 5)); then
      summary+=("$(printf "%-${width}s skipped (budget)" "$name")")
      return
    fi
    ((limit > left)) && limit=$left
  fi
  local t0=$SECONDS log rc
  if [[ -n ${GPU_STEP_LOG:-} ]]; then
    echo "== $name: $*" | tee -a "$GPU_STEP_LOG"
    timeout "$limit" "$@" >"$out/step.log" 2>&1
    rc=$?
    cat "$out/step.log" >>"$GPU_STEP_LOG"
    log=$out/step.log
  else
    if [[ -n ${GPU_STEP_FILE:-} ]]; then
      log=$GPU_STEP_FILE
      echo "== $name: $*" >>"$log"
    else
      log=$out/$(echo "$name" | tr ' /=' '___').log
      if [[ ${GPU_STEP_APPEND:-0} == 1 ]]; then
        echo "== $name: $*" >>"$log"
      else
        echo "== $name: $*" >"$log"
      fi
    fi
    timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
  fi
  if [[ -n ${GPU_STEP_GREP:-} ]]; then
    grep -E "$GPU_STEP_GREP" "$log" | head -n "${GPU_STEP_HEAD:-120}" |
      sed "s/^/${GPU_STEP_INDENT:-}/"
  fi
  [[ -n ${GPU_STEP_AFTER:-} ]] && "$GPU_STEP_AFTER" "$name" "$rc" "$((SECONDS - t0))" "$log"
  summary+=("$(printf "%-${width}s rc=%-3s %4ss" "$name" "$rc" "$((SECONDS - t0))")")
}

# gpu_tests_step: the per-session scripts' "tests" step: every GPU test binary and the memcheck
# cases of run_all_gpu.sh over $stage, logs under $out/all (call after gpu_run_begin).
gpu_tests_step() {
  gpu_step "tests-memcheck" 420 env STEPS="tests memcheck" OUT="$out/all" \
    tools/gpu/run_all_gpu.sh "$stage"
}

# gpu_moepaths_step: every MoE path per call (cuda_ops_bench --only moe), cut off after 90 s.
gpu_moepaths_step() {
  gpu_step "moe-paths" 90 "$bin/cuda_ops_bench" --only moe --iters 50
}

# gpu_profile_step "BATCHES": the per-kernel decode profile (profile_decode.sh, ncu, eager, real
# clocks, warm L2, fp8 KV) at those batch sizes, logs under $out/prof.
gpu_profile_step() {
  gpu_step "profile" 300 env OUT="$out/prof" NCU_FLAGS="--clock-control none --cache-control none" \
    tools/gpu/profile_decode.sh "$stage" "$1" --kv-dtype fp8 --graphs off
}

# gpu_run_begin STAGE OUT: the opening the run_*.sh scripts share (call from the repo root, after
# sourcing this file): sets stage=STAGE, bin=STAGE/bin, out=OUT (created), an empty `summary`
# array for gpu_step, and the environment (gpu_env STAGE). Typical call:
#   gpu_run_begin "${1:-.gpurun-NAME}" "${OUT:-/tmp/glm-NAME-out}"
gpu_run_begin() {
  stage=$1
  bin=$stage/bin
  out=$2
  mkdir -p "$out"
  gpu_env "$stage"
  summary=()
}

# gpu_run_end: prints the steps' summary lines (gpu_step's `summary`) under "== summary".
gpu_run_end() {
  echo "== summary"
  printf '%s\n' "${summary[@]}"
}
