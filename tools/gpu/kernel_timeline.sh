#!/usr/bin/env bash
# kernel_timeline.sh TRACE_CSV CMD...: runs CMD with kernel_trace.cc injected (CUPTI activity
# records of every kernel, graph replays included), then prints kernel_timeline.py's per-replay
# timelines of TRACE_CSV. Builds the injection library first, against the CUPTI this machine has
# (the CUDA toolkit's extras/CUPTI, else Python's nvidia-cuda-cupti wheel), into
# ${KT_LIB:-/tmp/glm-kernel-trace/libkernel_trace.so}. KT_ARGS: extra kernel_timeline.py args.
# From the repo root, e.g.:
#   tools/gpu/kernel_timeline.sh /tmp/t.csv .gpurun-all/bin/glm-bench-cuda-decode --graphs on ...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
trace=$1
shift
lib=${KT_LIB:-/tmp/glm-kernel-trace/libkernel_trace.so}

find_cupti_header() {
  local d
  for d in /usr/local/cuda/extras/CUPTI/include /usr/local/cuda/include; do
    [[ -e $d/cupti_activity.h ]] && { echo "$d"; return; }
  done
  python3 - <<'PY' 2>/dev/null
import glob, site, sys
for r in site.getsitepackages() + sys.path:
    for f in glob.glob(r + "/nvidia/**/cupti_activity.h", recursive=True):
        print(f.rsplit("/", 1)[0]); raise SystemExit
PY
}

if [[ ! -e $lib ]]; then
  inc=$(find_cupti_header)
  [[ -z $inc ]] && inc=$(dirname "$(find / -xdev -name cupti_activity.h 2>/dev/null | head -n1)")
  if [[ -z $inc || ! -e $inc/cupti_activity.h ]]; then
    echo "kernel_timeline: no CUPTI headers on this machine (cupti_activity.h)"; exit 2
  fi
  libdir=""
  for d in "$inc/../lib64" "$inc/../lib" /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda/lib64; do
    if ls "$d"/libcupti.so* >/dev/null 2>&1; then libdir=$(cd "$d" && pwd); break; fi
  done
  [[ -z $libdir ]] && { echo "kernel_timeline: no libcupti.so next to $inc"; exit 2; }
  # The newest kernel record this CUPTI declares (its fields are a superset of the older ones').
  rec=$(grep -ho 'CUpti_ActivityKernel[0-9]\+' "$inc"/cupti_activity*.h | sort -u -V | tail -n1)
  [[ -z $rec ]] && { echo "kernel_timeline: no CUpti_ActivityKernelN in $inc"; exit 2; }
  mkdir -p "$(dirname "$lib")"
  cupti_so=$(find "$libdir" -maxdepth 1 -name "libcupti.so*" | sort | head -n1)
  echo "kernel_timeline: CUPTI $inc ($rec), $cupti_so"
  g++ -O2 -std=c++17 -shared -fPIC -DGLM_KERNEL_RECORD="$rec" -I"$inc" -I/usr/local/cuda/include \
    "$here/kernel_trace.cc" "$cupti_so" -Wl,-rpath,"$libdir" -o "$lib" || exit 2
fi
GLM_KERNEL_TRACE=$trace CUDA_INJECTION64_PATH=$lib "$@"
rc=$?
echo "kernel_timeline: program rc=$rc"
# shellcheck disable=SC2086  # KT_ARGS: extra kernel_timeline.py flags, word-split on purpose
python3 "$here/kernel_timeline.py" "$trace" ${KT_ARGS:-}
