#!/usr/bin/env bash
# The GPU checks, benchmarks and profiles of the tree, in one call on a GPU machine, over a build
# made elsewhere (it builds nothing). On the CPU machine (nvcc needs no GPU):
#   cmake -S . -B build-gpu -G Ninja -DGLM_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gpu -j2 --target $(tools/gpu/run_all_gpu.sh --targets)
#   BUILD_DIR=build-gpu STAGE_DIR=.gpurun-all BINS="$(tools/gpu/run_all_gpu.sh --bins build-gpu)" \
#     tools/gpu/stage_build.sh
# then pack the stage (the test binaries share most bytes: a large xz dictionary packs ~320 MB
# into ~10 MB, under the device tool's 64 MiB transfer limit):
#   mkdir -p .gpurun-pack && tar -cf - .gpurun-all | xz -T1 --lzma2=preset=6,dict=384MiB \
#     > .gpurun-pack/all.tar.xz
# carry .gpurun-pack and run from the repo root there:
#   tar -xJf .gpurun-pack/all.tar.xz && STEPS="tests memcheck" tools/gpu/run_all_gpu.sh .gpurun-all
# A partial stage (BINS naming only the binaries the chosen steps run) is enough. Build after the
# sources stop changing: ninja takes an object compiled while its source was being edited for up
# to date (`touch` the sources if unsure).
#
# Steps, in the order given by STEPS (default "tests memcheck nccl table bench"):
#   tests      every GPU test binary: the list below, then any other *_test in the stage; a
#              listed binary missing from the stage shows as "not staged" in the summary
#   memcheck   compute-sanitizer memcheck: graphs, model, the tensor-core attention, the indexer,
#              the MoE paths (the quantized ones too), the fused norms, the per-head products,
#              sampling, glm-run on cuda
#   racecheck  compute-sanitizer racecheck on the kernels that share shared memory between warps
#              or stage through it (MoE ring, quantized experts, indexer passes, fused norms)
#   nccl       engine/dist's real-NCCL test through the dlopen'd table (run_nccl_test.sh)
#   multigpu   TP over NCCL between GPUs (run_multigpu.sh; 2+ GPUs, the -x2 / -x4 kinds: TP 2 =
#              the single-GPU greedy tokens, a killed rank fails the group within seconds)
#   table      the decode-step table of docs/benchmarks.md: glm-bench-cuda-decode --dtype fp8
#              --kv-dtype fp8 --graphs on --layers LAYERS (1,6) --steps TABLE_STEPS (16)
#              --batches BATCHES (1,8,64) --contexts CONTEXTS (4096,131072).
#              BASELINE=STAGE2 compares two builds in this one call: STAGE2's bench (with
#              STAGE2/lib) and this stage's run alternately, baseline first, ROUNDS (2) times
#              each, then ms/layer per round and the means side by side with current/baseline.
#   bench      the kernel benches, each alone (BENCHES picks some by binary name): sample_test's
#              bench, gemv_bench, gemv_quant_bench, gemm_bench, per_head_narrow_bench,
#              smallops_bench, read_pattern_bench, cuda_ops_bench (MoE), cuda_kv_bench,
#              cuda_indexer_bench
#   profile    the decode step at GLM-5 widths (fp8 weights and KV) from three sides, chosen by
#              PROFILE (default "kernels streams timeline"):
#                kernels   Nsight Compute's time per kernel of one eager step, each kernel alone,
#                          at PROFILE_BATCHES ("1 8") x 4096 keys (NCU_FLAGS, default real clocks
#                          and warm L2: "--clock-control none --cache-control none")
#                streams   ncu metrics of the batch-1 step's weight-streaming kernels
#                          (STREAMS_REGEX): DRAM bytes and bandwidth, occupancy, grid, stalls
#                timeline  the graph replays kernel by kernel with their overlap (CUPTI through
#                          kernel_timeline.sh / kernel_trace.cc / kernel_timeline.py), one process
#                          per shape in SHAPES ("1x4096 1x131072"); KEEP_CSV=1 keeps the traces
#   cpubench   glm-bench-cpu on this machine's CPU (the CPU backend's table)
#   quant      the INT4 / INT8 / NVFP4 paths' GPU tests (gemv_quant_test, moe_quant_test,
#              cuda_quant_test, gemv_quant_fp4mma_test)
#   qbench     their benches: moe_quant_bench, gemv_quant_bench (--quick), and the decode table
#              in the Int4-Int8Mix and NVFP4 layouts (glm-bench-cuda-decode --dtype
#              int4mix|nvfp4, the table step's shapes but QUANT_LAYERS (1,2)), which prints the
#              narrow vs widened expert calls
#   qgolden    tests/golden/tiny-int4mix and tiny-nvfp4 remade with transformers
#              (tools/golden/make_quantized_golden.py) into $OUT/quant-golden.tar.gz; unpack here
#              with `tar -C tests/golden -xzf quant-golden.tar.gz`
#   serve      the cluster on the GPU: models/demo-chat served with the CUDA backend by one agent
#              (PP 1) and by two agents as PP 2 sharing the GPU, through glmctl generate
#              (tools/bench/mtp.sh: every reply must start with the recorded greedy ids; tokens/s
#              and MTP acceptance for k = 0..4). Needs glm-agent (a CUDA build), glm-controller
#              and glmctl in the stage.
# Env: OUT (logs; default /tmp/glm-gpu-out), BUDGET_S (a wall-clock budget for the whole call:
# a step that would start with < 5 s left is skipped). The summary comes last.
# Modes: --targets prints the CMake targets; --bins BUILD_DIR their binaries in that build.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
tests=(rmsnorm_test rope_test silu_mul_test layernorm_test rows_test moe_route_test moe_test dsa_indexer_test sample_test
  gemm_bf16_test gemm_fp8_block_test quant_fp8_group_test gemv_narrow_test gemv_quant_test per_head_gemv_test
  per_head_narrow_test launch_test cublaslt_matmul_test cuda_backend_test cuda_ops_test
  cuda_moe_test cuda_kv_fp8_test cuda_indexer_test cuda_narrow_test
  cuda_model_test cuda_graph_test create_backend_test sample_backend_test engine_golden_test
  engine_golden_narrow_test engine_kv_fp8_test)
