#!/usr/bin/env python3
"""Builds the reference fixtures under tests/golden/ from HF transformers' GlmMoeDsaForCausalLM.

Runs on the GPU machine (PyTorch + transformers 5.17 with `glm_moe_dsa`, `tokenizers`,
`safetensors`); no network. All model math runs in fp32 on the CPU (eager attention,
model.eval(), torch.no_grad) so the reference is deterministic; the GPU is not needed.

What it writes (under --out):
  tokenizer/            tokenizer.json trained here + reference.json (encodings of the corpus)
  tiny-*/               config.json, *.safetensors (+ index), reference.json, logits.f32
and under --src-dump a copy of the installed transformers sources that matter (modeling,
configuration, cache, masking, MoE/fp8 integrations) for tests/golden/HF_NOTES.md.

Checkpoints are written by hand in the layout of the real GLM-5 releases (one tensor per routed
expert: mlp.experts.<e>.{gate,up,down}_proj.weight), then loaded back with from_pretrained; the
reference numbers come from that reloaded model, so the files and the numbers agree.

Usage: python3 make_golden.py --out DIR [--src-dump DIR] [--only a,b] [--corpus PATH]
"""
import argparse
import inspect
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import traceback

import torch

GEN_LEN = 32
SEEDS_PER_FIXTURE = 10
# Margins under which the engine (fp32, other summation order) could pick differently.
MIN_GREEDY_MARGIN = 2e-3  # absolute logit gap top1 - top2
MIN_ROUTER_GAP = 2e-4  # gap between the k-th and (k+1)-th biased router score (scores in (0,1)+bias)
MIN_INDEXER_REL_GAP = 1e-4
MASKED = -1e30  # index/router scores at or below this are masked-out positions  # gap between k-th and (k+1)-th index score / max |score| of the call

SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
]
GLM_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LOG_T0 = time.time()


def log(*a):
    print(f"[{time.time() - LOG_T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------

def setup_torch():
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)


def versions():
    import transformers
    v = {"torch_version": torch.__version__, "transformers_version": transformers.__version__}
    try:
        import safetensors
        v["safetensors_version"] = safetensors.__version__
    except Exception:
        pass
    return v


# ----------------------------------------------------------------------------------------------
# Source dump (for HF_NOTES.md)
# ----------------------------------------------------------------------------------------------

def dump_sources(dst):
    import transformers
    os.makedirs(dst, exist_ok=True)
    root = os.path.dirname(transformers.__file__)
    wanted = [
        "models/glm_moe_dsa",
        "models/deepseek_v32",
        "models/deepseek_v3/modeling_deepseek_v3.py",
        "cache_utils.py",
        "masking_utils.py",
        "modeling_rope_utils.py",
        "integrations/moe.py",
        "integrations/finegrained_fp8.py",
        "quantizers/quantizer_finegrained_fp8.py",
        "conversion_mapping.py",
        "core_model_loading.py",
        "generation/utils.py",
    ]
    for rel in wanted:
        src = os.path.join(root, rel)
        if os.path.isdir(src):
            for fn in sorted(os.listdir(src)):
                if fn.endswith(".py"):
                    out = os.path.join(dst, rel.replace("/", "__") + "__" + fn)
                    shutil.copy(os.path.join(src, fn), out)
        elif os.path.exists(src):
            shutil.copy(src, os.path.join(dst, rel.replace("/", "__")))
        else:
            log("source not found:", rel)
    # Where does 'glm_moe_dsa' show up elsewhere (conversion mappings, auto maps)?
    hits = []
    for dirpath, _, files in os.walk(root):
        for fn in files:
            if not fn.endswith(".py"):
                continue
            p = os.path.join(dirpath, fn)
            try:
                with open(p, encoding="utf-8") as f:
                    for i, line in enumerate(f, 1):
                        if "glm_moe_dsa" in line or "GlmMoeDsa" in line or "update_indexer" in line:
                            hits.append(f"{os.path.relpath(p, root)}:{i}: {line.rstrip()}")
            except Exception:
                pass
    with open(os.path.join(dst, "grep_glm_moe_dsa.txt"), "w") as f:
        f.write("\n".join(hits) + "\n")
    with open(os.path.join(dst, "versions.json"), "w") as f:
        json.dump(versions(), f, indent=1)
    log("dumped sources to", dst)


# ----------------------------------------------------------------------------------------------
# Tokenizer (Task B)
# ----------------------------------------------------------------------------------------------

