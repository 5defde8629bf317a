#!/usr/bin/env python3
"""Builds the quantized-checkpoint golden fixtures tests/golden/tiny-int4mix and tiny-nvfp4.

Runs where make_golden.py runs (PyTorch + transformers 5.17 with `glm_moe_dsa`, `safetensors`;
CPU fp32 math) and reuses its machinery (model construction, seeds, evaluation, reference.json):
a tiny random GlmMoeDsaForCausalLM is quantized with our packer (the same rules as
engine/weights/safetensors_writer.cc AddPackQuantized / AddNvfp4Quantized, specs in
../shared/specs/quantized-checkpoints.md) and the reference logits / greedy ids are transformers'
on the EXACTLY DEQUANTIZED weights (written as fp32 to a temp dir and loaded from there).

  tiny-int4mix  compressed-tensors pack-quantized (QuantTrio Int4-Int8Mix precision map, scaled
                down): layer 0 unquantized; routed experts INT4 group 16; attention, dense MLP and
                shared experts INT8 group 16; the last layer's attention INT8 per channel (the MTP
                layer's scheme); routers and indexers ignored. config.json quantization_config.
  tiny-nvfp4    ModelOpt NVFP4 routed experts (e2m1 + E4M3 per 16 + F32 weight_scale_2 +
                input_scale), up projections with a global scale 3x the gate's; everything else
                unquantized. hf_quant_config.json + config.json quantization_config (modelopt).

Group sizes are 16 (not 128) so the tiny shapes hold several groups; moe_intermediate_size 64
keeps tensor-parallel column slices (TP 2 and 4) on group boundaries.

Usage (on the GPU machine, from the repo root):
  python3 tools/golden/make_quantized_golden.py --out $OUT/golden [--only tiny-int4mix]
then here: copy $OUT/golden/tiny-int4mix and tiny-nvfp4 into tests/golden/.
"""
import argparse
import json
import math
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402

GROUP = 16

# Tiny shapes whose linear input dims are multiples of 16 (tiny-fp8's, with wider experts).
QUANT_CFG = mg.base_cfg(hidden_size=160, intermediate_size=320, moe_intermediate_size=64,
                        q_lora_rank=96, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
                        v_head_dim=32, index_n_heads=2, index_head_dim=32)

EXPERTS = re.compile(r".*mlp\.experts\.\d+\.(gate|up|down)_proj$")
ATTN = r"self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)$"
LINEARS = [re.compile(r".*" + ATTN), re.compile(r".*mlp\.(gate|up|down)_proj$"),
           re.compile(r".*mlp\.shared_experts\.(gate|up|down)_proj$")]


def int4mix_scheme(cfg):
    """module -> (bits, group) or None, and the matching compressed-tensors quantization_config."""
    last = cfg["num_hidden_layers"] - 1
    last_attn = re.compile(rf"model\.layers\.{last}\." + ATTN)

    def scheme(module):
        if module.startswith("model.layers.0."):
            return None
        if EXPERTS.match(module):
            return (4, GROUP)
        if last_attn.match(module):
            return (8, 0)
        if any(p.match(module) for p in LINEARS):
            return (8, GROUP)
        return None

    def weights(bits, group):
        w = {"num_bits": bits, "type": "int", "symmetric": True, "dynamic": False, "actorder": None}
        w.update({"strategy": "group", "group_size": group} if group else
                 {"strategy": "channel", "group_size": -1})
        return w

    qc = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None,
        "config_groups": {
            "w4a16_experts": {"targets": [r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"],
                              "weights": weights(4, GROUP)},
            "w8a16_channel": {"targets": [rf"re:model\.layers\.{last}\." + ATTN],
                              "weights": weights(8, 0)},
            "w8a16_linears": {"targets": ["re:.*" + ATTN, r"re:.*mlp\.(gate|up|down)_proj$",
                                          r"re:.*mlp\.shared_experts\.(gate|up|down)_proj$"],
                              "weights": weights(8, GROUP)},
        },
        "ignore": [r"re:model\.layers\.0\..*", r"re:.*mlp\.gate$", r"re:.*self_attn\.indexer\..*",
                   "lm_head"],
    }
    return scheme, qc


NVFP4_EXCLUDE = ["lm_head", "model.embed_tokens", "model.layers.*.self_attn*",
                 "model.layers.*.mlp.shared_experts*", "model.layers.*.mlp.gate",
                 "model.layers.0.mlp*"]


# ----------------------------------------------------------------------------------------------
# The packer (bit-for-bit the rules of safetensors_writer.cc)
# ----------------------------------------------------------------------------------------------

