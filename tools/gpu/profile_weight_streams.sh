#!/usr/bin/env bash
# What limits the decode step's weight-streaming kernels (the decode GEMVs and the MoE decode
# kernels) at batch 1: Nsight Compute metrics of each launch of one eager decode step at GLM-5
# widths (glm-bench-cuda-decode, 1 layer, fp8 weights and KV, 4K keys, real clocks, caches
# flushed before each kernel: the weights do not fit L2 anyway). Per launch: duration, DRAM bytes
# and bandwidth (and its fraction of the device's peak), achieved occupancy, grid and registers,
# and the warps' stall reasons (cycles per issued instruction, largest first).
# Stage on the CPU machine:
#   BINS="build-gpu/engine/model/bench/glm-bench-cuda-decode" BUILD_DIR=build-gpu \
#     STAGE_DIR=.gpurun-prof tools/gpu/stage_build.sh
# then on the GPU machine (carry the stage or a pack of it), repo root:
#   tools/gpu/profile_weight_streams.sh .gpurun-prof [kernel regex] [bench flags...]
# Output: $OUT/ncu_streams.csv (raw) and the summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-.gpurun-prof}
regex=${2:-"GemvNarrowKernel|MoeDecodeKernel"}
shift 2 || shift $#
out=${OUT:-/tmp/glm-profile-out}
mkdir -p "$out"
source tools/gpu/common.sh
gpu_env "$stage"
stalls="long_scoreboard lg_throttle barrier membar wait drain short_scoreboard math_pipe_throttle
  not_selected selected no_instruction imc_miss dispatch_stall sleeping branch_resolving
  mio_throttle tex_throttle"
metrics="gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size"
metrics+=",launch__registers_per_thread,launch__occupancy_limit_registers,sm__cycles_elapsed.avg"
for s in $stalls; do
  metrics+=",smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
csv=$out/ncu_streams.csv
ncu --kernel-name "regex:$regex" --clock-control none --cache-control all --metrics "$metrics" \
  --csv --log-file "$csv" "$stage/bin/glm-bench-cuda-decode" --layers 1 --batches 1 \
  --contexts 4096 --dtype fp8 --kv-dtype fp8 --graphs off --steps 1 --warmup 0 "$@" \
  >"$out/bench_streams.log" 2>&1
echo "== ncu rc $? ($csv)"
python3 - "$csv" <<'PY'
import collections, csv, re, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
launches = collections.OrderedDict()
for r in rows:
    launches.setdefault(r["ID"], {"name": r["Kernel Name"]})[r["Metric Name"]] = (
        r["Metric Value"].replace(",", ""), r["Metric Unit"])
def val(d, k, default=0.0):
    try:
        return float(d[k][0])
    except (KeyError, ValueError):
        return default
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
for i, d in launches.items():
    us = val(d, "gpu__time_duration.sum") * scale.get(d.get("gpu__time_duration.sum", ("", ""))[1], 1)
    mb = val(d, "dram__bytes_read.sum")
    unit = d.get("dram__bytes_read.sum", ("", "byte"))[1]
    mb *= {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}.get(unit, 1e-6)
    name = re.sub(r"\(.*", "", d["name"]).replace("(anonymous namespace)::", "")
    name = re.sub(r"\bglm::(engine::)?(cuda::)?(kernels::)?(detail::)?", "", name)
    print(f"-- launch {i}: {name[:70]}")
    print(f"   {us:8.2f} us  DRAM read {mb:7.2f} MB = {mb / us if us else 0:5.2f} TB/s"
          f" ({val(d, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):.1f} % of peak)"
          f"  occupancy {val(d, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.1f} %"
          f"  grid {val(d, 'launch__grid_size'):.0f}  regs {val(d, 'launch__registers_per_thread'):.0f}")
    st = sorted(((val(d, k), k.split("stalled_")[1].split("_per_issue")[0]) for k in d
                 if k.startswith("smsp__average_warps_issue_stalled_")), reverse=True)
    print("   stalls per issue: " + ", ".join(f"{n} {v:.2f}" for v, n in st[:5]))
PY