def build_tokenizer(corpus_path, out_dir, vocab_total=1024):
    import tokenizers
    from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers

    os.makedirs(out_dir, exist_ok=True)
    with open(corpus_path, encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f]
    # Train on chunks of 4 lines so newlines inside text are seen too.
    chunks = ["\n".join(lines[i:i + 4]) + "\n" for i in range(0, len(lines), 4)]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_total - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(chunks, trainer=trainer)
    base = tok.get_vocab_size(with_added_tokens=False)
    # Like GLM: the special tokens come after the BPE vocabulary.
    tok.add_special_tokens(SPECIAL_TOKENS)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path, pretty=True)
    tok = Tokenizer.from_file(path)  # reference comes from the saved file
    total = tok.get_vocab_size(with_added_tokens=True)
    log(f"tokenizer: base vocab {base}, total {total}")

    def enc(text):
        e = tok.encode(text)
        ids = list(e.ids)
        dec = tok.decode(ids, skip_special_tokens=False)
        return {
            "text": text,
            "ids": ids,
            "tokens": list(e.tokens),
            "decoded": dec,
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            "roundtrip": dec == text,
        }

    cases = [dict(enc(l), kind="line", line_no=i + 1) for i, l in enumerate(lines)]
    multi = []
    for i in range(0, min(len(lines), 60), 6):
        multi.append("\n".join(lines[i:i + 6]))
    multi += [
        "\n".join(lines[10:14]) + "\n\n\n" + "\n".join(lines[20:23]) + "\n",
        "\r\n".join(lines[30:34]) + "\r\n",
        "line one\n\n\n\nline two\n \n\t\nline three   \n",
        "[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\nWhat's 2+2? 你好！\n<|assistant|>\n",
        "def f(x):\n    if x:\n\t\treturn [x,  x]\n    return None\n\n\n",
    ]
    cases += [dict(enc(t), kind="multiline") for t in multi]
    extra = [
        "", " ", "  ", "\n", "\n\n", "\r\n", "\t", " \n ", "a", "A", "'s", "'S", "don't", "DON'T",
        "<|user|>", "<|user|><|user|>", "hello<|endoftext|>world", "<|endoftext|> leading space",
        "<|use", "[gMASK", "<sop>x<eop>", "🤖🤖🤖", "👨‍👩‍👧", "\u0301", "e\u0301", "\u00e9",
        "日本語とEnglish混在text123abc", "x" * 200, "1234567890123", "12 345 6789",
        "  leading and trailing  ", "tab\there", "a  b   c    d", "¿¡ «» „“ ‚‘",
        "\U0001F600\U0001F601 end", "zero\u200bwidth", "ｶﾀｶﾅ", "Ⅻ ⅻ ½ ²³", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝓂𝒶𝓉𝒽",
    ]
    cases += [dict(enc(t), kind="edge") for t in extra]
    ref = {
        "tokenizer_file": "tokenizer.json",
        "tokenizers_version": tokenizers.__version__,
        "vocab_size": total,
        "base_vocab_size": base,
        "added_tokens": [{"id": tok.token_to_id(t), "content": t, "special": True} for t in SPECIAL_TOKENS],
        "pre_tokenizer_regex": GLM_SPLIT_REGEX,
        "generator": "tools/golden/make_golden.py (build_tokenizer), corpus tests/golden/tokenizer/corpus.txt",
        "notes": "ids = Tokenizer.from_file('tokenizer.json').encode(text).ids (add_special_tokens=True; "
                 "there is no post-processor, so nothing is added). decoded = decode(ids, "
                 "skip_special_tokens=False). Trained with BpeTrainer(min_frequency=2, byte-level "
                 "initial alphabet) on 4-line chunks of the corpus; special tokens added after training.",
        "cases": cases,
    }
    with open(os.path.join(out_dir, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1, default=str)
    bad = [c for c in cases if not c["roundtrip"]]
    log(f"tokenizer: {len(cases)} cases, {len(bad)} not round-tripping")
    return tok


# ----------------------------------------------------------------------------------------------
# Model helpers
# ----------------------------------------------------------------------------------------------

def hf_classes():
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
    return GlmMoeDsaConfig, GlmMoeDsaForCausalLM


def new_model(cfg):
    _, Model = hf_classes()
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    try:
        m = Model._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        m = Model(cfg)
    return m.float().eval()


def load_model(path):
    _, Model = hf_classes()
    kw = dict(attn_implementation="eager", dtype=torch.float32, output_loading_info=True)
    try:
        m, info = Model.from_pretrained(path, experts_implementation="eager", **kw)
    except Exception as e:  # older/newer signature
        log("from_pretrained with experts_implementation failed:", repr(e)[:200])
        m, info = Model.from_pretrained(path, **kw)
    m = m.float().eval()
    return m, {k: (sorted(v) if isinstance(v, (set, list)) else str(v)) for k, v in info.items()}


def init_weights(model, seed, gain=1.0, lm_gain=2.0, bias_std=0.1):
    """Re-initialises every floating tensor of the state dict so all parts matter."""
    g = torch.Generator().manual_seed(seed)
    sd = model.state_dict()
    unknown = []
    with torch.no_grad():
        for name in sorted(sd):
            t = sd[name]
            if not t.is_floating_point():
                continue

            def rn():
                return torch.randn(tuple(t.shape), generator=g, dtype=torch.float64).to(torch.float32)

            if name.endswith("e_score_correction_bias"):
                v = bias_std * rn()
            elif t.dim() == 1 and name.endswith(".weight") and "norm" in name:
                v = 1.0 + 0.2 * rn()
            elif t.dim() == 1 and name.endswith(".bias"):
                v = 0.1 * rn()
            elif name.endswith("embed_tokens.weight"):
                v = rn()
            elif name.endswith("lm_head.weight"):
                v = rn() * (lm_gain / math.sqrt(t.shape[-1]))
            elif t.dim() >= 2:
                v = rn() * (gain / math.sqrt(t.shape[-1]))
            else:
                unknown.append(name)
                v = 1.0 + 0.2 * rn()
            t.copy_(v)
    if unknown:
        log("init: tensors with a guessed init:", unknown)
    return unknown


def checkpoint_tensors(model, cfg):
    """State dict -> tensors named as in the real GLM checkpoints (per-expert weights)."""
    sd = model.state_dict()
    out = {}
    mode = CONVERSION["mode"]
    swap_gate_up = mode == "per_expert_swapped"
    H, I = cfg.hidden_size, cfg.moe_intermediate_size
    for k, v in sd.items():
        if "rotary_emb" in k:
            continue
        m = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", k)
        if m and v.dim() == 3 and mode != "native":
            pre, kind = m.group(1), m.group(2)
            E = v.shape[0]
            if kind == "gate_up_proj":
                if tuple(v.shape[1:]) == (2 * I, H):
                    a, b = v[:, :I, :], v[:, I:, :]
                elif tuple(v.shape[1:]) == (H, 2 * I):
                    a, b = v[:, :, :I].transpose(1, 2), v[:, :, I:].transpose(1, 2)
                else:
                    raise RuntimeError(f"unexpected {k} shape {tuple(v.shape)}")
                gate, up = (b, a) if swap_gate_up else (a, b)
                for e in range(E):
                    out[f"{pre}.{e}.gate_proj.weight"] = gate[e].contiguous().clone()
                    out[f"{pre}.{e}.up_proj.weight"] = up[e].contiguous().clone()
            else:
                if tuple(v.shape[1:]) == (H, I):
                    d = v
                elif tuple(v.shape[1:]) == (I, H):
                    d = v.transpose(1, 2)
                else:
                    raise RuntimeError(f"unexpected {k} shape {tuple(v.shape)}")
                for e in range(E):
                    out[f"{pre}.{e}.down_proj.weight"] = d[e].contiguous().clone()
        else:
            out[k] = v.detach().contiguous().clone()
    return out


def tensor_nbytes(t):
    return t.numel() * t.element_size()


def save_tensors(tensors, d, shards=1):
    from safetensors.torch import save_file
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k] for k in names}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    total = sum(tensor_nbytes(tensors[k]) for k in names)
    groups, cur, acc = [], [], 0
    for k in names:
        cur.append(k)
        acc += tensor_nbytes(tensors[k])
        if len(groups) < shards - 1 and acc >= total * (len(groups) + 1) / shards:
            groups.append(cur)
            cur = []
    groups.append(cur)
    files, wmap = [], {}
    for i, g in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k] for k in g}, os.path.join(d, fn), metadata={"format": "pt"})
        files.append(fn)
        for k in g:
            wmap[k] = fn
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2, sort_keys=True)
    return files + ["model.safetensors.index.json"]


