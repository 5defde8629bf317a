#!/usr/bin/env python3
"""torch.topk on the same shapes as topk_radix_bench (k=2048, fp32, 128K and 1M columns, batch
1/8/32), timed the same way: N calls over rotating input sets (>= 512 MiB together, so reads come
from HBM) captured in one CUDA graph, median replay / N. Also the D2D copy bandwidth through torch.
Prints one table; run on the GPU machine (tools/gpu/run_kernel_tests.sh calls it)."""
import statistics

import torch


def time_eager(fn, calls, trials=15):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for t in range(trials + 2):
        start.record()
        for i in range(calls):
            fn(i)
        stop.record()
        stop.synchronize()
        if t >= 2:
            ms.append(start.elapsed_time(stop))
    return statistics.median(ms) * 1000.0 / calls


def time_graph(fn, calls, trials=15):
    try:
        return time_graph_or_raise(fn, calls, trials)
    except RuntimeError as e:  # capture refused: eager (launch gaps included), said so
        print(f"graph capture failed ({str(e).splitlines()[0]}); timing eager")
        torch.cuda.synchronize()
        return time_eager(fn, calls, trials)


def time_graph_or_raise(fn, calls, trials):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for t in range(trials + 2):
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        if t >= 2:
            ms.append(start.elapsed_time(stop))
    return statistics.median(ms) * 1000.0 / calls


def main():
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    b = torch.empty_like(a)
    us = time_graph(lambda i: b.copy_(a), 4, 10)
    d2d = 2.0 * n / (us * 1e-6) / 1e9
    print(f"torch D2D copy (read+write): {d2d:.0f} GB/s")
    del a, b
    k = 2048
    print(f"{'columns':<9} {'rows':<5} {'sorted':<7} {'time_us':<10} {'GB/s':<7} of_d2d")
    for cols in (131072, 1048576):
        for rows in (1, 8, 32):
            set_bytes = rows * cols * 4
            sets = max(2, (512 << 20) // set_bytes)
            x = torch.randn(sets, rows, cols, device=dev, dtype=torch.float32)
            calls = min(sets, 100)
            for sorted_ in (False, True):
                us = time_graph(lambda i: torch.topk(x[i % sets], k, dim=-1, sorted=sorted_),
                                calls)
                gbs = (set_bytes + rows * k * 12) / (us * 1e-6) / 1e9
                print(f"{cols:<9} {rows:<5} {str(sorted_):<7} {us:<10.2f} {gbs:<7.0f} "
                      f"{gbs / d2d:.3f}")
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