def pack_quantize(w, bits, group):
    """Symmetric INT4/INT8, scale = bf16(absmax / 7.5 or / 127.5) per `group` inputs (0: per row),
    q = clamp(round_half_even(w / scale)). Returns (weight_packed I32 [O, ceil(I*bits/32)],
    weight_scale BF16 [O, groups], weight_shape I64 [2], dequantized fp32 [O, I])."""
    w = w.float()
    O, I = w.shape
    g = group if group > 0 else I
    ng = (I + g - 1) // g
    pad = torch.zeros(O, ng * g, dtype=torch.float32)
    pad[:, :I] = w
    blocks = pad.view(O, ng, g)
    amax = blocks.abs().amax(dim=-1)
    half = 7.5 if bits == 4 else 127.5
    scale = torch.where(amax > 0, amax / half, torch.ones_like(amax))
    scale = scale.to(torch.bfloat16).to(torch.float32)
    qmax = 2 ** (bits - 1) - 1
    q = torch.round(blocks / scale[..., None]).clamp(-qmax - 1, qmax)
    deq = (q * scale[..., None]).reshape(O, ng * g)[:, :I].contiguous()
    q = q.reshape(O, ng * g)[:, :I].to(torch.int64)
    per = 32 // bits
    words = (I + per - 1) // per
    u = torch.zeros(O, words * per, dtype=torch.int64)
    u[:, :I] = q + 2 ** (bits - 1)
    u = u.view(O, words, per)
    packed = torch.zeros(O, words, dtype=torch.int64)
    for j in range(per):
        packed |= u[..., j] << (bits * j)
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)
    shape = torch.tensor([O, I], dtype=torch.int64)
    return packed.contiguous(), scale.to(torch.bfloat16).contiguous(), shape, deq


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)


def nearest_e2m1(x):
    """Code (sign in bit 3) of the nearest e2m1 value, ties to the even code, saturating at 6."""
    m = x.abs().clamp(max=6.0)
    dist = (m[..., None] - E2M1).abs()
    best = dist.min(dim=-1, keepdim=True).values
    ties = dist == best
    even = ties & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(dim=-1), even.float().argmax(dim=-1), ties.float().argmax(dim=-1))
    return code + 8 * (x < 0).to(torch.int64)