def config_dict(cfg, extra):
    d = cfg.to_dict()
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    d["architectures"] = ["GlmMoeDsaForCausalLM"]
    d["model_type"] = "glm_moe_dsa"
    if "torch_dtype" in d:
        d["torch_dtype"] = "float32"
    d["dtype"] = "float32"
    d.update(extra)
    return d


def write_config(d, path):
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)


# ----------------------------------------------------------------------------------------------
# FP8 block quantisation
# ----------------------------------------------------------------------------------------------

FP8_QUANT_PATTERNS = [
    r"self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)\.weight$",
    r"self_attn\.indexer\.(wq_b|wk)\.weight$",
    r"mlp\.(gate_proj|up_proj|down_proj)\.weight$",
    r"mlp\.shared_experts\.(gate_proj|up_proj|down_proj)\.weight$",
    r"mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.weight$",
]


def fp8_quantize_block(w, block=128):
    O, I = w.shape
    bo, bi = (O + block - 1) // block, (I + block - 1) // block
    pad = torch.zeros(bo * block, bi * block, dtype=torch.float32)
    pad[:O, :I] = w
    blocks = pad.view(bo, block, bi, block)
    amax = blocks.abs().amax(dim=(1, 3))  # [bo, bi]
    scale = amax / 448.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q = q.view(bo * block, bi * block)[:O, :I].contiguous()
    s_full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:O, :I]
    deq = q.to(torch.float32) * s_full
    return q, scale.contiguous(), deq.contiguous()


# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------

class TopkRecorder:
    """Records, per call site tag, the gap between the k-th and (k+1)-th largest value of topk."""

    def __init__(self):
        self.active = False
        self.tags = []
        self.gaps = {}  # tag -> list of (abs_gap, rel_gap)
        self._orig_t = torch.Tensor.topk
        self._orig_f = torch.topk

    def _record(self, x, args, kwargs):
        if not self.active or not self.tags or not x.is_floating_point():
            return
        k = args[0] if args else kwargs.get("k")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
        largest = args[2] if len(args) > 2 else kwargs.get("largest", True)
        if k is None or not largest or x.shape[dim] <= k or k < 1:
            return
        xf = x.detach().float()
        vals = self._orig_t(xf, k + 1, dim=dim).values
        kth, nxt = vals.select(dim, k - 1), vals.select(dim, k)
        # Masked positions carry finfo.min (eager causal mask) or -inf: ties among them are harmless.
        fin = torch.isfinite(kth) & torch.isfinite(nxt) & (kth > MASKED) & (nxt > MASKED)
        if not bool(fin.any()):
            return
        gap = (kth - nxt)[fin]
        finite_vals = xf[torch.isfinite(xf) & (xf > MASKED)]
        scale = float(finite_vals.abs().max()) if finite_vals.numel() else 1.0
        mg = float(gap.min())
        self.gaps.setdefault(self.tags[-1], []).append((mg, mg / max(scale, 1e-30)))

    def install(self):
        rec = self

        def t_topk(x, *args, **kwargs):
            rec._record(x, args, kwargs)
            return rec._orig_t(x, *args, **kwargs)

        def f_topk(x, *args, **kwargs):
            rec._record(x, args, kwargs)
            return rec._orig_f(x, *args, **kwargs)

        torch.Tensor.topk = t_topk
        torch.topk = f_topk

    def uninstall(self):
        torch.Tensor.topk = self._orig_t
        torch.topk = self._orig_f

    def hook(self, model):
        handles = []
        for _, mod in model.named_modules():
            cn = type(mod).__name__
            tag = "indexer" if "Indexer" in cn else ("router" if (cn.endswith("MoE") or "Router" in cn) else None)
            if tag is None:
                continue

            def pre(m, a, tag=tag):
                self.tags.append(tag)

            def post(m, a, o):
                if self.tags:
                    self.tags.pop()

            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post))
        return handles

    def summary(self):
        s = {}
        for tag, lst in self.gaps.items():
            s[tag] = {"min_abs_gap": min(a for a, _ in lst), "min_rel_gap": min(r for _, r in lst), "calls": len(lst)}
        return s


