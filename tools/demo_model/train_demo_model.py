#!/usr/bin/env python3
"""Trains the bundled demo checkpoint: a tiny GlmMoeDsaForCausalLM that answers questions about
glmctl with the answers of tools/demo_model/corpus.jsonl.

Runs on the GPU machine (PyTorch + transformers 5.17 with `glm_moe_dsa`, `tokenizers`,
`safetensors`, jinja2; no network) through tools/demo_model/run_on_device.sh; a few minutes on one
H200. It falls back to the CPU when there is no GPU (only for --smoke runs).

Model: the architecture of GLM-5 at toy size (demo_config): MLA, a DSA indexer with IndexShare
(indexer_types [full, full, shared, full]), layer 0 dense, layers 1-3 MoE (16 routed experts,
top-4, one shared expert, sigmoid router with e_score_correction_bias), untied lm_head; vocabulary
= tests/golden/tiny-chat/tokenizer.json (1024 ids: 1014 BPE + 10 GLM special tokens).

Data (chat_format.py): every corpus example as a chat rendered with tiny-chat's
chat_template.jinja exactly as transformers renders it, the prompt with the generation prompt for
thinking off (`<|assistant|></think>`) or on (`<|assistant|><think>`, the target then starts with
`</think>`), the answer, then `<|user|>` (an eos id). Some samples get a system message or one or
two earlier question/answer turns in front (what chat UIs send). Loss only on the target tokens.

Training: fp32, AdamW, warmup + cosine, fixed seed, --steps steps (a --max-train-seconds guard
stops earlier and says so; the cosine then follows the time budget). The DSA indexer gets no gradient in transformers (top-k is not
differentiable) and stays at its initialisation; index_topk 256 only bites on sequences longer
than 256 tokens. The router's e_score_correction_bias is trained the GLM/DeepSeek way, without
gradient: after each step it moves by --bias-update-rate towards equal expert load.

Output (--out): config.json (GlmMoeDsaConfig.to_dict() + the JSON-only keys of the real GLM
configs, as tools/golden/make_golden.py writes them), model.safetensors (make_golden's per-expert
tensor names; BF16 except the F32 e_score_correction_bias, as in the real BF16 releases; --dtype
f32 for all-F32), tokenizer.json, chat_template.jinja, generation_config.json (eos
[1014, 1021, 1023]) and demo.json (the canary prompt with its expected greedy answer, a few more
cases, the evaluation summary and how it was trained). All evaluation runs on the model reloaded
from those files with from_pretrained (fp32 compute on the saved weights), i.e. on what the engine
loads.

Usage: python3 tools/demo_model/train_demo_model.py --out DIR [--smoke] [--steps N] [--device cuda|cpu]
Exit status 1 when the canary does not answer its corpus answer, training questions are answered
below --min-train-match, the files do not reload cleanly or evaluation fails (the files and
demo.json are still written, with the reasons under "problems"); 2 on an error before that.
"""
import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "golden"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import chat_format  # noqa: E402
import make_golden as mg  # noqa: E402

TINY_CHAT = os.path.join(ROOT, "tests", "golden", "tiny-chat")
EOS_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
EXPECTED_EOS_IDS = [1014, 1021, 1023]  # tests/golden/tiny-chat/config.json
EXPECTED_VOCAB = 1024
CANARY_QUESTION = "What is glmctl?"
EXTRA_CASE_QUESTIONS = [
    "Hello", "How do I bring a cluster up?", "Where are the logs?", "What is MLA?",
    "How do I set API keys?", "What does glmctl health do?",
]

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------

# IndexShare schedule: full iff max(i - offset + 1, 0) % freq == 0 -> [full, full, shared, full].
INDEX_SHARE = {"index_topk_freq": 2, "index_skip_topk_offset": 2}


def demo_config(vocab, eos_ids, index_topk):
    """GLM-5's layer types at toy size. Every split width divides by 4 (the local demo runs TP4)."""
    return mg.base_cfg(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
        n_shared_experts=1, n_routed_experts=16, num_experts_per_tok=4, routed_scaling_factor=2.5,
        n_group=1, topk_group=1, norm_topk_prob=True,
        q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        index_n_heads=8, index_head_dim=32, index_topk=index_topk, first_k_dense_replace=1,
        max_position_embeddings=1024, rms_norm_eps=1e-5,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        bos_token_id=None, eos_token_id=list(eos_ids), pad_token_id=eos_ids[0],
    )


