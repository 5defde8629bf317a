#!/usr/bin/env python3
"""Trains the MTP layer of the demo checkpoint on top of its frozen main model.

The main model (models/demo-chat, made by train_demo_model.py) stays byte for byte as it is; this
adds the MTP layer (../shared/specs/glm5-architecture.md §3.5) as `model.layers.<num_hidden_layers>.*`
and sets `num_nextn_predict_layers` to 1, so the engine drafts with it.

The MTP layer as the engine runs it (engine/spec/mtp_drafter.h):
    row at position p:  x = eh_proj(cat(enorm(embed(t[p+1])), hnorm(h[p])))
                        y = decoder_layer(x)            (its own attention over rows 0..p)
                        logits = lm_head(shared_head.norm(y))   -> a guess of t[p+2]
h[p] is the main model's post-norm hidden state. A second draft runs one more row at position
p+1 on (y[p], d1): the MTP layer's own output (before shared_head.norm) takes h's place. Both are
trained: loss 1 on the rows fed by the main model, loss 2 (weight --chain-weight) on rows fed by
the MTP layer's own output, in one parallel pass each (the chained pass attends over chained rows
only, an approximation of the engine, where earlier rows came from the first pass).

The decoder layer is transformers' own (a one-layer GlmMoeDsaModel whose final norm is replaced
by the identity, so it returns y); embed_tokens and lm_head are the main model's, frozen.

Run on the GPU machine (tools/demo_model/run_on_device.sh --mtp), or anywhere with PyTorch and
transformers 5.17:
    python3 tools/demo_model/train_mtp.py --model models/demo-chat --out /tmp/demo-chat
"""

import argparse
import copy
import json
import os
import random
import shutil
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import train_demo_model as tdm  # noqa: E402  (sets sys.path for make_golden; main() is guarded)
import chat_format  # noqa: E402
import make_golden as mg  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

log = tdm.log


def mtp_body_config(cfg):
    """The main config with one decoder layer of the MTP layer's kind: MoE, full indexer."""
    c = copy.deepcopy(cfg)
    c.num_hidden_layers = 1
    c.first_k_dense_replace = 0
    for name, value in (("mlp_layer_types", ["sparse"]), ("indexer_types", ["full"]),
                        ("layer_types", list(getattr(cfg, "layer_types", None) or [])[-1:])):
        if getattr(cfg, name, None) is not None:
            setattr(c, name, value)
    return c


class Mtp(torch.nn.Module):
    def __init__(self, base, cfg):
        super().__init__()
        H = cfg.hidden_size
        norm_cls = type(base.model.norm)
        self.enorm = norm_cls(H, eps=cfg.rms_norm_eps)
        self.hnorm = norm_cls(H, eps=cfg.rms_norm_eps)
        self.head_norm = norm_cls(H, eps=cfg.rms_norm_eps)  # shared_head.norm
        self.eh_proj = torch.nn.Linear(2 * H, H, bias=False)
        self.body_cfg = mtp_body_config(cfg)
        self.body = tdm.build_model(self.body_cfg)  # GlmMoeDsaForCausalLM; only .model.layers[0] is used
        self.body.model.norm = torch.nn.Identity()

    def init_from(self, base, seed):
        """Starts from the main model's last layer (same kind) and final norm; eh_proj passes h."""
        H = self.eh_proj.in_features // 2
        src = base.model.layers[len(base.model.layers) - 1].state_dict()
        missing, unexpected = self.body.model.layers[0].load_state_dict(src, strict=False)
        if missing or unexpected:
            log("init: layer copy missing", missing, "unexpected", unexpected)
        with torch.no_grad():
            self.head_norm.weight.copy_(base.model.norm.weight)
            g = torch.Generator().manual_seed(seed)
            w = torch.randn(H, 2 * H, generator=g) * (0.02 / (2 * H) ** 0.5)
            w[:, H:] += torch.eye(H)
            self.eh_proj.weight.copy_(w)

    def trainable(self):
        skip = ("body.model.embed_tokens", "body.lm_head", "e_score_correction_bias")
        return [p for n, p in self.named_parameters() if p.requires_grad and not any(s in n for s in skip)]

    def forward(self, h, next_ids, embed, position_ids):
        """h [B, T, H], next_ids [B, T] -> y [B, T, H] (before shared_head.norm)."""
        x = self.eh_proj(torch.cat([self.enorm(embed(next_ids)), self.hnorm(h)], dim=-1))
        return self.body.model(inputs_embeds=x, position_ids=position_ids, use_cache=False).last_hidden_state

    def logits(self, y, lm_head):
        return lm_head(self.head_norm(y))