def indexer_capture(model):
    """Forward hooks that keep each indexer's top-k output: layer -> LongTensor [S, k]."""
    got, handles = {}, []
    for name, mod in model.named_modules():
        if "Indexer" not in type(mod).__name__:
            continue
        m = re.search(r"layers\.(\d+)\.", name + ".")
        layer = int(m.group(1)) if m else name

        def post(mm, a, o, layer=layer):
            outs = o if isinstance(o, (tuple, list)) else (o,)
            for t in outs:
                if isinstance(t, torch.Tensor) and not t.is_floating_point():
                    got[layer] = t.detach()[0].clone()
                    return

        handles.append(mod.register_forward_hook(post))
    return got, handles


@torch.no_grad()
def greedy_nocache(model, prompt, n):
    ids = list(prompt)
    margins = []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
        top2 = logits.topk(2)
        margins.append(float(top2.values[0] - top2.values[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], margins


@torch.no_grad()
def quick_eval(model, cases, n):
    """Greedy (no cache) for each case + top-k gaps on the full final sequences."""
    rec = TopkRecorder()
    handles = rec.hook(model)
    rec.install()
    res = []
    try:
        for prompt in cases:
            g, margins = greedy_nocache(model, prompt, n)
            rec.active = True
            model(input_ids=torch.tensor([list(prompt) + g[:-1]]), use_cache=False)
            rec.active = False
            res.append((g, margins))
    finally:
        rec.uninstall()
        for h in handles:
            h.remove()
    return res, rec.summary()


def score_of(res, gaps):
    greedy = min(min(m) for _, m in res)
    s = greedy / MIN_GREEDY_MARGIN
    if "router" in gaps:
        s = min(s, gaps["router"]["min_abs_gap"] / MIN_ROUTER_GAP)
    if "indexer" in gaps:
        s = min(s, gaps["indexer"]["min_rel_gap"] / MIN_INDEXER_REL_GAP)
    return s, greedy


def hf_introspection(model):
    info = {"norm_eps": {}, "classes": {}}
    for name, mod in model.named_modules():
        cn = type(mod).__name__
        key = re.sub(r"layers\.\d+\.", "layers.N.", name)
        info["classes"].setdefault(cn, key)
        eps = getattr(mod, "variance_epsilon", None)
        if eps is None:
            eps = getattr(mod, "eps", None)
        if eps is not None and ("Norm" in cn or "norm" in name):
            info["norm_eps"][f"{key} ({cn})"] = float(eps)
        if "Attention" in cn and hasattr(mod, "scaling"):
            info["attention_scaling"] = float(mod.scaling)
        if "Indexer" in cn:
            for a in ("softmax_scale", "index_topk", "n_heads", "head_dim", "qk_rope_head_dim"):
                if hasattr(mod, a):
                    info.setdefault("indexer", {})[a] = getattr(mod, a) if not torch.is_tensor(getattr(mod, a)) else None
        if "Rotary" in cn and hasattr(mod, "inv_freq"):
            info["rotary_inv_freq"] = [float(x) for x in mod.inv_freq.flatten()[:64]]
            info["rotary_attention_scaling"] = float(getattr(mod, "attention_scaling", 1.0))
    try:
        import transformers.models.glm_moe_dsa.modeling_glm_moe_dsa as mm
        src = inspect.getsource(mm)
        info["source_mentions"] = {w: src.count(w) for w in (
            "apply_rotary_pos_emb_interleave", "interleave", "rope_interleave", "indexer_rope_interleave",
            "update_indexer", "indexer_types", "skip_topk", "relu", "softmax_scale")}
    except Exception as e:
        info["source_mentions"] = repr(e)
    return info


@torch.no_grad()
def full_eval(model, prompt, extra_prompts, n, eos_ids, want_topk=False):
    out = {}
    inp = torch.tensor([prompt])
    logits = model(input_ids=inp, use_cache=False).logits[0].float()
    out["logits"] = logits
    g, margins = greedy_nocache(model, prompt, n)
    out["greedy_nocache"] = g
    out["greedy_margins"] = margins
    # generate() with cache
    try:
        import copy
        gc = copy.deepcopy(model.generation_config)
        gc.eos_token_id = None
        gc.pad_token_id = 0
        gc.do_sample = False
        gc.use_cache = True
        gc.max_new_tokens = n
        gc.min_new_tokens = 0
        gen = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gc)
        out["greedy_generate"] = [int(x) for x in gen[0, len(prompt):]]
    except Exception as e:
        out["generate_error"] = traceback.format_exc()[-2000:]
        log("generate failed:", repr(e)[:300])
    # fp64 teacher-forced check of the same continuation
    try:
        m64 = model.to(torch.float64)
        seq = torch.tensor([list(prompt) + g[:-1]])
        l64 = m64(input_ids=seq, use_cache=False).logits[0]
        out["fp64_prompt_logits_rel_diff"] = float(
            (l64[: len(prompt)] - logits.double()).abs().max() / l64[: len(prompt)].abs().max())
        out["fp64_greedy_agrees"] = [int(x) for x in l64[len(prompt) - 1:].argmax(-1)] == g
        model.to(torch.float32)
    except Exception as e:
        model.to(torch.float32)
        out["fp64_error"] = repr(e)[:300]
    # Extra prompts for scheduler tests (different lengths)
    out["extra"] = []
    for p in extra_prompts:
        ge, me = greedy_nocache(model, p, n)
        out["extra"].append({"prompt_ids": list(p), "greedy_ids": ge, "min_greedy_margin": min(me)})
    if want_topk:
        got, handles = indexer_capture(model)
        try:
            model(input_ids=inp, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        out["indexer_topk"] = {str(k): sorted(int(x) for x in v[-1].tolist()) for k, v in sorted(got.items())}
        out["indexer_topk_all_positions"] = {
            str(k): [sorted(int(x) for x in row.tolist()) for row in v] for k, v in sorted(got.items())}
    out["eos_in_greedy"] = any(t in (eos_ids or []) for t in g)
    return out


@torch.no_grad()
def ablations(model, prompt, ref_logits, n, greedy, sparse):
    """How much some parts move the answer (sanity that the fixture exercises them)."""
    res = {}
    inp = torch.tensor([prompt])
    # e_score_correction_bias only chooses experts: zero it and see the change.
    biases = [m for n_, m in model.named_modules() if hasattr(m, "e_score_correction_bias")]
    if biases:
        saved = [b.e_score_correction_bias.clone() for b in biases]
        for b in biases:
            b.e_score_correction_bias.zero_()
        l = model(input_ids=inp, use_cache=False).logits[0].float()
        res["zero_router_bias_logits_max_abs_diff"] = float((l - ref_logits).abs().max())
        for b, s in zip(biases, saved):
            b.e_score_correction_bias.copy_(s)
    if sparse:
        idx = [m for n_, m in model.named_modules() if "Indexer" in type(m).__name__]
        saved = [getattr(m, "index_topk", None) for m in idx]
        saved_cfg = model.config.index_topk
        for m in idx:
            if hasattr(m, "index_topk"):
                m.index_topk = 1 << 30
        model.config.index_topk = 1 << 30
        try:
            l = model(input_ids=inp, use_cache=False).logits[0].float()
            res["dense_attention_logits_max_abs_diff"] = float((l - ref_logits).abs().max())
            gd, _ = greedy_nocache(model, prompt, n)
            res["dense_attention_greedy_differs"] = gd != greedy
            res["dense_attention_greedy_ids"] = gd
        finally:
            for m, s in zip(idx, saved):
                if s is not None:
                    m.index_topk = s
            model.config.index_topk = saved_cfg
    return res


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------

def base_cfg(**over):
    kw = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=24,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, routed_scaling_factor=2.5,
        n_group=1, topk_group=1, norm_topk_prob=True,
        q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        index_n_heads=2, index_head_dim=16, index_topk=256, first_k_dense_replace=1,
        max_position_embeddings=512, rms_norm_eps=1e-5, hidden_act="silu",
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        tie_word_embeddings=False, attention_bias=False, bos_token_id=0, eos_token_id=None, pad_token_id=None,
    )
    kw.update(over)
    return kw


JSON_ONLY = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1}