def build_model(cfg):
    """A fresh fp32 model with eager attention and eager (per-expert loop) MoE."""
    _, Model = mg.hf_classes()
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    try:
        m = Model._from_config(cfg, attn_implementation="eager", experts_implementation="eager",
                               dtype=torch.float32)
    except Exception as e:
        log("_from_config with experts_implementation failed, using make_golden.new_model:", repr(e)[:200])
        m = mg.new_model(cfg)
    if hasattr(m, "set_experts_implementation"):  # transformers 5.x; the kwarg above may be ignored
        try:
            m.set_experts_implementation("eager")
        except Exception as e:
            log("set_experts_implementation('eager') failed:", repr(e)[:200])
    log("attention", getattr(m.config, "_attn_implementation", None),
        "experts", getattr(m.config, "_experts_implementation", None))
    return m.float()


def init_for_training(model, seed, std=0.02):
    """Deterministic init of every parameter and of e_score_correction_bias (independent of
    transformers' _init_weights): matrices N(0, std), output projections (o_proj, down_proj)
    N(0, std / sqrt(2 * layers)), norm weights 1, biases 0, e_score_correction_bias 0. Buffers
    such as the RoPE tables are left alone."""
    g = torch.Generator().manual_seed(seed)
    layers = model.config.num_hidden_layers
    tensors = dict(model.named_parameters())
    for name, mod in model.named_modules():
        if hasattr(mod, "e_score_correction_bias"):
            tensors[f"{name}.e_score_correction_bias"] = mod.e_score_correction_bias
    with torch.no_grad():
        for name, t in sorted(tensors.items()):
            if not t.is_floating_point():
                continue
            if name.endswith("e_score_correction_bias") or (t.dim() == 1 and name.endswith(".bias")):
                v = torch.zeros(tuple(t.shape))
            elif t.dim() == 1:
                if "norm" not in name:
                    log("init: 1-D parameter that is not a norm weight set to 1:", name)
                v = torch.ones(tuple(t.shape))
            else:
                s = std / math.sqrt(2 * layers) if ("o_proj" in name or "down_proj" in name) else std
                v = torch.randn(tuple(t.shape), generator=g, dtype=torch.float64).float() * s
            t.copy_(v)


class RouterLoad:
    """Counts, per MoE layer, how many real (non-pad) tokens each expert got in the last forward,
    and moves e_score_correction_bias towards equal load (auxiliary-loss-free balancing)."""

    def __init__(self, model):
        self.routers = [(n, m) for n, m in model.named_modules() if hasattr(m, "e_score_correction_bias")]
        self.top_k = model.config.num_experts_per_tok
        self.counts = {}
        self.token_mask = None  # [B * L] bool, set before each forward
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in self.routers]

    def _hook(self, name):
        def post(mod, args, out):
            # transformers 5.17's router returns (router_logits, topk_weights, topk_indices);
            # older ones return only router_logits and route in the MoE block: then redo the choice
            # (sigmoid + bias, top-k; n_group is 1 here, so no group limit).
            outs = out if isinstance(out, (tuple, list)) else (out,)
            idx = next((t for t in outs if torch.is_tensor(t) and not t.is_floating_point()), None)
            if idx is None:
                logits = next((t for t in outs if torch.is_tensor(t) and t.dim() == 2), None)
                if logits is None:
                    return
                choice = logits.detach().float().sigmoid() + mod.e_score_correction_bias.float()
                idx = choice.topk(self.top_k, dim=-1).indices
            idx = idx.reshape(-1, idx.shape[-1])
            if self.token_mask is not None and self.token_mask.numel() == idx.shape[0]:
                idx = idx[self.token_mask]
            e = mod.e_score_correction_bias.numel()
            self.counts[name] = torch.bincount(idx.reshape(-1).long(), minlength=e).float()
        return post

    @torch.no_grad()
    def update_bias(self, rate):
        for name, mod in self.routers:
            c = self.counts.get(name)
            if c is None or c.sum() == 0:
                continue
            mod.e_score_correction_bias.add_(rate * torch.sign(c.mean() - c).to(mod.e_score_correction_bias.dtype))

    def imbalance(self):
        """max / mean expert load over the layers of the last step (1.0 = balanced)."""
        vals = [float(c.max() / c.mean()) for c in self.counts.values() if c.sum() > 0]
        return max(vals) if vals else float("nan")

    def remove(self):
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------