def passes(mtp, base, ids, mask):
    """Both passes on a batch. Returns (loss1, loss2, hits1, hits2, count1, count2) where hits
    count answer positions whose argmax equals the true token."""
    B, L = ids.shape
    dev = ids.device
    with torch.no_grad():
        h = base.model(input_ids=ids, use_cache=False).last_hidden_state  # post-norm [B, L, H]
    embed, head = base.model.embed_tokens, base.lm_head
    # Pass 1: rows p = 0..L-2 on (h[p], t[p+1]); row p predicts t[p+2] (rows 0..L-3 have a target).
    pos1 = torch.arange(L - 1, device=dev).unsqueeze(0).expand(B, -1)
    y1 = mtp(h[:, :-1], ids[:, 1:], embed, pos1)
    lg1 = mtp.logits(y1[:, :-1], head)
    t1, m1 = ids[:, 2:], mask[:, 2:]
    # Pass 2: rows at positions p+1 on (y1[p], t[p+2]); row predicts t[p+3].
    pos2 = torch.arange(1, L - 2, device=dev).unsqueeze(0).expand(B, -1)
    y2 = mtp(y1[:, :-2], ids[:, 2:-1], embed, pos2)
    lg2 = mtp.logits(y2, head)
    t2, m2 = ids[:, 3:], mask[:, 3:]
    out = []
    for lg, t, m in ((lg1, t1, m1), (lg2, t2, m2)):
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), t.reshape(-1), reduction="none")
        mm = m.reshape(-1)
        hits = ((lg.argmax(-1) == t).float().reshape(-1) * mm).sum()
        out.append(((ce * mm).sum() / mm.sum().clamp(min=1), hits, mm.sum()))
    return out[0][0], out[1][0], out[0][1], out[1][1], out[0][2], out[1][2]


def train(mtp, base, examples, encoder, args, device):
    rng = random.Random(args.seed)
    order = []
    params = mtp.trainable()
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    load = tdm.RouterLoad(mtp.body)
    t0 = time.time()
    history, step, stopped_early = [], 0, False
    for step in range(args.steps):
        ids, mask = tdm.make_batch(rng, examples, order, encoder, args)
        ids, mask = ids.to(device), mask.to(device)
        load.token_mask = None
        lr = tdm.lr_at(step, args.steps, args.lr, args.warmup, (time.time() - t0) / args.max_train_seconds)
        for g in opt.param_groups:
            g["lr"] = lr
        l1, l2, h1, h2, n1, n2 = passes(mtp, base, ids, mask)
        loss = l1 + args.chain_weight * l2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        load.update_bias(args.bias_update_rate)
        if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            el = time.time() - t0
            log(f"step {step + 1}/{args.steps} loss1 {float(l1):.4f} loss2 {float(l2):.4f} "
                f"acc1 {float(h1 / n1):.3f} acc2 {float(h2 / n2):.3f} lr {lr:.2e} "
                f"{1000 * el / (step + 1):.1f} ms/step")
            history.append({"step": step + 1, "loss1": float(l1), "loss2": float(l2), "seconds": round(el, 1)})
        if time.time() - t0 > args.max_train_seconds:
            stopped_early = True
            log(f"--max-train-seconds {args.max_train_seconds} reached after {step + 1} steps")
            break
    load.remove()
    return {"steps_planned": args.steps, "steps_done": step + 1, "stopped_early": stopped_early,
            "train_seconds": round(time.time() - t0, 1), "loss_history": history}


