#!/usr/bin/env bash
# ctest tokenizer_js_reference: compares glm_tokenizer with @huggingface/tokenizers (an
# independent pure-JS implementation, version pinned by package-lock.json) on every fixture
# tokenizer in fixtures/ and every corpus (corpus.jsonl here, ../golden/tokenizer/corpus.txt).
# Usage: run_js_reference.sh TOKENIZER_COMPARE_BINARY WORK_DIR
# Exit 77 (ctest: skipped) with the reason when node/npm are absent.
set -euo pipefail
compare=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node/npm not found; install nodejs and npm to compare against @huggingface/tokenizers"
  exit 77
fi
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/encode.mjs" "$work/"
(cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
status=0
compared=0
# The fixtures here, plus the Python-trained golden tokenizer once it is committed.
fixtures=("$here"/fixtures/*.json)
if [ -f "$here/../golden/tokenizer/tokenizer.json" ]; then
  fixtures+=("$here/../golden/tokenizer/tokenizer.json")
fi
for fixture in "${fixtures[@]}"; do
  for corpus in "$here/corpus.jsonl" "$here/../golden/tokenizer/corpus.txt"; do
    [ -f "$corpus" ] || continue
    out="$work/$(basename "$(dirname "$fixture")")-$(basename "$fixture" .json).$(basename "$corpus").js.json"
    node "$work/encode.mjs" "$fixture" "$corpus" >"$out"
    if ! "$compare" --tokenizer "$fixture" --reference "$out"; then status=1; fi
    compared=$((compared + 1))
  done
done
if [ "$compared" -eq 0 ]; then
  echo "FAIL: no fixture/corpus pairs found under $here"
  exit 1
fi
exit $status
