#!/usr/bin/env bash
# Per-kernel GPU time of one decode step at GLM-5 widths (glm-bench-cuda-decode, 1 layer, eager),
# measured with Nsight Compute's gpu__time_duration, to see where a layer's time goes.
# On the CPU machine first (see run_decode_bench.sh for the build):
#   BUILD_DIR=build-final STAGE_DIR=.gpurun-prof \
#     BINS="build-final/engine/model/bench/glm-bench-cuda-decode" tools/gpu/stage_build.sh
# then on the GPU machine (carry .gpurun-prof), repo root:
#   tools/gpu/profile_decode.sh .gpurun-prof [batches, default "1 8"] [bench flags...]
# Output: $OUT/ncu_b<batch>.csv (one row per kernel launch) and a per-kernel summary on stdout
# (µs summed over the last decode step the bench ran, launches, share).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-prof}
batches=${2:-"1 8"}
shift 2 || shift $#
out=${OUT:-/tmp/glm-profile-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
source tools/gpu/common.sh
find_cublaslt || echo "libcublasLt.so.13 not found"
export LD_LIBRARY_PATH
for b in $batches; do
  csv=$out/ncu_b$b.csv
  # shellcheck disable=SC2086  # NCU_FLAGS: extra ncu flags, e.g. "--clock-control none
  # --cache-control none" (ncu's defaults lock base clocks and flush caches before each kernel)
  ncu --metrics gpu__time_duration.sum ${NCU_FLAGS:-} --csv --log-file "$csv" \
    "$stage/bin/glm-bench-cuda-decode" --layers 1 --batches "$b" --contexts 4096 --dtype fp8 \
    --steps 1 --warmup 1 "$@" > "$out/bench_b$b.log" 2>&1
  echo "== batch $b (rc $?): kernels of the last step, summed"
  python3 - "$csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
t = [float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1.0) for r in rows]
names = [r["Kernel Name"] for r in rows]
# The bench runs the same decode step twice (--warmup 1 --steps 1): the last step is the longest
# suffix of launches that repeats right before itself.
n = len(names)
step_len = next((L for L in range(n // 2, 0, -1) if names[n - L:] == names[n - 2 * L:n - L]), 0)
if step_len == 0:
    sys.exit("could not find two identical decode steps in the profile")
step = range(n - step_len, n)
last = max(step, key=lambda i: t[i])
agg = collections.OrderedDict()
for i in step:
    a = agg.setdefault(names[i][:90], [0.0, 0])
    a[0] += t[i]; a[1] += 1
total = sum(t[i] for i in step)
for name, (us, n) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
    print(f"{us:9.1f} us {n:4d}x {100 * us / total:5.1f}%  {name}")
print(f"{total:9.1f} us in the last step's {len(step)} launches (longest: {t[last]:.1f} us, "
      f"{names[last][:40]}); {len(rows)} launches profiled")
PY
done