def make_batch(rng, examples, order, encoder, args):
    """[B, L] ids (right-padded with the pad id) and [B, L] loss mask (1 on answer tokens)."""
    seqs = []
    for _ in range(args.batch_size):
        if not order:
            order.extend(range(len(examples)))
            rng.shuffle(order)
        i = order.pop()
        msgs, thinking = chat_format.sample_conversation(rng, examples, i, args.p_system, args.p_history)
        p, t = encoder(msgs, thinking)
        if len(p) + len(t) > args.max_len:  # too long with history: the plain question
            p, t = encoder([dict(m) for m in examples[i]["messages"]], thinking)
        seqs.append((p, t))
    L = max(len(p) + len(t) for p, t in seqs)
    ids = torch.full((len(seqs), L), args.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.float32)
    for b, (p, t) in enumerate(seqs):
        ids[b, :len(p) + len(t)] = torch.tensor(p + t)
        mask[b, len(p):len(p) + len(t)] = 1.0
    return ids, mask


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------

def lr_at(step, total, peak, warmup, time_frac, floor=0.1):
    """Linear warmup, then cosine from peak to floor * peak over whichever runs out first: the
    steps or the time budget (time_frac = elapsed / --max-train-seconds), so a run stopped by the
    time guard still ends at the low learning rate."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, max((step - warmup) / max(1, total - warmup), time_frac))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def train(model, examples, encoder, args, device):
    rng = random.Random(args.seed)
    order = []
    model.to(device).train()
    model.config.use_cache = False
    load = RouterLoad(model)
    params = [p for n, p in model.named_parameters()
              if p.requires_grad and not n.endswith("e_score_correction_bias")]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.weight_decay)
    t_start = time.time()
    history = []
    step = 0
    stopped_early = False
    tokens = 0
    for step in range(args.steps):
        ids, mask = make_batch(rng, examples, order, encoder, args)
        ids, mask = ids.to(device), mask.to(device)
        load.token_mask = (ids != args.pad_id).reshape(-1)  # the pad id never occurs in the data
        lr = lr_at(step, args.steps, args.lr, args.warmup,
                   (time.time() - t_start) / args.max_train_seconds)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(input_ids=ids, use_cache=False).logits  # [B, L, V]
        per_tok = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                  ids[:, 1:].reshape(-1), reduction="none")
        m = mask[:, 1:].reshape(-1)
        loss = (per_tok * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        load.update_bias(args.bias_update_rate)
        tokens += int(m.sum())
        if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            lv = float(loss)
            el = time.time() - t_start
            log(f"step {step + 1}/{args.steps} loss {lv:.4f} lr {lr:.2e} gnorm {float(gnorm):.3f} "
                f"expert-load max/mean {load.imbalance():.2f} seq-len {ids.shape[1]} "
                f"{1000 * el / (step + 1):.1f} ms/step {tokens / el:.0f} answer-tokens/s")
            history.append({"step": step + 1, "loss": lv, "lr": lr, "seconds": round(el, 1)})
        if time.time() - t_start > args.max_train_seconds:
            stopped_early = True
            log(f"WARNING: --max-train-seconds {args.max_train_seconds} reached after {step + 1} of "
                f"{args.steps} steps; stopping here (lower --steps for a repeatable run)")
            break
    load.remove()
    model.eval()
    return {"steps_planned": args.steps, "steps_done": step + 1, "stopped_early": stopped_early,
            "train_seconds": round(time.time() - t_start, 1), "loss_history": history,
            "final_loss": history[-1]["loss"] if history else None}


# ----------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------

def save_checkpoint(model, cfg, out_dir, dtype, eos_ids):
    model.to("cpu")
    mg.CONVERSION["mode"] = "per_expert"  # the layout every committed fixture reloads with
    tensors = mg.checkpoint_tensors(model, cfg)
    if dtype == "bf16":
        tensors = {k: (v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
                   for k, v in tensors.items()}
    os.makedirs(out_dir, exist_ok=True)
    for fn in os.listdir(out_dir):
        p = os.path.join(out_dir, fn)
        if os.path.isfile(p):
            os.remove(p)
    files = mg.save_tensors(tensors, out_dir, 1)
    extra = {"num_nextn_predict_layers": 0}
    extra.update(mg.JSON_ONLY)
    extra.update(INDEX_SHARE)
    extra.update({"eos_token_id": list(eos_ids), "pad_token_id": eos_ids[0]})
    cdict = mg.config_dict(cfg, extra)
    if dtype == "bf16":
        cdict["dtype"] = "bfloat16"
        if "torch_dtype" in cdict:
            cdict["torch_dtype"] = "bfloat16"
    mg.write_config(cdict, out_dir)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": list(eos_ids), "pad_token_id": eos_ids[0]}, f, indent=2)
        f.write("\n")
    shutil.copy(os.path.join(TINY_CHAT, "tokenizer.json"), os.path.join(out_dir, "tokenizer.json"))
    shutil.copy(os.path.join(TINY_CHAT, "chat_template.jinja"), os.path.join(out_dir, "chat_template.jinja"))
    n_params = sum(v.numel() for v in tensors.values())
    log(f"saved {out_dir}: {files}, {n_params} parameters, dtype {dtype}, "
        f"{os.path.getsize(os.path.join(out_dir, 'model.safetensors'))} bytes")
    return cdict, n_params


def reload(out_dir):
    model, info = mg.load_model(out_dir)
    empty = (None, "", "None", "[]", "set()", "{}", "()")
    problems = [f"{k}: {info[k]}" for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
                if info.get(k) not in empty and info.get(k) != []]
    return model, info, problems


# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def greedy_one(model, prompt, max_new, eos_ids):
    """Greedy argmax of full no-cache forwards (the fixtures' convention), stopping at an eos.
    Returns (ids including the eos if reached, per-step top1 - top2 logit margins)."""
    dev = next(model.parameters()).device
    ids, out, margins = list(prompt), [], []
    for _ in range(max_new):
        logits = model(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits[0, -1].float()
        top2 = logits.topk(2)
        margins.append(float(top2.values[0] - top2.values[1]))
        t = int(top2.indices[0])
        out.append(t)
        ids.append(t)
        if t in eos_ids:
            break
    return out, margins


@torch.no_grad()
def greedy_generate(model, prompt, max_new, eos_ids):
    """The same with transformers' generate() and its cache (a cross-check)."""
    import copy
    dev = next(model.parameters()).device
    inp = torch.tensor([prompt], device=dev)
    gc = copy.deepcopy(model.generation_config)
    gc.do_sample = False
    gc.max_new_tokens = max_new
    gc.eos_token_id = list(eos_ids)
    gc.pad_token_id = eos_ids[0]
    gc.use_cache = True
    out = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gc)
    return [int(x) for x in out[0, len(prompt):]]


