#!/usr/bin/env python3
"""Consistency check of tests/golden (stdlib only): files present, safetensors headers parse and
cover their data, sharded index matches, logits size = prompt x vocab, tokenizer cases well-formed.

Usage: python3 tools/golden/check_golden.py [tests/golden]
"""
import json
import os
import struct
import sys

DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "U8": 1}


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    size = os.path.getsize(path) - 8 - n
    end = 0
    for k, v in h.items():
        if k == "__metadata__":
            continue
        numel = 1
        for d in v["shape"]:
            numel *= d
        b, e = v["data_offsets"]
        assert e - b == numel * DTYPE_SIZE[v["dtype"]], (path, k)
        end = max(end, e)
    assert end == size, (path, end, size)
    return {k: v for k, v in h.items() if k != "__metadata__"}


def check_model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    ref = json.load(open(os.path.join(d, "reference.json")))
    idx = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        for fn in sorted(set(wm.values())):
            for k, v in header(os.path.join(d, fn)).items():
                assert wm[k] == fn, (k, fn)
                tensors[k] = v
        assert set(wm) == set(tensors)
    else:
        tensors = header(os.path.join(d, "model.safetensors"))
    T, V = ref["logits_shape"]
    assert T == len(ref["prompt_ids"]) and V == cfg["vocab_size"], d
    assert os.path.getsize(os.path.join(d, ref["logits_file"])) == T * V * 4, d
    assert len(ref["greedy_ids"]) >= 32 and all(0 <= t < V for t in ref["greedy_ids"] + ref["prompt_ids"])
    assert tensors["lm_head.weight"]["shape"] == [V, cfg["hidden_size"]]
    n = cfg["num_hidden_layers"]
    for i in range(n):
        kv_b = f"model.layers.{i}.self_attn.kv_b_proj.weight"
        assert kv_b in tensors or kv_b + "_packed" in tensors, (d, i)  # packed: compressed-tensors
        has_idx = f"model.layers.{i}.self_attn.indexer.wk.weight" in tensors
        assert has_idx == (cfg["indexer_types"][i] == "full"), (d, i)
    if cfg.get("num_nextn_predict_layers", 0):
        assert f"model.layers.{n}.eh_proj.weight" in tensors
    if "quantization_config" in cfg:
        for k, v in tensors.items():
            if v["dtype"] == "F8_E4M3" and k.endswith(".weight"):  # not NVFP4's weight_scale
                s = tensors[k[: -len("weight")] + "weight_scale_inv"]["shape"]
                assert s == [-(-v["shape"][0] // 128), -(-v["shape"][1] // 128)], k
    return len(tensors)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    ok = 0
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if os.path.exists(os.path.join(d, "config.json")):
            n = check_model(d)
            print(f"{name}: ok ({n} tensors)")
            ok += 1
    tref = json.load(open(os.path.join(root, "tokenizer", "reference.json")))
    assert all(c["roundtrip"] for c in tref["cases"]), "tokenizer case does not round-trip"
    print(f"tokenizer: ok ({len(tref['cases'])} cases)")
    print(f"{ok + 1} passed, 0 failed")


if __name__ == "__main__":
    main()