@torch.no_grad()
def acceptance(mtp, base, cases, encoder, args, device):
    """Teacher-forced: on the answer tokens of each case, how often the MTP layer's first and
    second drafts equal the true token (what the engine accepts when the main model's greedy
    answer is the corpus answer)."""
    h1 = h2 = n1 = n2 = 0.0
    for b0 in range(0, len(cases), args.batch_size):
        seqs = [encoder(msgs, th) for msgs, th in cases[b0:b0 + args.batch_size]]
        L = max(len(p) + len(t) for p, t in seqs)
        ids = torch.full((len(seqs), L), args.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), L))
        for i, (p, t) in enumerate(seqs):
            ids[i, :len(p) + len(t)] = torch.tensor(p + t)
            mask[i, len(p):len(p) + len(t)] = 1.0
        _, _, a, b, c, d = passes(mtp, base, ids.to(device), mask.to(device))
        h1, h2, n1, n2 = h1 + float(a), h2 + float(b), n1 + float(c), n2 + float(d)
    return {"draft1": round(h1 / max(n1, 1), 4), "draft2_given_true_draft1": round(h2 / max(n2, 1), 4),
            "answer_tokens": int(n1)}


def mtp_tensors(mtp, n_layers):
    """The MTP layer's tensors under the checkpoint's names (model.layers.<n_layers>.*)."""
    mg.CONVERSION["mode"] = "per_expert"
    body = mg.checkpoint_tensors(mtp.body, mtp.body_cfg)
    pre = f"model.layers.{n_layers}."
    out = {pre + k[len("model.layers.0."):]: v for k, v in body.items() if k.startswith("model.layers.0.")}
    out[pre + "enorm.weight"] = mtp.enorm.weight.detach().clone()
    out[pre + "hnorm.weight"] = mtp.hnorm.weight.detach().clone()
    out[pre + "shared_head.norm.weight"] = mtp.head_norm.weight.detach().clone()
    out[pre + "eh_proj.weight"] = mtp.eh_proj.weight.detach().clone()
    return {k: (v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
            for k, v in out.items()}


def write_checkpoint(src, out, tensors, info):
    """Copies src to out, adds the MTP tensors to model.safetensors (the main model's tensors are
    copied unchanged), sets num_nextn_predict_layers 1 and records `info` under demo.json "mtp"."""
    from safetensors.torch import load_file, save_file
    if os.path.abspath(src) != os.path.abspath(out):
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(src, out)
    path = os.path.join(out, "model.safetensors")
    main = load_file(path)
    clash = sorted(set(main) & set(tensors))
    if clash:
        raise SystemExit(f"{path} already holds MTP tensors ({clash[0]}, ...): start from the main model alone")
    main.update(tensors)
    save_file({k: main[k] for k in sorted(main)}, path, metadata={"format": "pt"})
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        cdict = json.load(f)
    cdict["num_nextn_predict_layers"] = 1
    mg.write_config(cdict, out)
    demo_path = os.path.join(out, "demo.json")
    with open(demo_path) as f:
        demo = json.load(f)
    demo["mtp"] = info
    with open(demo_path, "w") as f:
        json.dump(demo, f, indent=1, default=str)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the trained main model (num_nextn_predict_layers 0)")
    ap.add_argument("--out", required=True, help="where the checkpoint with the MTP layer goes")
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus.jsonl"))
    ap.add_argument("--heldout", default=os.path.join(HERE, "heldout.jsonl"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--max-train-seconds", type=float, default=240.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--chain-weight", type=float, default=0.5)
    ap.add_argument("--bias-update-rate", type=float, default=1e-3)
    ap.add_argument("--p-system", type=float, default=0.15)
    ap.add_argument("--p-history", type=float, default=0.3)
    ap.add_argument("--max-len", type=int, default=448)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--smoke", action="store_true", help="20 steps, a few evaluation cases")
    args = ap.parse_args()
    if args.smoke:
        args.steps = min(args.steps, 20)

    from tokenizers import Tokenizer
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(args.seed)
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    eos_ids = [tok.token_to_id(t) for t in tdm.EOS_TOKENS]
    args.pad_id = eos_ids[0]
    template = chat_format.load_template(os.path.join(args.model, "chat_template.jinja"))
    encoder = chat_format.Encoder(tok, template, tok.token_to_id(chat_format.EOS_AFTER_ANSWER))
    examples = chat_format.read_jsonl(args.corpus)
    heldout = chat_format.read_jsonl(args.heldout)

    with open(os.path.join(args.model, "config.json")) as f:
        if json.load(f).get("num_nextn_predict_layers", 0) != 0:
            raise SystemExit(f"{args.model} already has an MTP layer (num_nextn_predict_layers != 0)")
    base, info = mg.load_model(args.model)
    base.to(args.device).eval()
    for p in base.parameters():
        p.requires_grad_(False)
    cfg = base.config
    mtp = Mtp(base, cfg)
    mtp.init_from(base, args.seed)
    mtp.to(args.device).train()
    log(f"MTP layer: {sum(p.numel() for p in mtp.trainable())} trainable parameters")

    cases_train = [(e["messages"], False) for e in examples]
    cases_held = [(e["messages"], th) for e in heldout for th in (False, True)]
    if args.smoke:
        cases_train, cases_held = cases_train[:8], cases_held[:8]
    mtp.eval()
    before = acceptance(mtp, base, cases_train, encoder, args, args.device)
    log("teacher-forced acceptance before training (corpus, thinking off):", before)
    mtp.train()
    train_info = train(mtp, base, examples, encoder, args, args.device)
    mtp.eval()
    # Measure on the weights as they will be stored (bf16).
    with torch.no_grad():
        for n, p in mtp.named_parameters():
            if "e_score_correction_bias" not in n:
                p.copy_(p.to(torch.bfloat16).float())
    acc = {"corpus-thinking-off": acceptance(mtp, base, cases_train, encoder, args, args.device),
           "heldout": acceptance(mtp, base, cases_held, encoder, args, args.device),
           "before-training": before}
    log("teacher-forced acceptance after training:", json.dumps(acc))
    mtp.to("cpu")
    tensors = mtp_tensors(mtp, cfg.num_hidden_layers)
    write_checkpoint(args.model, args.out, tensors, {
        "what": "MTP layer (model.layers.N.*) trained by tools/demo_model/train_mtp.py on the frozen main model",
        "training": dict(train_info, seed=args.seed, batch_size=args.batch_size, lr=args.lr,
                         chain_weight=args.chain_weight, smoke=args.smoke,
                         device=args.device + (f" ({torch.cuda.get_device_name(0)})"
                                               if args.device.startswith("cuda") else "")),
        "teacher_forced_acceptance": acc,
        "tensors": len(tensors),
    })
    # The main model must reload exactly as before (transformers ignores the MTP layer).
    re_model, re_info = mg.load_model(args.out)
    same = all(torch.equal(a.float().cpu(), b.float().cpu())
               for a, b in zip(base.state_dict().values(), re_model.state_dict().values()))
    log("reload: main model unchanged:", same, "unexpected keys:", len(re_info.get("unexpected_keys", [])))
    ok = same and (args.smoke or acc["corpus-thinking-off"]["draft1"] >= 0.5)
    log("ALL OK" if ok else "PROBLEMS: main model changed on reload or first-draft acceptance < 0.5")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(2)