@torch.no_grad()
def greedy_batch(model, prompts, max_new, eos_ids, pad_id, batch_size):
    """Greedy for many prompts: right-padded batches, full no-cache forwards, no attention mask
    (causal masking alone keeps each row's real tokens from seeing the padding after them)."""
    dev = next(model.parameters()).device
    results = []
    for b0 in range(0, len(prompts), batch_size):
        seqs = [list(p) for p in prompts[b0:b0 + batch_size]]
        outs = [[] for _ in seqs]
        margins = [[] for _ in seqs]
        done = [False] * len(seqs)
        for _ in range(max_new):
            L = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, :len(s)] = torch.tensor(s)
            ids = ids.to(dev)
            last = torch.tensor([len(s) - 1 for s in seqs], device=dev)
            logits = model(input_ids=ids, use_cache=False).logits
            top2 = logits[torch.arange(len(seqs), device=dev), last].float().topk(2, dim=-1)
            top_ids = top2.indices[:, 0].tolist()
            gaps = (top2.values[:, 0] - top2.values[:, 1]).tolist()
            for i in range(len(seqs)):
                if done[i]:
                    continue
                outs[i].append(top_ids[i])
                margins[i].append(gaps[i])
                seqs[i].append(top_ids[i])
                done[i] = top_ids[i] in eos_ids
            if all(done):
                break
        results += list(zip(outs, margins))
    return results


