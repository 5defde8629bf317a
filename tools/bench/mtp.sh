#!/usr/bin/env bash
# MTP speculative decoding through a local cluster on loopback: single-stream decode tokens/s with
# k = 0..4 drafts per step, and the acceptance rate, on a replica of PP (2) agents whose last
# stage holds the MTP layer, on BACKEND (cpu).
#
#   BIN=build bash tools/bench/mtp.sh                                  # tests/golden/tiny-mtp
#   BIN=build FIXTURE=models/demo-chat bash tools/bench/mtp.sh         # the demo model
#   PP=1 BACKEND=cuda FIXTURE=models/demo-chat bash tools/bench/mtp.sh # one agent on a GPU
#
# FIXTURE: a checkpoint with an MTP layer and either reference.json (a golden fixture: its prompt,
# up to TOKENS greedy tokens) or demo.json (the demo model: its canary and recorded chats, each
# answered up to its stop token). Layers split as evenly as they go over the PP stages.
# k = 0 is a cluster with model.mtp_draft_tokens: 0 (no MTP layer loaded); k = 1..4 one with
# model.mtp_draft_tokens: 4 and the request's --mtp-draft-tokens k. ROUNDS (3) passes over the
# prompts per k; tokens/s is completion tokens / wall time of the pass (glmctl generate per
# prompt, process start included), the median pass is printed with its ratio to k = 0.
# Acceptance: drafts accepted / drafts verified over the k's requests, from
# `glmctl status --json`. Every reply must start with the fixture's recorded greedy ids (exit 1
# and the differing replies otherwise). BIN as in lifecycle.sh. Needs python3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOKENS=${TOKENS:-400}
ROUNDS=${ROUNDS:-3}
PP=${PP:-2}
BACKEND=${BACKEND:-cpu}
FIXTURE=${FIXTURE:-$ROOT/tests/golden/tiny-mtp}
# shellcheck source=tools/bench/lib.sh
source "$ROOT/tools/bench/lib.sh"
bench_find_bins mtp.sh

DIR=$(mktemp -d)
YAML=$DIR/cluster.yaml
cleanup() {
  timeout 60 "$GLMCTL" down "$YAML" >/dev/null 2>&1 || true
  [[ -n ${KEEP:-} ]] || rm -rf "$DIR"
}
trap cleanup EXIT

read -r -a PORTS <<<"$(bench_free_ports $((PP + 2)))"
FIXTURE=$(cd "$FIXTURE" && pwd)
# PROMPTS: per line the prompt's ids and the fixture's recorded greedy ids (transformers'),
# comma-separated, with a space between.
mapfile -t PROMPTS < <(python3 - "$FIXTURE" <<'PY'
import json, os, sys
d = sys.argv[1]
if os.path.exists(os.path.join(d, "reference.json")):
    ref = json.load(open(os.path.join(d, "reference.json")))
    cases = [(ref["prompt_ids"], ref["greedy_ids"])]
else:
    demo = json.load(open(os.path.join(d, "demo.json")))
    cases = [(c["prompt_ids"], c["expected_ids"]) for c in [demo["canary"]] + demo.get("cases", [])]
for prompt, want in cases:
    print(",".join(map(str, prompt)), ",".join(map(str, want)))
PY
)
LAYERS=$(python3 -c "import json;print(json.load(open('$FIXTURE/config.json'))['num_hidden_layers'])")
PARTITION=$(python3 -c "n, p = $LAYERS, $PP; print([n // p + (s < n % p) for s in range(p)])")

# write_yaml K: the cluster with model.mtp_draft_tokens K.
write_yaml() {
  {
    echo "name: bench-mtp-$$"
    echo "local: true"
    echo "controller: {listen: 127.0.0.1:${PORTS[0]}, gateway: 127.0.0.1:${PORTS[1]}}"
    echo "model:"
    echo "  path: $FIXTURE"
    echo "  max_model_len: 512"
    echo "  kv_cache_dtype: bf16"
    echo "  backend: $BACKEND"
    echo "  kv_cache_bytes: 8MiB"
    echo "  activation_reserve_bytes: 256MiB"
    echo "  max_num_seqs: 4"
    echo "  mtp_draft_tokens: $1"
    echo "parallel: {tensor: 1, pipeline: $PP, layer_partition: $PARTITION}"
    echo "node_defaults: {memory_budget_bytes: 1GiB}"
    echo "nodes:"
    for ((i = 0; i < PP; i++)); do
      echo "  - {name: node-$((i + 1)), agent: 127.0.0.1:${PORTS[$((i + 2))]}}"
    done
  } >"$YAML"
}