benches=(gemv_bench gemv_quant_bench gemm_bench per_head_narrow_bench smallops_bench read_pattern_bench
  cuda_ops_bench cuda_kv_bench cuda_indexer_bench)
quant=(moe_quant_test cuda_quant_test gemv_quant_fp4mma_test moe_quant_bench)
others=(nccl_gpu_test engine_nccl_gpu_test glm-run glm-bench-cuda-decode glm-bench-cpu)
if [[ ${1:-} == --targets ]]; then
  echo "${tests[*]} ${benches[*]} ${quant[*]} ${others[*]} glm-agent glm-controller glmctl"
  exit 0
fi
if [[ ${1:-} == --bins ]]; then
  [[ -d ${2:-} ]] || { echo "usage: $0 --bins BUILD_DIR" >&2; exit 2; }
  for t in "${tests[@]}" "${benches[@]}" "${quant[@]}" "${others[@]}" glm-agent glm-controller \
    glmctl; do
    find "$2" -name "$t" -type f -perm -u+x | head -n 1
  done | tr '\n' ' '
  exit 0
fi

stage=${1:-.gpurun-all}
bin=$stage/bin
out=${OUT:-/tmp/glm-gpu-out}
steps=${STEPS:-tests memcheck nccl table bench}
mkdir -p "$out"
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
[[ -d $bin ]] || { echo "no staged binaries in $bin (see the header of $0)"; exit 2; }
gpu_env "$stage"
[[ -n ${BUDGET_S:-} ]] && export GPU_STEP_BUDGET=$BUDGET_S
summary=()
decode_grep='^== decode step|^batch|^ +[0-9]+ +[0-9]+ +([0-9.]+|-) |^ceilings|^device'
verdict_grep='^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|ERROR SUMMARY|RACECHECK SUMMARY'