FIXTURES = {
    "tiny-dense": dict(cfg=base_cfg(), prompt_len=12, seed=1000,
                       notes="3 layers: layer 0 dense MLP, layers 1-2 MoE (8 experts, top-2, 1 shared). "
                             "index_topk 256 >= prompt+generation, so the DSA mask never drops a token."),
    "tiny-sparse": dict(cfg=base_cfg(num_hidden_layers=5, index_topk=4, index_n_heads=8,
                                     rope_parameters={"rope_theta": 50000.0, "rope_type": "default"}),
                        cfg_kwargs=dict(index_topk_freq=2, index_skip_topk_offset=2),
                        prompt_len=20, seed=2000, sparse=True,
                        notes="index_n_heads 8 (with 2 heads many index scores are exactly 0 after the ReLU and "
                              "top-k ties make even HF's own generate() disagree with its no-cache forward). "
                              "index_topk 4 < prompt length 20: the DSA top-k mask changes the answer (see "
                              "ablation). IndexShare: indexer_types derived from index_topk_freq=2, "
                              "index_skip_topk_offset=2 (full iff max(i-offset+1,0) % freq == 0) = "
                              "[full, full, shared, full, shared]; shared layers reuse the previous full "
                              "layer's top-k. indexer_topk: per layer, top-k key positions (sorted) of the "
                              "last prompt token; indexer_topk_all_positions: for every prompt position."),
    "tiny-moe": dict(cfg=base_cfg(num_hidden_layers=5, first_k_dense_replace=2, n_routed_experts=16,
                                  num_experts_per_tok=4, routed_scaling_factor=2.5, norm_topk_prob=True),
                     prompt_len=16, seed=3000,
                     notes="5 layers: 0-1 dense, 2-4 MoE with 16 experts top-4 + 1 shared, "
                           "routed_scaling_factor 2.5, norm_topk_prob true."),
    "tiny-sharded": dict(cfg=base_cfg(), prompt_len=12, seed=4000, shards=2,
                         notes="tiny-dense shape, other weights, saved as two safetensors shards + "
                               "model.safetensors.index.json."),
    "tiny-fp8": dict(cfg=base_cfg(hidden_size=160, intermediate_size=320, moe_intermediate_size=48,
                                  q_lora_rank=96, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                  v_head_dim=32, index_n_heads=2, index_head_dim=32),
                     prompt_len=14, seed=5000, fp8=True,
                     notes="FP8 e4m3 128x128 block-quantized: weight F8_E4M3 + weight_scale_inv F32 "
                           "[ceil(out/128), ceil(in/128)], W = fp8 * scale (scale = block amax/448). "
                           "Quantized: q_a/q_b/kv_a_with_mqa/kv_b/o_proj, indexer wq_b/wk, dense and shared "
                           "expert and routed expert gate/up/down. Not quantized: norms, mlp.gate (+bias), "
                           "indexer weights_proj and k_norm, embed_tokens, lm_head. Reference = fp32 model on "
                           "the DEQUANTIZED weights. hidden 160 / intermediate 320 give full and partial blocks."),
    "tiny-mtp": dict(cfg=base_cfg(), prompt_len=12, seed=6000, mtp=True,
                     notes="tiny-dense shape + num_nextn_predict_layers 1: MTP layer weights under "
                           "model.layers.3.* (enorm, hnorm, eh_proj [H, 2H], shared_head.norm, and a full "
                           "MoE decoder layer incl. indexer). transformers ignores them: the reference is the "
                           "main model only; an engine using MTP as a draft must produce the same greedy ids."),
}