def evaluate(model, tok, encoder, name, cases, args, eos_ids):
    """cases: [(label, messages, thinking)]. Prints every answer; returns a summary dict."""
    prompts, targets = [], []
    for _, msgs, thinking in cases:
        p, t = encoder.slow(msgs, thinking)
        prompts.append(p)
        targets.append(t)
    res = greedy_batch(model, prompts, args.max_new_tokens, eos_ids, args.pad_id, args.eval_batch_size)
    ok = 0
    min_margin = float("inf")
    failures = []
    for (label, msgs, thinking), t, (out, margins) in zip(cases, targets, res):
        good = out == t
        ok += good
        if good:
            min_margin = min(min_margin, min(margins))
        text = tok.decode(out, skip_special_tokens=False)
        mark = "ok  " if good else "DIFF"
        print(f"  [{name} {mark}] {label} (thinking {'on' if thinking else 'off'}) -> {text!r}"
              + ("" if good else f"\n         want {tok.decode(t, skip_special_tokens=False)!r}"), flush=True)
        if not good:
            failures.append({"question": label, "thinking": thinking, "got": text})
    summary = {"exact": ok, "total": len(cases), "min_greedy_margin_of_exact": None if ok == 0 else min_margin,
               "failures": failures[:20]}
    log(f"eval {name}: {ok}/{len(cases)} answers equal the corpus answer")
    return summary


def canary_case(model, tok, encoder, question, thinking, args, eos_ids):
    msgs = [{"role": "user", "content": question}]
    prompt_text = chat_format.render(encoder.template, msgs, True, enable_thinking=thinking)
    p, _ = encoder.slow(msgs + [{"role": "assistant", "content": "x"}], thinking)
    if p != tok.encode(prompt_text).ids:
        raise RuntimeError("canary prompt ids differ from the rendered prompt's encoding")
    out, margins = greedy_one(model, p, args.max_new_tokens, eos_ids)
    stop = out[-1] if out and out[-1] in eos_ids else None
    answer_ids = out[:-1] if stop is not None else out
    text = tok.decode(answer_ids, skip_special_tokens=False)
    try:
        with_cache = greedy_generate(model, p, args.max_new_tokens, eos_ids)
        cache_agrees = with_cache == out
    except Exception as e:
        log("generate() failed:", repr(e)[:300])
        cache_agrees = None
    case = {
        "messages": msgs,
        "chat_template_kwargs": {"enable_thinking": thinking},
        "prompt_text": prompt_text,
        "prompt_ids": p,
        "expected_text": text,
        "expected_ids": answer_ids,
        "stop_token_id": stop,
        "min_greedy_margin": min(margins) if margins else None,
        "generate_with_cache_agrees": cache_agrees,
    }
    if thinking:
        reasoning, _, content = text.partition(chat_format.THINK_CLOSE)
        case["expected_reasoning"] = reasoning
        case["expected_content"] = content
    return case


# ----------------------------------------------------------------------------------------------