# has NAME [LABEL]: the stage holds binary NAME; else a "LABEL: NAME not staged" summary line.
has() {
  [[ -x $bin/$1 ]] && return 0
  summary+=("$(printf '%-40s %s not staged' "${2:-$1}" "$1")")
  return 1
}

# sanitize TOOL NAME BINARY [ARGS...]: compute-sanitizer TOOL on a staged binary.
sanitize() {
  local tool=$1 name=$2 b=$3
  shift 3
  has "$b" "$tool $name" || return 0
  GPU_STEP_GREP="ERROR SUMMARY|RACECHECK SUMMARY|^\[  FAILED  \]" \
    gpu_step "$tool $name" "$tool.log" 400 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$bin/$b" "$@"
}

# table_rows LOG: "batch context ms/layer" of each row of the decode table(s) in LOG.
table_rows() {
  awk '/^== decode step per layer/ { on = 1; header = 1; next }
       on && header { header = 0; next }
       on && $1 !~ /^[0-9]+$/ { on = 0 }
       on && $5 ~ /^[0-9.]+$/ { print $1, $2, $5 (/NON-FINITE/ ? " non-finite" : "") }' "$1"
}

# compare_tables ROUNDS: the table-base-R.log / table-cur-R.log runs side by side.
compare_tables() {
  local rounds=$1 r files=()
  for ((r = 1; r <= rounds; r++)); do
    files+=("$out/table-base-$r.log" "$out/table-cur-$r.log")
  done
  echo "== decode table, ms/layer: baseline $BASELINE vs current $stage (runs alternate," \
    "baseline first)"
  for f in "${files[@]}"; do
    table_rows "$f" | sed "s|^|$(basename "$f" .log) |"
  done | awk -v rounds="$rounds" '
    { split($1, p, "-"); w = p[2]; r = p[3]; k = sprintf("%5d %7d", $2, $3)
      if (!(k in seen)) { seen[k] = 1; keys[++n] = k }
      v[w, r, k] = $4; if ($5 != "") bad[k] = 1 }
    END {
      printf "%5s %7s  %-26s  %-26s %8s %8s %8s\n", "batch", "context", "baseline (per run)",
        "current (per run)", "base", "current", "cur/base"
      for (i = 1; i <= n; i++) {
        k = keys[i]; bs = cs = ""; bsum = csum = bn = cn = 0
        for (r = 1; r <= rounds; r++) {
          if (("base", r, k) in v) { bs = bs sprintf("%.3f ", v["base", r, k]); bsum += v["base", r, k]; bn++ }
          else bs = bs "- "
          if (("cur", r, k) in v) { cs = cs sprintf("%.3f ", v["cur", r, k]); csum += v["cur", r, k]; cn++ }
          else cs = cs "- "
        }
        bm = bn ? bsum / bn : 0; cm = cn ? csum / cn : 0
        printf "%s  %-26s  %-26s %8s %8s %8s%s\n", k, bs, cs, bn ? sprintf("%.3f", bm) : "-",
          cn ? sprintf("%.3f", cm) : "-", (bn && cn) ? sprintf("%.3f", cm / bm) : "-",
          (k in bad) ? "  NON-FINITE LOGITS" : ""
      }
    }'
}

