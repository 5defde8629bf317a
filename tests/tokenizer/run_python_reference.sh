#!/usr/bin/env bash
# ctest tokenizer_python_reference: compares glm_tokenizer with the Python `tokenizers` library's
# output recorded on the GPU machine (tests/golden/tokenizer/: tokenizer.json, reference.json
# with one {text, ids, decoded} per corpus line).
# Usage: run_python_reference.sh TOKENIZER_COMPARE_BINARY GOLDEN_DIR
# Exit 77 (ctest: skipped) with the reason while the fixture has not been committed.
set -euo pipefail
compare=$1
golden=$2
if [ ! -f "$golden/tokenizer.json" ] || [ ! -f "$golden/reference.json" ]; then
  echo "SKIP: $golden/tokenizer.json or reference.json missing (made on the GPU machine with" \
       "the Python tokenizers library)"
  exit 77
fi
# reference.json records Tokenizer.encode(text).ids, whose add_special_tokens defaults to true.
exec "$compare" --tokenizer "$golden/tokenizer.json" --reference "$golden/reference.json" \
  --add-special-tokens true