def nvfp4_quantize(w, scale_2=None, input_scale=1.0):
    """ModelOpt NVFP4: weight_scale_2 = amax / (6 * 448) unless given; per 16 inputs
    weight_scale = e4m3(amax / (6 * weight_scale_2)), at least 2^-9 (1 for a zero block); codes =
    nearest e2m1 of w / (weight_scale * weight_scale_2). Returns (weight U8 [O, I/2],
    weight_scale F8_E4M3 [O, I/16], weight_scale_2 F32 [], input_scale F32 [], dequantized)."""
    w = w.float()
    O, I = w.shape
    assert I % GROUP == 0, (O, I)
    if scale_2 is None:
        amax = w.abs().max()
        scale_2 = torch.where(amax > 0, amax / (6.0 * 448.0), torch.ones_like(amax))
    s2 = torch.as_tensor(scale_2, dtype=torch.float32)
    blocks = w.view(O, I // GROUP, GROUP)
    bamax = blocks.abs().amax(dim=-1)
    raw = torch.where(bamax > 0, bamax / (6.0 * s2), torch.ones_like(bamax)).clamp(max=448.0)
    bs = raw.to(torch.float8_e4m3fn).to(torch.float32)
    bs = torch.where(bs < 2.0 ** -9, torch.full_like(bs, 2.0 ** -9), bs)
    codes = nearest_e2m1(blocks / (bs * s2)[..., None])  # [O, I/16, 16]
    mag = E2M1[codes & 7]
    signed = torch.where((codes & 8) != 0, -mag, mag)
    deq = ((signed * bs[..., None]) * s2).reshape(O, I).contiguous()
    flat = codes.reshape(O, I)
    packed = (flat[:, 0::2] | (flat[:, 1::2] << 4)).to(torch.uint8).contiguous()
    return (packed, bs.to(torch.float8_e4m3fn).contiguous(), s2.reshape(()).clone(),
            torch.tensor(input_scale, dtype=torch.float32), deq)


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------

QFIXTURES = {
    "tiny-int4mix": dict(cfg=QUANT_CFG, prompt_len=14, seed=7000, quant="int4mix",
                         notes="compressed-tensors pack-quantized (QuantTrio Int4-Int8Mix map, group 16): "
                               "weight_packed I32 (low bits first, offset 8 / 128), weight_scale BF16 "
                               "[out, in/16] or [out, 1] (layer 2 attention, per channel), weight_shape I64. "
                               "Layer 0, routers, indexers, norms, embeddings and lm_head unquantized (fp32). "
                               "Reference = fp32 model on the DEQUANTIZED weights q * scale."),
    "tiny-nvfp4": dict(cfg=QUANT_CFG, prompt_len=14, seed=8000, quant="nvfp4",
                       notes="ModelOpt NVFP4 routed experts: weight U8 (two e2m1, low nibble first), "
                             "weight_scale F8_E4M3 [out, in/16], weight_scale_2 F32 (up_proj 3x gate_proj), "
                             "input_scale F32 (unused, weight-only). Everything else fp32. Reference = fp32 "
                             "model on the DEQUANTIZED weights (e2m1 * weight_scale) * weight_scale_2."),
}

_build_plain = mg.build_checkpoint


def build_checkpoint(spec, seed, d, vocab=None, extra_json=None):
    """make_golden's build_checkpoint, then the fp32 tensors re-written quantized in `d` and the
    dequantized twin in a temp dir (the reference's ref_dir)."""
    if "quant" not in spec:
        return _build_plain(spec, seed, d, vocab=vocab, extra_json=extra_json)
    from safetensors.torch import load_file, save_file
    meta = _build_plain({k: v for k, v in spec.items() if k != "quant"}, seed, d, vocab=vocab,
                        extra_json=extra_json)
    files = [f for f in meta["files"] if f.endswith(".safetensors")]
    tensors = {}
    for f in files:
        tensors.update(load_file(os.path.join(d, f)))
        os.remove(os.path.join(d, f))
    cdict = dict(meta["config_json"])
    quantized, deq, qt = [], {}, {}
    if spec["quant"] == "int4mix":
        scheme, qc = int4mix_scheme(cdict)
    else:
        scheme = lambda m: (4, GROUP) if (EXPERTS.match(m) and not m.startswith("model.layers.0.")) else None  # noqa: E731
        qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": GROUP,
              "kv_cache_scheme": None, "ignore": NVFP4_EXCLUDE}
    for k in sorted(tensors):
        v = tensors[k]
        module = k[: -len(".weight")] if k.endswith(".weight") else None
        s = scheme(module) if (module is not None and v.dim() == 2) else None
        if s is None:
            qt[k] = v
            deq[k] = v
            continue
        quantized.append(module)
        if spec["quant"] == "int4mix":
            packed, scale, shape, dq = pack_quantize(v, *s)
            qt[module + ".weight_packed"] = packed
            qt[module + ".weight_scale"] = scale
            qt[module + ".weight_shape"] = shape
        else:
            scale_2 = None
            if module.endswith("up_proj"):
                scale_2 = 3.0 * v.float().abs().max() / (6.0 * 448.0)
            w, bs, s2, inp, dq = nvfp4_quantize(v, scale_2=scale_2)
            qt[k] = w
            qt[module + ".weight_scale"] = bs
            qt[module + ".weight_scale_2"] = s2
            qt[module + ".input_scale"] = inp
        deq[k] = dq
    cdict["quantization_config"] = qc
    mg.write_config(cdict, d)
    if spec["quant"] == "nvfp4":
        with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
            json.dump({"producer": {"name": "modelopt", "version": "0.46.0"},
                       "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                        "group_size": GROUP, "exclude_modules": NVFP4_EXCLUDE}},
                      f, indent=2, sort_keys=True)
    save_file(qt, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    ref_dir = tempfile.mkdtemp(prefix="deq_")
    plain = dict(cdict)
    plain.pop("quantization_config")
    mg.write_config(plain, ref_dir)
    mg.save_tensors(deq, ref_dir, 1)
    meta["files"] = ["model.safetensors"] + (["hf_quant_config.json"] if spec["quant"] == "nvfp4" else [])
    meta["ref_dir"] = ref_dir
    meta["inmem_model"] = None
    meta["quantized_modules"] = quantized
    meta["config_json"] = cdict
    return meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="directory to write tiny-int4mix/ and tiny-nvfp4/ into")
    ap.add_argument("--only", default=None, help="comma-separated fixture names")
    args = ap.parse_args()
    mg.setup_torch()
    mg.build_checkpoint = build_checkpoint  # run_fixture -> build_and_verify looks it up here
    only = set(args.only.split(",")) if args.only else None
    os.makedirs(args.out, exist_ok=True)
    for name, spec in QFIXTURES.items():
        if only and name not in only:
            continue
        mg.CONVERSION.update({"mode": "per_expert", "history": []})
        mg.log(f"{name}: building")
        extra = {"generator": f"tools/golden/make_quantized_golden.py --only {name} "
                              "(see tests/golden/README.md)",
                 "quantization": spec["quant"], "group_size": GROUP}
        mg.run_fixture(name, spec, args.out, extra_ref=extra)
    mg.log("done")


if __name__ == "__main__":
    main()
