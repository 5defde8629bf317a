#!/bin/bash
# Trains the demo checkpoint on the GPU machine (PyTorch + transformers 5.17, no network).
# Pass to the device tool's `run` (from the repository root; nothing to carry):
#     bash tools/demo_model/run_on_device.sh [train_demo_model.py flags]
# It writes $OUT/demo-model.tar.gz (the checkpoint directory demo-chat/) and $OUT/log. The whole
# run is bounded (TIME_LIMIT seconds, default 560, under the device tool's 600 s per command);
# training itself stops at --max-train-seconds (default 330). Unpack here with
#     mkdir -p models && rm -rf models/demo-chat && tar -C models -xzf <files_at>/demo-model.tar.gz
# Smoke run first (about a minute, every phase on a few cases, catches API drift):
#     bash tools/demo_model/run_on_device.sh --smoke
# With --mtp first, it trains the MTP layer of models/demo-chat instead (train_mtp.py; the main
# model is kept as it is) and writes the same tarball:
#     bash tools/demo_model/run_on_device.sh --mtp [--smoke]
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/demo-model-out}
TIME_LIMIT=${TIME_LIMIT:-560}
mkdir -p "$OUT"
W=$(mktemp -d)
{
  python3 -c 'import torch, transformers, tokenizers, safetensors, jinja2; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__, "jinja2", jinja2.__version__); print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} 2>&1 | tee "$OUT/log"
if [ "${1:-}" = --mtp ]; then
  shift
  trainer=(tools/demo_model/train_mtp.py --model models/demo-chat)
else
  trainer=(tools/demo_model/train_demo_model.py)
fi
timeout --signal=TERM --kill-after=10 "$TIME_LIMIT" \
  python3 "${trainer[@]}" --out "$W/demo-chat" "$@" 2>&1 | tee -a "$OUT/log"
rc=$?
if [ "$rc" = 124 ]; then
  echo "run_on_device.sh: killed after ${TIME_LIMIT}s (TIME_LIMIT); lower --steps or --max-train-seconds" | tee -a "$OUT/log"
fi
if [ -f "$W/demo-chat/model.safetensors" ]; then
  tar -C "$W" -czf "$OUT/demo-model.tar.gz" demo-chat
else
  echo "run_on_device.sh: no checkpoint was written" | tee -a "$OUT/log"
fi
ls -la "$OUT" "$W/demo-chat" 2>&1 | tee -a "$OUT/log"
exit $rc
