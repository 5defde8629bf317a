#!/usr/bin/env python3
"""The bundled demo checkpoint (models/demo-chat) through our engine: every case recorded in its
demo.json (the canary with thinking off and on, and the extra cases), whose expected ids came
from transformers 5.17 on the GPU machine, must be the engine's greedy output token for token.

The checkpoint's MTP layer was trained in PyTorch (tools/demo_model/train_mtp.py) to a
teacher-forced first-draft acceptance of demo.json's mtp.teacher_forced_acceptance on the corpus
answers. With drafting on (--mtp 1 and --mtp 3) the output must stay the same ids, and the
engine's first drafts must be accepted at least MIN_DRAFT1_ACCEPTANCE of the time: an engine that
ran the MTP layer differently from PyTorch (the wrong hidden state, norm or position) would
draft near-random tokens.

usage: demo_chat_check.py GLM_RUN MODEL_DIR
"""
import json
import re
import subprocess
import sys


MIN_DRAFT1_ACCEPTANCE = 0.95


def run(glm_run, model, case, mtp):
    """The engine's greedy ids for the case and its (draft_tokens, accepted) counts."""
    out = subprocess.run(
        [glm_run, "--model", model, "--tokens", ",".join(map(str, case["prompt_ids"])),
         "--max-tokens", str(len(case["expected_ids"])), "--mtp", str(mtp)],
        capture_output=True, text=True, timeout=300)
    got, drafts, accepted = [], 0, 0
    if out.returncode == 0 and out.stdout.strip():
        got = [int(x) for x in out.stdout.strip().splitlines()[-1].split(",") if x]
    m = re.search(r"draft_tokens=(\d+) accepted=(\d+)", out.stderr)
    if m:
        drafts, accepted = int(m.group(1)), int(m.group(2))
    return got, drafts, accepted, out.stderr[-500:]


def main() -> int:
    glm_run, model = sys.argv[1], sys.argv[2]
    demo = json.load(open(f"{model}/demo.json"))
    cases = [("canary", demo["canary"]), ("canary_thinking_on", demo["canary_thinking_on"])]
    cases += [(f"case {i}", c) for i, c in enumerate(demo["cases"])]
    has_mtp = json.load(open(f"{model}/config.json")).get("num_nextn_predict_layers", 0) > 0
    failed = 0
    totals = {1: [0, 0], 3: [0, 0]}
    for name, case in cases:
        want = case["expected_ids"]
        for mtp in (0, 1, 3) if has_mtp else (0,):
            got, drafts, accepted, err = run(glm_run, model, case, mtp)
            ok = got == want
            failed += not ok
            if mtp:
                totals[mtp][0] += drafts
                totals[mtp][1] += accepted
            print(f"{'ok  ' if ok else 'FAIL'} {name} --mtp {mtp}: {len(want)} tokens"
                  + (f", {accepted} of {drafts} drafts accepted" if mtp else "")
                  + ("" if ok else f"\n  want {want}\n  got  {got}\n  {err}"))
    print(f"demo-chat: {len(cases)} cases x {3 if has_mtp else 1} runs, {failed} differ from "
          "transformers' greedy ids")
    if has_mtp:
        for mtp, (drafts, accepted) in totals.items():
            print(f"--mtp {mtp}: {accepted} of {drafts} drafts accepted ({accepted / max(drafts, 1):.3f})")
        d1, a1 = totals[1]
        if d1 == 0 or a1 / d1 < MIN_DRAFT1_ACCEPTANCE:
            print(f"FAIL: first-draft acceptance {a1}/{d1} is below {MIN_DRAFT1_ACCEPTANCE} (PyTorch's "
                  f"teacher-forced figure: {demo.get('mtp', {}).get('teacher_forced_acceptance')})")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
