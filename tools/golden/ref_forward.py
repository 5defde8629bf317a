#!/usr/bin/env python3
"""Independent, dependency-free re-implementation of GlmMoeDsaForCausalLM's prompt forward pass.

Reads a fixture directory (config.json + safetensors, sharded or not, F32 or FP8 e4m3 with
128x128 block scales), runs the prompt of reference.json through a plain-Python forward pass
written from tests/golden/HF_NOTES.md (not from HF code), and compares with logits.f32.
It documents the math in executable form and cross-checks the fixtures without torch.

Usage: python3 tools/golden/ref_forward.py [FIXTURE_DIR ...] [--greedy N]
       (default: every tests/golden/tiny-*; --greedy N also re-derives the first N greedy ids)
Exit status 0 when every prompt-logit row matches to 1e-4 relative (max abs diff / max abs logit).
"""
import json
import math
import os
import struct
import sys
from operator import mul


# ---------------------------------------------------------------- safetensors
def _fp8_e4m3fn_table():
    t = []
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t.append(float("nan"))
        elif e == 0:
            t.append(s * (m / 8.0) * 2.0 ** -6)
        else:
            t.append(s * (1.0 + m / 8.0) * 2.0 ** (e - 7))
    return t


FP8 = _fp8_e4m3fn_table()


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        raw = data[base + b:base + e]
        if v["dtype"] == "F32":
            flat = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        elif v["dtype"] == "F8_E4M3":
            flat = [FP8[x] for x in raw]
        else:
            raise ValueError(f"{path}: {k}: dtype {v['dtype']} not handled here")
        out[k] = (v["shape"], flat)
    return out


