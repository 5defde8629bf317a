#!/bin/bash
# Regenerates the fixtures under tests/golden/ on the GPU machine (PyTorch + transformers 5.17).
# Pass to the device tool's `run` (from the repository root):
#     bash tools/golden/run_on_device.sh [--only tiny-dense,tokenizer,...]
# It writes $OUT/golden.tar.gz (the fixture tree), $OUT/hf_src.tar.gz (the installed transformers
# sources read for tests/golden/HF_NOTES.md) and $OUT/log. Unpack here with
#     tar -C tests/golden -xzf <files_at>/golden.tar.gz --strip-components=1
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/golden-out}
mkdir -p "$OUT"
W=$(mktemp -d)
python3 -c 'import torch, transformers, tokenizers, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__)' 2>&1 | tee "$OUT/log"
python3 tools/golden/make_golden.py --out "$W/golden" --src-dump "$W/hf_src" \
  --corpus tests/golden/tokenizer/corpus.txt "$@" 2>&1 | tee -a "$OUT/log"
rc=$?
tar -C "$W" -czf "$OUT/golden.tar.gz" golden
tar -C "$W" -czf "$OUT/hf_src.tar.gz" hf_src
ls -la "$OUT"
exit $rc