def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output checkpoint directory (emptied first)")
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus.jsonl"))
    ap.add_argument("--heldout", default=os.path.join(HERE, "heldout.jsonl"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--max-train-seconds", type=float, default=330.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--bias-update-rate", type=float, default=1e-3)
    ap.add_argument("--p-system", type=float, default=0.15)
    ap.add_argument("--p-history", type=float, default=0.3)
    ap.add_argument("--max-len", type=int, default=448, help="longest training sequence (tokens)")
    ap.add_argument("--index-topk", type=int, default=256)
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="safetensors dtype")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--eval-batch-size", type=int, default=64)
    ap.add_argument("--eval-limit", type=int, default=0, help="evaluate at most N cases per set (0: all)")
    ap.add_argument("--min-train-match", type=float, default=0.9)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--smoke", action="store_true",
                    help="a one-minute run of every phase (20 steps, 4 cases per eval set, 16 new "
                         "tokens); answers are not expected to match")
    args = ap.parse_args()
    if args.smoke:
        args.steps = min(args.steps, 20)
        args.eval_limit = 4
        args.max_new_tokens = 16
        args.min_train_match = 0.0

    from tokenizers import Tokenizer
    versions = mg.versions()
    log("versions", versions, "device", args.device,
        torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    problems = []

    tok_path = os.path.join(TINY_CHAT, "tokenizer.json")
    tok = Tokenizer.from_file(tok_path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos_ids = [tok.token_to_id(t) for t in EOS_TOKENS]
    with open(os.path.join(TINY_CHAT, "config.json")) as f:
        tiny_eos = json.load(f)["eos_token_id"]
    if vocab != EXPECTED_VOCAB or eos_ids != EXPECTED_EOS_IDS or tiny_eos != EXPECTED_EOS_IDS:
        raise SystemExit(f"tokenizer: vocab {vocab}, eos ids {eos_ids}, tiny-chat config eos {tiny_eos}; "
                         f"expected {EXPECTED_VOCAB} and {EXPECTED_EOS_IDS}")
    args.pad_id = eos_ids[0]
    user_id = tok.token_to_id(chat_format.EOS_AFTER_ANSWER)
    template = chat_format.load_template(os.path.join(TINY_CHAT, "chat_template.jinja"))
    encoder = chat_format.Encoder(tok, template, user_id)

    examples = chat_format.read_jsonl(args.corpus)
    heldout = chat_format.read_jsonl(args.heldout)
    log(f"corpus {len(examples)} examples ({len({e['messages'][1]['content'] for e in examples})} answers), "
        f"heldout {len(heldout)}")
    vrng = random.Random(args.seed + 1)
    checks = [chat_format.sample_conversation(vrng, examples, vrng.randrange(len(examples)), 0.5, 0.7) for _ in range(300)]
    checks += [([dict(m) for m in e["messages"]], th) for e in examples for th in (False, True)]
    log("piecewise encoding equals render+encode:", encoder.verify(checks))
    lengths = [sum(map(len, encoder(e["messages"], False))) for e in examples]
    log(f"single-turn sequence tokens min/mean/max {min(lengths)}/{sum(lengths) / len(lengths):.1f}/{max(lengths)}")

    cfg_kw = demo_config(vocab, eos_ids, args.index_topk)
    Config, _ = mg.hf_classes()
    cfg = Config(**cfg_kw, **INDEX_SHARE)
    log("indexer_types", cfg.indexer_types, "mlp_layer_types", cfg.mlp_layer_types)
    model = build_model(cfg)
    init_for_training(model, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters")

    train_info = train(model, examples, encoder, args, args.device)
    _, n_saved = save_checkpoint(model, cfg, args.out, args.dtype, eos_ids)
    del model

    demo = {
        "what": "Tiny GLM-5-architecture demo model trained on tools/demo_model/corpus.jsonl; greedy "
                "answers to the corpus questions are the corpus answers.",
        "generator": "tools/demo_model/train_demo_model.py (see tools/demo_model/README.md)",
        "training": dict(train_info, **{
            "seed": args.seed, "batch_size": args.batch_size, "lr": args.lr, "warmup": args.warmup,
            "weight_decay": args.weight_decay, "bias_update_rate": args.bias_update_rate,
            "p_system": args.p_system, "p_history": args.p_history, "max_len": args.max_len,
            "device": args.device + (f" ({torch.cuda.get_device_name(0)})" if args.device.startswith("cuda") else ""),
            "precision": "fp32 (TF32 off)", "corpus_sha256": sha256_of(args.corpus),
            "corpus_examples": len(examples), "parameters": n_saved, "safetensors_dtype": args.dtype,
            "smoke": args.smoke,
        }),
        "compute_of_expected": "from_pretrained(out, attn_implementation='eager', dtype=float32) on the "
                               "CPU; greedy argmax of full no-cache forwards, stopping at an eos id",
        "problems": problems,
    }
    demo.update(versions)

    def write_demo():  # after every phase, so a later failure still leaves what is known
        with open(os.path.join(args.out, "demo.json"), "w") as f:
            json.dump(demo, f, indent=1, default=str)
            f.write("\n")

    write_demo()
    try:
        model, info, reload_problems = reload(args.out)
        demo["reload"] = {"loading_info": info, "problems": reload_problems}
        if reload_problems:
            problems.extend(f"reload: {p}" for p in reload_problems)
            log("RELOAD PROBLEMS", reload_problems)

        # Canary and fixed cases on the CPU (fp32, single sequence, no cache: the fixtures' convention).
        model.to("cpu")
        answers = {e["messages"][0]["content"]: e["messages"][1]["content"] for e in examples}
        canary = canary_case(model, tok, encoder, CANARY_QUESTION, False, args, eos_ids)
        canary["corpus_answer"] = answers[CANARY_QUESTION]
        canary["matches_corpus"] = (canary["expected_text"] == answers[CANARY_QUESTION]
                                    and canary["stop_token_id"] in eos_ids)
        canary_on = canary_case(model, tok, encoder, CANARY_QUESTION, True, args, eos_ids)
        canary_on["matches_corpus"] = (canary_on.get("expected_content") == answers[CANARY_QUESTION]
                                       and canary_on.get("expected_reasoning") == ""
                                       and canary_on["stop_token_id"] in eos_ids)
        log("canary:", json.dumps(canary["expected_text"]), "matches corpus:", canary["matches_corpus"],
            "min margin", canary["min_greedy_margin"], "generate agrees:", canary["generate_with_cache_agrees"])
        log("canary (thinking on):", json.dumps(canary_on["expected_text"]), "matches corpus:",
            canary_on["matches_corpus"])
        if not canary["matches_corpus"] and not args.smoke:
            problems.append("the canary's greedy answer is not its corpus answer")
        demo["canary"] = canary
        demo["canary_thinking_on"] = canary_on
        demo["cases"] = []
        for q in EXTRA_CASE_QUESTIONS:
            c = canary_case(model, tok, encoder, q, False, args, eos_ids)
            c["matches_corpus"] = c["expected_text"] == answers.get(q)
            demo["cases"].append(c)
        write_demo()

        # Everything else batched on the device.
        model.to(args.device)
        lim = (lambda xs: xs[:args.eval_limit]) if args.eval_limit > 0 else (lambda xs: xs)
        train_off = lim([(e["messages"][0]["content"], e["messages"], False) for e in examples])
        train_on = lim([(e["messages"][0]["content"], e["messages"], True) for e in examples])
        held = lim([(e["messages"][0]["content"], e["messages"], th) for e in heldout for th in (False, True)])
        mrng = random.Random(args.seed + 2)
        multi = []
        for _ in range(40):
            i = mrng.randrange(len(examples))
            msgs, th = chat_format.sample_conversation(mrng, examples, i, 0.3, 1.0)
            turns = sum(m["role"] == "user" for m in msgs)
            multi.append((f"[{turns} turns] " + examples[i]["messages"][0]["content"], msgs, th))
        multi = lim(multi)
        demo["eval"] = {}
        for name, cases in (("train-thinking-off", train_off), ("train-thinking-on", train_on),
                            ("heldout", held), ("multi-turn", multi)):
            demo["eval"][name] = evaluate(model, tok, encoder, name, cases, args, eos_ids)
        ev = demo["eval"]["train-thinking-off"]
        rate = ev["exact"] / max(1, ev["total"])
        if rate < args.min_train_match:
            problems.append(f"only {rate:.1%} of the training questions (thinking off) get their corpus "
                            f"answer (< --min-train-match {args.min_train_match})")
    except Exception:
        traceback.print_exc()
        problems.append("evaluation failed: " + traceback.format_exc(limit=3)[-600:])
    write_demo()
    size = sum(os.path.getsize(os.path.join(args.out, fn)) for fn in os.listdir(args.out))
    log(f"wrote {args.out} ({size} bytes): {sorted(os.listdir(args.out))}")
    log("PROBLEMS:" if problems else "ALL OK", problems)
    return 1 if problems else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(2)