def load_tensors(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    t = {}
    for fn in files:
        t.update(read_safetensors(os.path.join(d, fn)))
    # FP8: W = q * scale_inv[i // 128, j // 128]
    for k in [k for k in t if k.endswith(".weight_scale_inv")]:
        wk = k[: -len("_scale_inv")]
        (rows, cols), q = t[wk]
        (sr, sc), s = t.pop(k)
        t[wk] = ([rows, cols], [q[i * cols + j] * s[(i // 128) * sc + j // 128]
                                for i in range(rows) for j in range(cols)])
    return {k: mat(v) for k, v in t.items()}


def mat(v):
    shape, flat = v
    if len(shape) == 1:
        return flat
    rows, cols = shape
    return [flat[i * cols:(i + 1) * cols] for i in range(rows)]


# ---------------------------------------------------------------- math
def linear(w, x):  # w [out][in], x [in]
    return [sum(map(mul, row, x)) for row in w]


def rmsnorm(x, w, eps):
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [wi * xi * r for wi, xi in zip(w, x)]


def layernorm(x, w, b, eps):
    mu = sum(x) / len(x)
    var = sum((v - mu) ** 2 for v in x) / len(x)
    r = 1.0 / math.sqrt(var + eps)
    return [(xi - mu) * r * wi + bi for xi, wi, bi in zip(x, w, b)]


def silu(v):
    return v / (1.0 + math.exp(-v))


def rope_interleave(x, pos, theta):
    """Pairs (x[2i], x[2i+1]) rotated by pos * theta^(-2i/d); output kept interleaved."""
    d = len(x)
    out = list(x)
    for i in range(d // 2):
        f = pos * theta ** (-(2 * i) / d)
        c, s = math.cos(f), math.sin(f)
        a, b = x[2 * i], x[2 * i + 1]
        out[2 * i], out[2 * i + 1] = a * c - b * s, b * c + a * s
    return out


def dot(a, b):
    return sum(map(mul, a, b))


# ---------------------------------------------------------------- model
def forward(cfg, W, ids):
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr = cfg["kv_lora_rank"]
    eps = cfg["rms_norm_eps"]
    theta = cfg["rope_parameters"]["rope_theta"]
    scale = (nope + rope) ** -0.5
    nih, dih, topk_n = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    T = len(ids)
    x = [list(W["model.embed_tokens.weight"][i]) for i in ids]
    prev_sel = None
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = [rmsnorm(xt, W[p + "input_layernorm.weight"], eps) for xt in x]
        # MLA
        cq = [rmsnorm(linear(W[p + "self_attn.q_a_proj.weight"], at), W[p + "self_attn.q_a_layernorm.weight"], 1e-6)
              for at in a]
        qs, ks, vs = [], [], []
        for t in range(T):
            q = linear(W[p + "self_attn.q_b_proj.weight"], cq[t])
            ckv = linear(W[p + "self_attn.kv_a_proj_with_mqa.weight"], a[t])
            c = rmsnorm(ckv[:kvr], W[p + "self_attn.kv_a_layernorm.weight"], 1e-6)
            kpe = rope_interleave(ckv[kvr:], t, theta)
            kv = linear(W[p + "self_attn.kv_b_proj.weight"], c)
            qh, kh, vh = [], [], []
            for h in range(nh):
                qq = q[h * (nope + rope):(h + 1) * (nope + rope)]
                qh.append(qq[:nope] + rope_interleave(qq[nope:], t, theta))
                kk = kv[h * (nope + vd):(h + 1) * (nope + vd)]
                kh.append(kk[:nope] + kpe)
                vh.append(kk[nope:])
            qs.append(qh)
            ks.append(kh)
            vs.append(vh)
        # DSA indexer (or reuse of the previous full layer's selection)
        if cfg["indexer_types"][l] == "full":
            ki = []
            for t in range(T):
                k = layernorm(linear(W[p + "self_attn.indexer.wk.weight"], a[t]),
                              W[p + "self_attn.indexer.k_norm.weight"], W[p + "self_attn.indexer.k_norm.bias"], 1e-6)
                ki.append(rope_interleave(k[:rope], t, theta) + k[rope:])
            sel = []
            for s in range(T):
                qi = linear(W[p + "self_attn.indexer.wq_b.weight"], cq[s])
                w = [v * nih ** -0.5 for v in linear(W[p + "self_attn.indexer.weights_proj.weight"], a[s])]
                qh = [qi[h * dih:(h + 1) * dih] for h in range(nih)]
                qh = [rope_interleave(qq[:rope], s, theta) + qq[rope:] for qq in qh]
                sc = [(sum(w[h] * max(0.0, dot(qh[h], ki[t]) * dih ** -0.5) for h in range(nih)), t)
                      for t in range(s + 1)]
                sc.sort(key=lambda z: -z[0])
                sel.append({t for _, t in sc[:min(topk_n, T)]})
            prev_sel = sel
        else:
            sel = prev_sel
        attn = []
        for s in range(T):
            out = []
            allowed = sorted(sel[s])
            for h in range(nh):
                lg = [dot(qs[s][h], ks[t][h]) * scale for t in allowed]
                m = max(lg)
                e = [math.exp(v - m) for v in lg]
                z = sum(e)
                o = [0.0] * vd
                for pe, t in zip(e, allowed):
                    for j in range(vd):
                        o[j] += pe / z * vs[t][h][j]
                out += o
            attn.append(linear(W[p + "self_attn.o_proj.weight"], out))
        x = [[u + v for u, v in zip(xt, at)] for xt, at in zip(x, attn)]
        # MLP / MoE
        mm = [rmsnorm(xt, W[p + "post_attention_layernorm.weight"], eps) for xt in x]
        mlp_types = cfg.get("mlp_layer_types") or (["dense"] * cfg["first_k_dense_replace"] + ["sparse"] * 999)

        def swiglu(pre, v):
            g = linear(W[pre + "gate_proj.weight"], v)
            u = linear(W[pre + "up_proj.weight"], v)
            return linear(W[pre + "down_proj.weight"], [silu(gi) * ui for gi, ui in zip(g, u)])

        ys = []
        for v in mm:
            if mlp_types[l] == "dense":
                ys.append(swiglu(p + "mlp.", v))
                continue
            sc = [1.0 / (1.0 + math.exp(-z)) for z in linear(W[p + "mlp.gate.weight"], v)]
            bias = W[p + "mlp.gate.e_score_correction_bias"]
            order = sorted(range(len(sc)), key=lambda e: -(sc[e] + bias[e]))[:cfg["num_experts_per_tok"]]
            wts = [sc[e] for e in order]
            if cfg["norm_topk_prob"]:
                z = sum(wts) + 1e-20
                wts = [w / z for w in wts]
            wts = [w * cfg["routed_scaling_factor"] for w in wts]
            y = swiglu(p + "mlp.shared_experts.", v)
            for e, w in zip(order, wts):
                ye = swiglu(p + f"mlp.experts.{e}.", v)
                y = [a_ + w * b_ for a_, b_ in zip(y, ye)]
            ys.append(y)
        x = [[u + v for u, v in zip(xt, yt)] for xt, yt in zip(x, ys)]
    return [linear(W["lm_head.weight"], rmsnorm(xt, W["model.norm.weight"], eps)) for xt in x]


def check(d, greedy_n=0):
    cfg = json.load(open(os.path.join(d, "config.json")))
    ref = json.load(open(os.path.join(d, "reference.json")))
    assert cfg.get("n_group", 1) == 1, "group-limited routing not implemented here"
    W = load_tensors(d)
    ids = ref["prompt_ids"]
    logits = forward(cfg, W, ids)
    T, V = ref["logits_shape"]
    with open(os.path.join(d, ref["logits_file"]), "rb") as f:
        flat = struct.unpack(f"<{T * V}f", f.read())
    want = [flat[i * V:(i + 1) * V] for i in range(T)]
    mx = max(abs(v) for row in want for v in row)
    diff = max(abs(a - b) for ra, rb in zip(logits, want) for a, b in zip(ra, rb))
    rel = diff / mx
    ok = rel <= 1e-4
    got_greedy = []
    seq = list(ids)
    last = logits[-1]
    for i in range(greedy_n):
        nxt = max(range(V), key=lambda j: last[j])
        got_greedy.append(nxt)
        seq.append(nxt)
        if i + 1 < greedy_n:
            last = forward(cfg, W, seq)[-1]
    g_ok = got_greedy == ref["greedy_ids"][:greedy_n]
    print(f"{os.path.basename(d)}: prompt logits rel diff {rel:.2e} ({'ok' if ok else 'FAIL'})"
          + (f", first {greedy_n} greedy ids {'match' if g_ok else 'DIFFER'}" if greedy_n else ""))
    return ok and g_ok


def main():
    args = sys.argv[1:]
    greedy_n = 0
    if "--greedy" in args:
        i = args.index("--greedy")
        greedy_n = int(args[i + 1])
        del args[i:i + 2]
    if not args:
        root = "tests/golden"
        args = [os.path.join(root, n) for n in sorted(os.listdir(root)) if n.startswith("tiny-")]
    bad = [d for d in args if not check(d, greedy_n)]
    print(f"{len(args) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