# ncu_step_summary CSV: per-kernel time summed over the last decode step in an ncu
# gpu__time_duration CSV of a bench run with --warmup 1 --steps 1 (two identical steps).
ncu_step_summary() {
  python3 - "$1" <<'PY'
import collections, csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
t = [float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1.0) for r in rows]
names = [r["Kernel Name"] for r in rows]
# The last step is the longest suffix of launches that repeats right before itself.
n = len(names)
step_len = next((L for L in range(n // 2, 0, -1) if names[n - L:] == names[n - 2 * L:n - L]), 0)
if step_len == 0:
    sys.exit("could not find two identical decode steps in the profile")
step = range(n - step_len, n)
agg = collections.OrderedDict()
for i in step:
    a = agg.setdefault(names[i][:90], [0.0, 0])
    a[0] += t[i]
    a[1] += 1
total = sum(t[i] for i in step)
for name, (us, k) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
    print(f"{us:9.1f} us {k:4d}x {100 * us / total:5.1f}%  {name}")
print(f"{total:9.1f} us in the last step's {len(step)} launches ({len(rows)} launches profiled)")
PY
}

# ncu_streams_summary CSV: per launch, time, DRAM read bytes and bandwidth, occupancy, grid,
# registers and the five largest stall reasons (cycles per issued instruction).
ncu_streams_summary() {
  python3 - "$1" <<'PY'
import collections, csv, re, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
launches = collections.OrderedDict()
for r in rows:
    launches.setdefault(r["ID"], {"name": r["Kernel Name"]})[r["Metric Name"]] = (
        r["Metric Value"].replace(",", ""), r["Metric Unit"])
def val(d, k):
    try:
        return float(d[k][0])
    except (KeyError, ValueError):
        return 0.0
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
mb_scale = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}
for i, d in launches.items():
    us = val(d, "gpu__time_duration.sum") * scale.get(d.get("gpu__time_duration.sum", ("", ""))[1], 1)
    mb = val(d, "dram__bytes_read.sum") * mb_scale.get(d.get("dram__bytes_read.sum", ("", "byte"))[1], 1e-6)
    name = re.sub(r"\(.*", "", d["name"]).replace("(anonymous namespace)::", "")
    name = re.sub(r"\bglm::(engine::)?(cuda::)?(kernels::)?(detail::)?", "", name)
    print(f"-- launch {i}: {name[:70]}")
    print(f"   {us:8.2f} us  DRAM read {mb:7.2f} MB = {mb / us if us else 0:5.2f} TB/s"
          f" ({val(d, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):.1f} % of peak)"
          f"  occupancy {val(d, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.1f} %"
          f"  grid {val(d, 'launch__grid_size'):.0f}  regs {val(d, 'launch__registers_per_thread'):.0f}")
    st = sorted(((val(d, k), k.split("stalled_")[1].split("_per_issue")[0]) for k in d
                 if k.startswith("smsp__average_warps_issue_stalled_")), reverse=True)
    print("   stalls per issue: " + ", ".join(f"{s} {v:.2f}" for v, s in st[:5]))
PY
}

run_tests() {
  local t seen=" "
  for t in "${tests[@]}"; do
    seen+="$t "
    has "$t" && GPU_STEP_GREP="^\[  FAILED  \]" gpu_step "$t" tests.log 300 "$bin/$t"
  done
  for t in "$bin"/*_test; do
    t=$(basename "$t")
    [[ -x $bin/$t && $seen != *" $t "* ]] || continue
    GPU_STEP_GREP="^\[  FAILED  \]" gpu_step "$t" tests.log 300 "$bin/$t"
  done
}

run_memcheck() {
  sanitize memcheck cuda_graph_test cuda_graph_test
  sanitize memcheck cuda_model_test cuda_model_test
  sanitize memcheck "cuda_kv_fp8_test TC" cuda_kv_fp8_test --gtest_filter='*TensorCore*'
  sanitize memcheck "cuda_indexer_test subset" cuda_indexer_test \
    --gtest_filter='*SanitizerSubset*'
  sanitize memcheck "cuda_moe_test paths" cuda_moe_test \
    --gtest_filter='*Mma*:*Grouped*:*RouteExperts*:*Streamed*'
  sanitize memcheck "gemv_narrow_test small" gemv_narrow_test \
    --gtest_filter='*ActivationNumerics*:*NonFinite*:*Deterministic*:*Overlapped*:*FusedRmsNorm*'
  sanitize memcheck "per_head_gemv_test norm" per_head_gemv_test --gtest_filter='*FusedRmsNorm*'
  sanitize memcheck "cuda_narrow_test norm" cuda_narrow_test --gtest_filter='*RmsNormLinear*'
  sanitize memcheck "per_head_narrow_test small" per_head_narrow_test \
    --gtest_filter='*OddShapes*:*NanInX*:*OneHot*:*Widen*'
  sanitize memcheck "cuda_quant_test narrow" cuda_quant_test \
    --gtest_filter='*NarrowMatchesCpu*:*InPieces*'
  sanitize memcheck "moe_quant_test routing" moe_quant_test --gtest_filter='*RoutingInside*'
  sanitize memcheck "sample_test" sample_test --gtest_filter='-*Distribution*:*Bench*'
  sanitize synccheck "sample_test host rule" sample_test --gtest_filter='*MatchesHostRule*'
  has glm-run || return 0
  local fx=$PWD/tests/golden/tiny-sparse ids
  ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" \
    "$fx/reference.json")
  GPU_STEP_GREP="ERROR SUMMARY" gpu_step "memcheck glm-run tiny-sparse" memcheck.log 200 \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/glm-run" --backend cuda \
    --model "$fx" --tokens "$ids" --max-tokens 8 --ignore-eos
}

run_racecheck() {
  # Our kernels' tests only: cuBLASLt's own kernels (nvjet_sm90_*) report hazards under racecheck.
  sanitize racecheck "cuda_moe_test streamed" cuda_moe_test --gtest_filter='*Streamed*:*GraphReplay*'
  sanitize racecheck "cuda_indexer_test subset" cuda_indexer_test \
    --gtest_filter='*SanitizerSubset*'
  sanitize racecheck "moe_quant_test" moe_quant_test --gtest_filter='*RoutingInside*:*ChunkedK*'
  sanitize racecheck "gemv_narrow_test norm" gemv_narrow_test --gtest_filter='*FusedRmsNorm*'
  sanitize racecheck "per_head_gemv_test norm" per_head_gemv_test --gtest_filter='*FusedRmsNorm*'
}

run_table() {
  local args=(--dtype fp8 --kv-dtype fp8 --graphs on --layers "${LAYERS:-1,6}"
    --steps "${TABLE_STEPS:-16}" --batches "${BATCHES:-1,8,64}" --contexts "${CONTEXTS:-4096,131072}")
  has glm-bench-cuda-decode || return 0
  if [[ -z ${BASELINE:-} ]]; then
    GPU_STEP_GREP=$decode_grep gpu_step "decode table" table.log 400 \
      "$bin/glm-bench-cuda-decode" "${args[@]}"
    return 0
  fi
  local base_bin=$BASELINE/bin/glm-bench-cuda-decode rounds=${ROUNDS:-2} r
  if [[ ! -x $base_bin ]]; then
    summary+=("$(printf '%-40s no %s' "decode table compare" "$base_bin")")
    return 0
  fi
  echo "baseline: $(cat "$BASELINE/build-info.txt" 2>/dev/null || echo "$BASELINE")"
  echo "current:  $(cat "$stage/build-info.txt" 2>/dev/null || echo "$stage")"
  rm -f "$out"/table-base-*.log "$out"/table-cur-*.log
  for ((r = 1; r <= rounds; r++)); do
    GPU_STEP_GREP='^ +[0-9]+ +[0-9]+ +([0-9.]+|-) ' gpu_step "decode table baseline $r" \
      "table-base-$r.log" 400 env LD_LIBRARY_PATH="$PWD/$BASELINE/lib:$LD_LIBRARY_PATH" \
      "$base_bin" "${args[@]}"
    GPU_STEP_GREP='^ +[0-9]+ +[0-9]+ +([0-9.]+|-) ' gpu_step "decode table current $r" \
      "table-cur-$r.log" 400 "$bin/glm-bench-cuda-decode" "${args[@]}"
  done
  compare_tables "$rounds" | tee "$out/table-compare.txt"
}

run_bench() {
  local b list
  if [[ -n ${BENCHES:-} ]]; then read -r -a list <<<"$BENCHES"; else list=(sample_test "${benches[@]}"); fi
  export GPU_STEP_GREP='^\[  FAILED  \]'
  for b in "${list[@]}"; do
    has "$b" || continue
    case $b in
      sample_test)
        gpu_step "sample bench" bench.log 120 "$bin/sample_test" --gtest_also_run_disabled_tests \
          --gtest_filter='*Bench*' ;;
      gemv_bench) gpu_step gemv_bench bench.log 200 "$bin/gemv_bench" --quick ;;
      gemv_quant_bench) gpu_step gemv_quant_bench bench.log 200 "$bin/$b" --quick ;;
      gemm_bench) gpu_step gemm_bench bench.log 200 "$bin/gemm_bench" ;;
      per_head_narrow_bench) gpu_step per_head_narrow_bench bench.log 120 "$bin/$b" ;;
      smallops_bench) gpu_step smallops_bench bench.log 120 "$bin/$b" --calls 100 --trials 5 ;;
      read_pattern_bench) gpu_step read_pattern_bench bench.log 120 "$bin/$b" --iters 30 ;;
      cuda_ops_bench) gpu_step "cuda_ops_bench moe" bench.log 200 "$bin/$b" --only moe --iters 50 ;;
      cuda_kv_bench)
        gpu_step cuda_kv_bench bench.log 200 "$bin/$b" --rows 1,8,64 --keys 4096,131072 --trials 3 ;;
      cuda_indexer_bench)
        gpu_step cuda_indexer_bench bench.log 200 "$bin/$b" --rows 1,8 --keys 4096,131072 \
          --trials 3 ;;
      *) summary+=("$(printf '%-40s unknown bench' "$b")") ;;
    esac
  done
  unset GPU_STEP_GREP
  echo "== the benches' tables: $out/bench.log"
}

run_quant() {
  local t
  for t in gemv_quant_test moe_quant_test cuda_quant_test gemv_quant_fp4mma_test; do
    has "$t" && GPU_STEP_GREP="^\[  FAILED  \]|narrow vs|widened vs" gpu_step "$t" quant.log 300 \
      "$bin/$t"
  done
}

run_qbench() {
  local dtype
  has moe_quant_bench && gpu_step moe_quant_bench quant-bench.log 200 "$bin/moe_quant_bench"
  has gemv_quant_bench && gpu_step gemv_quant_bench quant-bench.log 200 "$bin/gemv_quant_bench" \
    --quick
  has glm-bench-cuda-decode || return 0
  for dtype in int4mix nvfp4; do
    GPU_STEP_GREP="$decode_grep|expert calls" gpu_step "decode table $dtype" "table-$dtype.log" 300 \
      "$bin/glm-bench-cuda-decode" --dtype "$dtype" --kv-dtype fp8 --graphs on \
      --layers "${QUANT_LAYERS:-1,2}" --steps "${TABLE_STEPS:-16}" --batches "${BATCHES:-1,8,64}" \
      --contexts "${CONTEXTS:-4096,131072}"
  done
}

run_profile() {
  has glm-bench-cuda-decode || return 0
  local dec=$bin/glm-bench-cuda-decode part b shape csv
  for part in ${PROFILE:-kernels streams timeline}; do
    case $part in
      kernels)
        for b in ${PROFILE_BATCHES:-1 8}; do
          csv=$out/ncu_b$b.csv
          # shellcheck disable=SC2086  # NCU_FLAGS: extra ncu flags, word-split on purpose
          gpu_step "profile kernels batch $b" profile.log 300 ncu --metrics gpu__time_duration.sum \
            ${NCU_FLAGS:---clock-control none --cache-control none} --csv --log-file "$csv" \
            "$dec" --layers 1 --batches "$b" --contexts 4096 --dtype fp8 --kv-dtype fp8 \
            --graphs off --steps 1 --warmup 1
          ncu_step_summary "$csv" | tee -a "$out/profile.log"
        done
        ;;
      streams)
        local stalls m s
        stalls="long_scoreboard lg_throttle barrier membar wait drain short_scoreboard
          math_pipe_throttle not_selected selected no_instruction imc_miss dispatch_stall sleeping
          branch_resolving mio_throttle tex_throttle"
        m="gpu__time_duration.sum,dram__bytes_read.sum"
        m+=",dram__throughput.avg.pct_of_peak_sustained_elapsed"
        m+=",sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size"
        m+=",launch__registers_per_thread,launch__occupancy_limit_registers,sm__cycles_elapsed.avg"
        for s in $stalls; do m+=",smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
        csv=$out/ncu_streams.csv
        gpu_step "profile streams batch 1" profile.log 300 ncu \
          --kernel-name "regex:${STREAMS_REGEX:-GemvNarrowKernel|MoeDecodeKernel}" \
          --clock-control none --cache-control all --metrics "$m" --csv --log-file "$csv" \
          "$dec" --layers 1 --batches 1 --contexts 4096 --dtype fp8 --kv-dtype fp8 --graphs off \
          --steps 1 --warmup 0
        ncu_streams_summary "$csv" | tee -a "$out/profile.log"
        ;;
      timeline)
        for shape in ${SHAPES:-1x4096 1x131072}; do
          GPU_STEP_GREP="^kernel_(trace|timeline)|^== sequence|^-- per kernel|^ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+  |summed adds" \
            GPU_STEP_HEAD=${TIMELINE_HEAD:-70} gpu_step "timeline $shape" "timeline-$shape.txt" 300 \
            tools/gpu/kernel_timeline.sh "/tmp/glm-trace-$shape.csv" "$dec" --dtype fp8 \
            --kv-dtype fp8 --layers 1,6 --steps 16 --graphs on --batches "${shape%x*}" \
            --contexts "${shape#*x}"
          [[ ${KEEP_CSV:-0} == 1 ]] && xz -T4 -c "/tmp/glm-trace-$shape.csv" >"$out/trace-$shape.csv.xz"
        done
        ;;
      *) summary+=("$(printf '%-40s unknown profile part' "$part")") ;;
    esac
  done
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  echo "stage $stage: $(cat "$stage/build-info.txt" 2>/dev/null || echo "no build-info.txt")"
} | tee "$out/env.log"
for s in $steps; do
  case $s in
    tests) run_tests ;;
    memcheck) run_memcheck ;;
    racecheck) run_racecheck ;;
    nccl)
      has nccl_gpu_test && GPU_STEP_GREP="$verdict_grep|GB/s" gpu_step nccl_gpu_test nccl.log 300 \
        env BIN="$bin/nccl_gpu_test" STAGE_DIR="$stage" OUT="$out" tools/gpu/run_nccl_test.sh
      ;;
    multigpu)
      has engine_nccl_gpu_test && gpu_step multigpu multigpu-all.log 600 \
        env STAGE_DIR="$stage" OUT="$out" tools/gpu/run_multigpu.sh "$stage"
      ;;
    table) run_table ;;
    bench) run_bench ;;
    profile) run_profile ;;
    quant) run_quant ;;
    qbench) run_qbench ;;
    qgolden)
      gpu_step "quantized golden fixtures" qgolden.log 300 env PYTHONUNBUFFERED=1 \
        python3 tools/golden/make_quantized_golden.py --out /tmp/glm-qgolden &&
        tar -C /tmp/glm-qgolden -czf "$out/quant-golden.tar.gz" tiny-int4mix tiny-nvfp4
      ;;
    cpubench)
      has glm-bench-cpu && GPU_STEP_GREP='^glm-bench-cpu|^model|^[a-z0-9-]+ +[0-9]+ ' gpu_step glm-bench-cpu cpubench.log 500 \
        "$bin/glm-bench-cpu" --golden tests/golden --synthetic --repeats 5
      ;;
    serve)
      for pp in 1 2; do
        has glm-agent "serve pp $pp" && has glm-controller "serve pp $pp" && has glmctl "serve pp $pp" &&
          GPU_STEP_GREP='^PP|^k=|^every reply|differ' gpu_step "serve pp $pp" serve.log 240 \
            env BIN="$bin" GLM_BIN_DIR="$PWD/$bin" PP=$pp BACKEND=cuda FIXTURE=models/demo-chat \
            bash tools/bench/mtp.sh
      done
      ;;
    *) summary+=("$(printf '%-40s unknown step (tests memcheck racecheck nccl multigpu table bench profile cpubench serve quant qbench qgolden)' "$s")") ;;
  esac
done
echo "== summary (logs in $out)"
printf '%s\n' "${summary[@]}"