now() { date +%s.%N; }
# counters: replica 0's "draft_tokens accepted_tokens" (0 0 when MTP is off), read once the
# status has settled (the head's status reaches the controller periodically: two equal reads
# 0.5 s apart, at most 10 s).
counters() {
  local prev="" cur i
  for ((i = 0; i < 20; i++)); do
    cur=$(timeout 10 "$GLMCTL" status "$YAML" --json | python3 -c "
import json, sys
s = json.load(sys.stdin)['replicas'][0].get('spec_decode', {})
print(s.get('draft_tokens', 0), s.get('accepted_tokens', 0))")
    [[ $cur == "$prev" ]] && break
    prev=$cur
    sleep 0.5
  done
  echo "$cur"
}
# run K: tokens/s of one pass over the prompts (K: --mtp-draft-tokens, "" = the replica's). A
# reply whose ids do not start with the recorded greedy ids is counted in $DIR/differ.
run() {
  local start out n total=0 line prompt want
  local extra=()
  [[ -n $1 ]] && extra=(--mtp-draft-tokens "$1")
  start=$(now)
  for line in "${PROMPTS[@]}"; do
    read -r prompt want <<<"$line"
    out=$(timeout 300 "$GLMCTL" generate "$YAML" --tokens "$prompt" --max-tokens "$TOKENS" "${extra[@]}")
    n=$(sed -n 's/.*completion_tokens=\([0-9]*\).*/\1/p' <<<"$out")
    total=$((total + n))
    [[ "$(tail -n 1 <<<"$out")," == "$want,"* ]] || echo "k=${1:-0}: $prompt -> $(tail -n 1 <<<"$out")" >>"$DIR/differ"
  done
  python3 -c "print('%.1f' % ($total / ($(now) - $start)))"
}

echo "PP $PP (layers $PARTITION + MTP on the last stage), $(basename "$FIXTURE"), $BACKEND backend, loopback;" \
  "${#PROMPTS[@]} prompt(s), up to $TOKENS greedy tokens each, $ROUNDS passes per k"
declare -A rate
write_yaml 0
timeout 300 "$GLMCTL" up "$YAML" >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log"; exit 1; }
vals=()
for ((r = 0; r < ROUNDS; r++)); do vals+=("$(run "")"); done
rate[0]=$(median "${vals[@]}")
echo "k=0: ${rate[0]} tokens/s (runs: ${vals[*]})"
timeout 60 "$GLMCTL" down "$YAML" >/dev/null 2>&1

write_yaml 4
timeout 300 "$GLMCTL" up "$YAML" >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log"; exit 1; }
for k in 1 2 3 4; do
  read -r d0 a0 <<<"$(counters)"
  vals=()
  for ((r = 0; r < ROUNDS; r++)); do vals+=("$(run "$k")"); done
  read -r d1 a1 <<<"$(counters)"
  rate[$k]=$(median "${vals[@]}")
  echo "k=$k: ${rate[$k]} tokens/s ($(python3 -c "print('%.2f' % (${rate[$k]} / ${rate[0]}))")x k=0)," \
    "acceptance $(python3 -c "print('%.3f' % (($a1 - $a0) / max($d1 - $d0, 1)))") ($((a1 - a0)) of $((d1 - d0)) drafts) (runs: ${vals[*]})"
done
if [[ -s $DIR/differ ]]; then
  echo "replies that differ from the recorded greedy ids:"
  cat "$DIR/differ"
  exit 1
fi
echo "every reply starts with the fixture's recorded greedy ids (transformers'), for every k"
