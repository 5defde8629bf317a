#!/usr/bin/env python3
"""Checks the demo corpus without PyTorch: JSON shape, plain ASCII, no repeated question, the
chat rendering of every example (both thinking modes) and its token counts under the tiny-chat
tokenizer (encoded with bpe_ref.py, the plain-Python twin of `tokenizers` for that file).

Usage: python3 tools/demo_model/check_corpus.py [--show N]
Needs jinja2 and regex. Exit 1 on any problem.
"""
import argparse
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import bpe_ref  # noqa: E402
import chat_format  # noqa: E402

TINY_CHAT = os.path.join(ROOT, "tests", "golden", "tiny-chat")
MAX_ANSWER_TOKENS = 128  # train_demo_model.py generates up to this many
DEMO_QUESTION = "What is glmctl?"  # tools/demo.sh asks this with max_tokens 24


class _IdsTokenizer:
    """bpe_ref.ByteLevelBpe with the `tokenizers` surface chat_format.Encoder uses."""

    class _Encoding:
        def __init__(self, ids):
            self.ids = ids

    def __init__(self, bpe):
        self.bpe = bpe

    def encode(self, text):
        return self._Encoding(self.bpe.encode(text))

    def token_to_id(self, text):
        return self.bpe.token_id(text)

    def decode(self, ids, skip_special_tokens=False):
        return self.bpe.decode(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", type=int, default=3, help="print this many rendered examples")
    ap.add_argument("--conversations", type=int, default=500,
                    help="sampled multi-turn conversations to check the piecewise encoding on")
    args = ap.parse_args()
    template = chat_format.load_template(os.path.join(TINY_CHAT, "chat_template.jinja"))
    tok = bpe_ref.ByteLevelBpe(os.path.join(TINY_CHAT, "tokenizer.json"))
    eos = tok.token_id(chat_format.EOS_AFTER_ANSWER)
    encoder = chat_format.Encoder(_IdsTokenizer(tok), template, eos)
    problems = []
    stats = {}
    questions = set()
    for name in ("corpus.jsonl", "heldout.jsonl"):
        path = os.path.join(HERE, name)
        recs = chat_format.read_jsonl(path)
        answers = set()
        p_lens, a_lens = [], []
        for rec in recs:
            where = f"{name}:{rec['line']}"
            msgs = rec["messages"]
            for m in msgs:
                c = m["content"]
                if not c.isascii() or c != c.strip() or "\n" in c:
                    problems.append(f"{where}: content must be one line of plain ASCII without "
                                    f"leading/trailing spaces: {c!r}")
            q = msgs[0]["content"].lower()
            if q in questions:
                problems.append(f"{where}: question repeated (also in corpus or heldout): {q!r}")
            questions.add(q)
            answers.add(msgs[1]["content"])
            for thinking in (False, True):
                prompt, target = chat_format.training_texts(template, msgs, thinking)
                try:
                    p_ids, t_ids = encoder.slow(msgs, thinking)
                except ValueError as e:
                    problems.append(f"{where}: {e}")
                    continue
                p_lens.append(len(p_ids))
                a_lens.append(len(t_ids))
                if len(t_ids) > MAX_ANSWER_TOKENS:
                    problems.append(f"{where}: answer is {len(t_ids)} tokens (> {MAX_ANSWER_TOKENS})")
                if args.show > 0 and not thinking:
                    args.show -= 1
                    print(f"--- {where} thinking={thinking}\nprompt {len(p_ids)} tokens: {prompt!r}\n"
                          f"  ids {p_ids}\ntarget {len(t_ids)} tokens: {target!r} + <|user|>\n"
                          f"  ids {t_ids}")
            if msgs[0]["content"] == DEMO_QUESTION:
                n = len(tok.encode(msgs[1]["content"])) + 1
                print(f"demo question {DEMO_QUESTION!r}: answer {n} tokens with the eos "
                      f"(tools/demo.sh allows 24)")
        stats[name] = (len(recs), len(answers), p_lens, a_lens)
    if "corpus.jsonl" in stats:
        corpus_answers = {r["messages"][1]["content"] for r in chat_format.read_jsonl(os.path.join(HERE, "corpus.jsonl"))}
        for rec in chat_format.read_jsonl(os.path.join(HERE, "heldout.jsonl")):
            if rec["messages"][1]["content"] not in corpus_answers:
                problems.append(f"heldout.jsonl:{rec['line']}: its answer is not a corpus answer")
    # The trainer's piecewise encoding (chat_format.Encoder) against render + encode, on sampled
    # conversations with system messages and history, as train_demo_model.py checks it there.
    corpus = chat_format.read_jsonl(os.path.join(HERE, "corpus.jsonl"))
    rng = random.Random(1)
    convs = [chat_format.sample_conversation(rng, corpus, rng.randrange(len(corpus)), 0.5, 0.7)
             for _ in range(args.conversations)]
    if not encoder.verify(convs):
        problems.append("piecewise encoding differs from render + encode (see the warning)")
    lens = sorted(sum(map(len, encoder(m, th))) for m, th in convs)
    print(f"{len(convs)} sampled conversations (system 50%, 1-2 history turns 70%): piecewise "
          f"encoding == render+encode; tokens median {lens[len(lens) // 2]}, max {lens[-1]}, "
          f"{sum(n > 256 for n in lens)} longer than 256 (index_topk), "
          f"{sum(n > 448 for n in lens)} longer than 448 (--max-len)")
    for name, (n, n_ans, p_lens, a_lens) in stats.items():
        print(f"{name}: {n} examples, {n_ans} distinct answers; prompt tokens min/mean/max "
              f"{min(p_lens)}/{sum(p_lens) / len(p_lens):.1f}/{max(p_lens)}; answer tokens (with "
              f"eos) min/mean/max {min(a_lens)}/{sum(a_lens) / len(a_lens):.1f}/{max(a_lens)}; "
              f"longest sequence {max(p + a for p, a in zip(p_lens, a_lens))}")
    for p in problems:
        print("PROBLEM", p)
    print("OK" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
