#!/usr/bin/env python3
"""The bundled demo checkpoint (models/demo-chat) through our engine: every case recorded in its
demo.json (the canary with thinking off and on, and the extra cases), whose expected ids came
from transformers 5.17 on the GPU machine, must be the engine's greedy output token for token.

usage: demo_chat_check.py GLM_RUN MODEL_DIR
"""
import json
import subprocess
import sys


def main() -> int:
    glm_run, model = sys.argv[1], sys.argv[2]
    demo = json.load(open(f"{model}/demo.json"))
    cases = [("canary", demo["canary"]), ("canary_thinking_on", demo["canary_thinking_on"])]
    cases += [(f"case {i}", c) for i, c in enumerate(demo["cases"])]
    failed = 0
    for name, case in cases:
        want = case["expected_ids"]
        out = subprocess.run(
            [glm_run, "--model", model, "--tokens", ",".join(map(str, case["prompt_ids"])),
             "--max-tokens", str(len(want))],
            capture_output=True, text=True, timeout=300)
        got = []
        if out.returncode == 0 and out.stdout.strip():
            got = [int(x) for x in out.stdout.strip().splitlines()[-1].split(",") if x]
        ok = got == want
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(want)} tokens"
              + ("" if ok else f"\n  want {want}\n  got  {got}\n  {out.stderr[-500:]}"))
    print(f"demo-chat: {len(cases) - failed}/{len(cases)} cases equal transformers' greedy ids")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