def build_checkpoint(spec, seed, d, vocab=None, extra_json=None):
    """Builds model weights for `seed`, writes config + safetensors into d. Returns (meta)."""
    Config, _ = hf_classes()
    kw = dict(spec["cfg"])
    if vocab:
        kw["vocab_size"] = vocab
    ckw = dict(spec.get("cfg_kwargs", {}))
    meta = {}
    if spec.get("mtp"):
        big = Config(**dict(kw, num_hidden_layers=kw["num_hidden_layers"] + 1), **ckw)
        model = new_model(big)
        init_weights(model, seed)
        tensors = checkpoint_tensors(model, big)
        cfg = Config(**kw, **ckw)
        n = cfg.num_hidden_layers
        H = cfg.hidden_size
        g = torch.Generator().manual_seed(seed + 77)
        for nm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"model.layers.{n}.{nm}.weight"] = (
                1.0 + 0.2 * torch.randn(H, generator=g, dtype=torch.float64)).float()
        tensors[f"model.layers.{n}.eh_proj.weight"] = (
            torch.randn(H, 2 * H, generator=g, dtype=torch.float64) / math.sqrt(2 * H)).float()
        meta["mtp_tensors"] = sorted(k for k in tensors if k.startswith(f"model.layers.{n}."))
        json_extra = {"num_nextn_predict_layers": 1}
    else:
        cfg = Config(**kw, **ckw)
        model = new_model(cfg)
        init_weights(model, seed)
        tensors = checkpoint_tensors(model, cfg)
        json_extra = {"num_nextn_predict_layers": 0}
    json_extra.update(JSON_ONLY)
    json_extra.update(ckw)
    json_extra.update(extra_json or {})
    os.makedirs(d, exist_ok=True)
    for fn in os.listdir(d):
        if fn.endswith(".safetensors") or fn.endswith(".json") or fn.endswith(".f32"):
            os.remove(os.path.join(d, fn))
    cdict = config_dict(cfg, json_extra)
    if spec.get("fp8"):
        # fp32 dequantized copy (for the reference) in a temp dir; fp8 files in d.
        qt, deq = {}, {}
        quantized = []
        for k, v in tensors.items():
            if any(re.search(p, k) for p in FP8_QUANT_PATTERNS) and v.dim() == 2:
                q, s, dq = fp8_quantize_block(v)
                qt[k] = q
                qt[k[: -len("weight")] + "weight_scale_inv"] = s
                deq[k] = dq
                quantized.append(k)
            else:
                qt[k] = v
                deq[k] = v
        meta["fp8_quantized"] = quantized
        not_conv = sorted({k[: -len(".weight")] for k, v in tensors.items()
                           if v.dim() == 2 and k not in quantized})
        cdict["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": not_conv,
        }
        write_config(cdict, d)
        meta["files"] = save_tensors(qt, d, spec.get("shards", 1))
        ref_dir = tempfile.mkdtemp(prefix="deq_")
        c2 = dict(cdict)
        c2.pop("quantization_config")
        write_config(c2, ref_dir)
        save_tensors(deq, ref_dir, 1)
        meta["ref_dir"] = ref_dir
        meta["inmem_model"] = None  # weights differ from in-memory (quantized)
    else:
        write_config(cdict, d)
        meta["files"] = save_tensors(tensors, d, spec.get("shards", 1))
        meta["ref_dir"] = d
        meta["inmem_model"] = None if spec.get("mtp") else model
    meta["config_json"] = cdict
    return meta


