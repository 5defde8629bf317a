#!/usr/bin/env python3
"""Per-replay kernel timelines from kernel_trace.cc's CSV (the GPU machine has no Nsight Systems).

Kernels of one cudaGraphLaunch share a correlation id. Replays are grouped by their kernel-name
sequence; for each sequence seen at least --min-replays times this prints the median replay's
span and, per kernel:
  start  offset of its start from the replay's first start (µs)
  dur    its own start-to-end time (µs)
  gap    start minus the latest end before it: negative = it ran overlapped (programmatic
         dependent launch), positive = the GPU ran nothing of this replay for that long
  adds   how far it moved the replay's latest end (µs): the adds of a replay sum to its span, so
         they say which kernels the step's time is made of
and a per-name table (adds and dur summed over a replay, medians over the replays).

usage: kernel_timeline.py trace.csv [--min-replays 3] [--rows N] [--name-width 70]
"""
import argparse
import collections
import re
import statistics
import sys


def short(name, width):
    # Drop the parameter list and the namespaces; keep the template arguments, trimmed.
    n = name.replace("(anonymous namespace)::", "")
    n = n[5:] if n.startswith("void ") else n
    n = n.split("(")[0]
    n = re.sub(r"\bglm::(engine::)?(cuda::)?(kernels::)?(detail::)?", "", n)
    n = n.replace("__nv_fp8_e4m3", "fp8").replace("__nv_bfloat16", "bf16")
    return n if len(n) <= width else n[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--min-replays", type=int, default=3)
    ap.add_argument("--rows", type=int, default=400, help="per-kernel rows printed per sequence")
    ap.add_argument("--name-width", type=int, default=70)
    a = ap.parse_args()

    groups = collections.defaultdict(list)
    with open(a.csv) as f:
        for line in f:
            parts = line.rstrip("\n").split(",", 5)
            if len(parts) != 6:
                continue
            corr, start, end, _stream, graph, name = parts
            if graph == "0":
                continue  # eager launches: not a replay
            groups[int(corr)].append((int(start), int(end), name))
    by_seq = collections.defaultdict(list)
    for corr, ks in groups.items():
        ks.sort()
        by_seq[tuple(k[2] for k in ks)].append(ks)
    if not by_seq:
        print("no graph replays in", a.csv)
        return 1
    for seq, replays in sorted(by_seq.items(), key=lambda kv: -len(kv[0])):
        if len(replays) < a.min_replays:
            continue
        spans = [r[-1][1] - r[0][0] for r in replays]
        rows = []
        for r in replays:
            t0 = r[0][0]
            latest = t0
            out = []
            for s, e, _ in r:
                gap = s - latest
                adds = max(0, e - max(latest, s)) + max(0, gap)
                out.append(((s - t0) / 1e3, (e - s) / 1e3, gap / 1e3, adds / 1e3))
                latest = max(latest, e)
            rows.append(out)
        med = statistics.median(spans)
        pick = min(range(len(replays)), key=lambda i: abs(spans[i] - med))
        print(f"== sequence of {len(seq)} kernels, {len(replays)} replays, span median "
              f"{med / 1e3:.1f} us (min {min(spans) / 1e3:.1f}, max {max(spans) / 1e3:.1f})")
        print(f"{'#':>4} {'start':>8} {'dur':>7} {'gap':>7} {'adds':>7}  kernel (median replay)")
        for i, (st, du, gp, ad) in enumerate(rows[pick][: a.rows]):
            print(f"{i:4d} {st:8.2f} {du:7.2f} {gp:7.2f} {ad:7.2f}  {short(seq[i], a.name_width)}")
        per = collections.defaultdict(lambda: [[], [], 0])
        for out in rows:
            sums = collections.defaultdict(lambda: [0.0, 0.0])
            for i, (_, du, _, ad) in enumerate(out):
                sums[seq[i]][0] += ad
                sums[seq[i]][1] += du
            for n, (ad, du) in sums.items():
                per[n][0].append(ad)
                per[n][1].append(du)
        for n in seq:
            per[n][2] += 1
        print(f"-- per kernel name, medians over replays (us): {'adds':>7} {'dur':>7} count"
              f" {'adds/each':>9}")
        total = 0.0
        for n, (ads, dus, cnt) in sorted(per.items(), key=lambda kv: -statistics.median(kv[1][0])):
            total += statistics.median(ads)
            print(f"   {statistics.median(ads):7.2f} {statistics.median(dus):7.2f} "
                  f"{cnt:5d} {statistics.median(ads) / cnt:9.2f}  {short(n, a.name_width)}")
        print(f"   {total:7.2f} summed adds (= span up to the medians' rounding)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