def make_prompts(seed, vocab, prompt_len):
    g = torch.Generator().manual_seed(seed)
    main = [int(x) for x in torch.randint(2, vocab, (prompt_len,), generator=g)]
    ex1 = [int(x) for x in torch.randint(2, vocab, (max(3, prompt_len // 2 - 1),), generator=g)]
    ex2 = [int(x) for x in torch.randint(2, vocab, (prompt_len + 5,), generator=g)]
    return main, [ex1, ex2]


def verify_reload(meta, prompt):
    model, info = load_model(meta["ref_dir"])
    problems = []
    if info.get("missing_keys"):
        problems.append(f"missing keys: {info['missing_keys'][:10]}")
    mm = info.get("mismatched_keys")
    if mm:
        problems.append(f"mismatched keys: {str(mm)[:300]}")
    inmem = meta.get("inmem_model")
    if inmem is not None:
        with torch.no_grad():
            a = model(input_ids=torch.tensor([prompt]), use_cache=False).logits.float()
            b = inmem(input_ids=torch.tensor([prompt]), use_cache=False).logits.float()
        rel = float((a - b).abs().max() / b.abs().max())
        meta["reload_vs_inmemory_rel_diff"] = rel
        if rel > 1e-5:
            problems.append(f"reloaded model differs from in-memory model: rel {rel:.3g}")
    return model, info, problems


CONVERSION = {"mode": "per_expert", "history": []}
CONVERSION_MODES = ["per_expert", "per_expert_swapped", "native"]


def build_and_verify(spec, seed, d, prompt, vocab, extra_json):
    """Writes the checkpoint and reloads it; finds the expert-tensor layout HF loads correctly."""
    modes = [CONVERSION["mode"]] + [m for m in CONVERSION_MODES if m != CONVERSION["mode"]]
    first = None
    for mode in modes:
        CONVERSION["mode"] = mode
        meta = build_checkpoint(spec, seed, d, vocab=vocab, extra_json=extra_json)
        model, info, problems = verify_reload(meta, prompt)
        if first is None:
            first = (meta, model, info, problems)
        if not problems:
            return meta, model, info, problems
        CONVERSION["history"].append({"seed": seed, "mode": mode, "problems": problems})
        log(f"seed {seed}: layout {mode}: problems {problems}")
        if meta.get("inmem_model") is None and not any("missing" in p for p in problems):
            break  # nothing to compare against; keep the first
    CONVERSION["mode"] = modes[0]
    meta, model, info, problems = first
    meta = build_checkpoint(spec, seed, d, vocab=vocab, extra_json=extra_json)
    model, info, problems = verify_reload(meta, prompt)
    return meta, model, info, problems


def eps_note(hf):
    """Notes text naming the eps values the instantiated HF modules use."""
    e = {k.split(" ")[0]: v for k, v in hf.get("norm_eps", {}).items()}
    def g(k):
        return e.get(k)
    return (f" HF {versions()['transformers_version']} norm eps: q_a_layernorm {g('model.layers.N.self_attn.q_a_layernorm')}, "
            f"kv_a_layernorm {g('model.layers.N.self_attn.kv_a_layernorm')}, indexer k_norm (LayerNorm) "
            f"{g('model.layers.N.self_attn.indexer.k_norm')}, input/post_attention/final RMSNorm "
            f"{g('model.layers.N.input_layernorm')} (= rms_norm_eps); see hf.norm_eps and tests/golden/HF_NOTES.md.")


def run_fixture(name, spec, out_root, vocab=None, prompt=None, extra_prompts=None, eos_ids=None,
                extra_json=None, extra_ref=None, copy_files=None):
    d = os.path.join(out_root, name)
    vocab_n = vocab or spec["cfg"]["vocab_size"]
    if prompt is None:
        prompt, extra_prompts = make_prompts(spec["seed"] + 999, vocab_n, spec["prompt_len"])
    cases = [prompt] + list(extra_prompts or [])
    best, tried, last = None, [], None
    for i in range(SEEDS_PER_FIXTURE):
        seed = spec["seed"] + i
        meta, model, info, problems = build_and_verify(spec, seed, d, prompt, vocab, extra_json)
        last = (seed, meta, model, info, problems)
        res, gaps = quick_eval(model, cases, GEN_LEN)
        s, greedy_margin = score_of(res, gaps)
        has_eos = any(t in (eos_ids or []) for g, _ in res for t in g)
        if has_eos:
            s = min(s, 0.5)
        tried.append({"seed": seed, "score": s, "min_greedy_margin": greedy_margin, "topk_gaps": gaps,
                      "eos_in_greedy": has_eos})
        log(f"{name}: seed {seed} score {s:.3g} greedy margin {greedy_margin:.3g} gaps {gaps}")
        if best is None or s > best[0]:
            best = (s, seed)
        if s >= 1.0:
            break
    seed = best[1]
    if seed != last[0]:
        meta, model, info, problems = build_and_verify(spec, seed, d, prompt, vocab, extra_json)
    else:
        _, meta, model, info, problems = last
    ev = full_eval(model, prompt, extra_prompts or [], GEN_LEN, eos_ids, want_topk=spec.get("sparse", False))
    ab = ablations(model, prompt, ev["logits"], GEN_LEN, ev["greedy_nocache"], spec.get("sparse", False))
    _, gaps = quick_eval(model, [prompt], GEN_LEN)
    logits = ev["logits"].contiguous()
    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
    gen_ok = ev.get("greedy_generate") == ev["greedy_nocache"]
    notes = spec.get("notes", "")
    if not gen_ok:
        notes += (" WARNING: generate() (with cache) gave a different continuation than greedy argmax "
                  "over full no-cache forward passes; greedy_ids holds the no-cache sequence, "
                  "greedy_ids_generate the generate() one.")
    ref = {
        "prompt_ids": prompt,
        "greedy_ids": ev["greedy_nocache"],
        "greedy_ids_generate": ev.get("greedy_generate"),
        "greedy_generate_matches_nocache": gen_ok,
        "logits_file": "logits.f32",
        "logits_shape": list(logits.shape),
        "logits_dtype": "float32 little-endian, row-major [num_prompt_tokens, vocab_size]",
        "seed": seed,
        "seeds_tried": tried,
        "generator": f"tools/golden/make_golden.py --only {name} (see tests/golden/README.md)",
        "notes": notes,
        "min_greedy_margin": min(ev["greedy_margins"]),
        "greedy_margins": ev["greedy_margins"],
        "topk_gaps_on_final_sequence": gaps,
        "fp64_prompt_logits_rel_diff": ev.get("fp64_prompt_logits_rel_diff"),
        "fp64_greedy_agrees": ev.get("fp64_greedy_agrees"),
        "extra_cases": ev["extra"],
        "ablations": ab,
        "eos_in_greedy": ev["eos_in_greedy"],
        "loading_info": info,
        "reload_problems": problems,
        "checkpoint_expert_layout": CONVERSION["mode"],
        "checkpoint_layout_history": CONVERSION["history"],
        "indexer_types": meta["config_json"].get("indexer_types"),
        "reload_vs_inmemory_rel_diff": meta.get("reload_vs_inmemory_rel_diff"),
        "files": meta["files"],
        "compute": "CPU, fp32, eager attention, model.eval(), torch.no_grad(); logits from "
                   "model(input_ids=prompt, use_cache=False)",
        "hf": hf_introspection(model),
    }
    ref["notes"] += eps_note(ref["hf"])
    ref.update(versions())
    if "generate_error" in ev:
        ref["generate_error"] = ev["generate_error"]
    if "indexer_topk" in ev:
        ref["indexer_topk"] = ev["indexer_topk"]
        ref["indexer_topk_all_positions"] = ev["indexer_topk_all_positions"]
    for k in ("fp8_quantized", "mtp_tensors"):
        if k in meta:
            ref[k] = meta[k]
    if spec.get("fp8"):
        ref["fp8_hf_loader_check"] = fp8_hf_check(d, prompt, logits)
    ref.update(extra_ref or {})
    for src, dst in (copy_files or {}).items():
        shutil.copy(src, os.path.join(d, dst))
    with open(os.path.join(d, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1, default=str)
    if meta["ref_dir"] != d:
        shutil.rmtree(meta["ref_dir"], ignore_errors=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    log(f"{name}: DONE seed {seed} size {size} bytes, generate==nocache {gen_ok}, "
        f"min margin {ref['min_greedy_margin']:.3g}, fp64 rel {ref['fp64_prompt_logits_rel_diff']}")
    return ref


def fp8_hf_check(d, prompt, ref_logits):
    """Optional: does transformers' own FP8 loader (dequantize=True) agree with our dequantization?"""
    try:
        from transformers import FineGrainedFP8Config
        _, Model = hf_classes()
        m = Model.from_pretrained(d, quantization_config=FineGrainedFP8Config(dequantize=True),
                                  attn_implementation="eager", dtype=torch.float32)
        m = m.float().eval().cpu()
        with torch.no_grad():
            l = m(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float()
        return {"ok": True, "max_rel_diff_vs_reference": float((l - ref_logits).abs().max() / ref_logits.abs().max())}
    except Exception as e:
        return {"ok": False, "error": repr(e)[:500]}


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--src-dump", default=None)
    ap.add_argument("--only", default=None, help="comma-separated fixture names (tokenizer, tiny-chat, tiny-*)")
    ap.add_argument("--corpus", default="tests/golden/tokenizer/corpus.txt")
    args = ap.parse_args()
    setup_torch()
    log("versions", versions())
    only = set(args.only.split(",")) if args.only else None
    failures = []
    if args.src_dump:
        try:
            dump_sources(args.src_dump)
        except Exception:
            traceback.print_exc()
            failures.append("src-dump")

    tok = None
    if only is None or "tokenizer" in only or "tiny-chat" in only:
        try:
            tok = build_tokenizer(args.corpus, os.path.join(args.out, "tokenizer"))
            shutil.copy(args.corpus, os.path.join(args.out, "tokenizer", "corpus.txt"))
        except Exception:
            traceback.print_exc()
            failures.append("tokenizer")

    for name, spec in FIXTURES.items():
        if only is not None and name not in only:
            continue
        try:
            run_fixture(name, spec, args.out)
        except Exception:
            traceback.print_exc()
            failures.append(name)

    if (only is None or "tiny-chat" in only) and tok is not None:
        try:
            vocab = tok.get_vocab_size(with_added_tokens=True)
            text = ("[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\n"
                    "Hello! What is the capital of France?<|assistant|>\n")
            prompt = tok.encode(text).ids
            extra_texts = ["<|user|>\nHi<|assistant|>\n",
                           "[gMASK]<sop><|user|>\nWrite a haiku about the sea, please.<|assistant|>\n"]
            extra = [tok.encode(t).ids for t in extra_texts]
            eos = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
            spec = dict(cfg=base_cfg(), prompt_len=len(prompt), seed=7000,
                        notes="tiny-dense shape with vocab_size = tokenizer vocab size; tokenizer.json "
                              "copied from tests/golden/tokenizer. eos_token_id = ids of <|endoftext|>, "
                              "<|user|>, <|observation|> (as GLM); the seed was chosen so the greedy "
                              "continuation contains none of them (greedy_ids ignore eos anyway).")
            ref = run_fixture(
                "tiny-chat", spec, args.out, vocab=vocab, prompt=prompt, extra_prompts=extra, eos_ids=eos,
                extra_json={"eos_token_id": eos, "pad_token_id": eos[0]},
                extra_ref={"prompt_text": text, "extra_texts": extra_texts},
                copy_files={os.path.join(args.out, "tokenizer", "tokenizer.json"): "tokenizer.json"})
            # decoded texts
            d = os.path.join(args.out, "tiny-chat")
            ref["greedy_text"] = tok.decode(ref["greedy_ids"], skip_special_tokens=False)
            for c, t in zip(ref["extra_cases"], extra_texts):
                c["prompt_text"] = t
                c["greedy_text"] = tok.decode(c["greedy_ids"], skip_special_tokens=False)
            with open(os.path.join(d, "reference.json"), "w", encoding="utf-8") as f:
                json.dump(ref, f, ensure_ascii=False, indent=1, default=str)
        except Exception:
            traceback.print_exc()
            failures.append("tiny-chat")

    log("FAILURES:" if failures else "ALL OK", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
