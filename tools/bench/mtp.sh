#!/usr/bin/env bash
# MTP speculative decoding through a local cluster on loopback: single-stream decode tokens/s with
# k = 0..4 drafts per step, and the acceptance rate, on a PP 2 replica (two agents, CPU backend)
# of tests/golden/tiny-mtp (its MTP layer lives with the last stage).
#
#   BIN=build bash tools/bench/mtp.sh
#
# k = 0 is a cluster with model.mtp_draft_tokens: 0 (no MTP layer loaded); k = 1..4 one with
# model.mtp_draft_tokens: 4 and the request's --mtp-draft-tokens k. TOKENS (400) greedy tokens per
# request from the fixture's prompt, ROUNDS (3) requests per k; tokens/s is completion tokens /
# the request's wall time (glmctl generate, process start included) and the median is printed
# with its ratio to k = 0. Acceptance: drafts accepted / drafts verified over the k's requests,
# from `glmctl status --json`. BIN as in lifecycle.sh. Needs python3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOKENS=${TOKENS:-400}
ROUNDS=${ROUNDS:-3}
FIXTURE=${FIXTURE:-$ROOT/tests/golden/tiny-mtp}
# shellcheck source=tools/bench/lib.sh
source "$ROOT/tools/bench/lib.sh"
bench_find_bins mtp.sh

DIR=$(mktemp -d)
YAML=$DIR/cluster.yaml
cleanup() {
  timeout 60 "$GLMCTL" down "$YAML" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

read -r -a PORTS <<<"$(bench_free_ports 4)"
PROMPT=$(python3 -c "import json;print(','.join(map(str, json.load(open('$FIXTURE/reference.json'))['prompt_ids'])))")

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
    echo "  kv_cache_bytes: 8MiB"
    echo "  activation_reserve_bytes: 256MiB"
    echo "  max_num_seqs: 4"
    echo "  mtp_draft_tokens: $1"
    echo "parallel: {tensor: 1, pipeline: 2, layer_partition: [2, 1]}"
    echo "node_defaults: {memory_budget_bytes: 1GiB}"
    echo "nodes:"
    echo "  - {name: node-1, agent: 127.0.0.1:${PORTS[2]}}"
    echo "  - {name: node-2, agent: 127.0.0.1:${PORTS[3]}}"
  } >"$YAML"
}

now() { date +%s.%N; }
# spec FIELD: replica 0's spec_decode FIELD (0 when MTP is off).
spec() {
  timeout 10 "$GLMCTL" status "$YAML" --json |
    python3 -c "import json,sys;print(json.load(sys.stdin)['replicas'][0].get('spec_decode',{}).get('$1',0))"
}
# run K: tokens/s of one request (K: --mtp-draft-tokens, "" = the replica's).
run() {
  local start out n
  local extra=()
  [[ -n $1 ]] && extra=(--mtp-draft-tokens "$1")
  start=$(now)
  out=$(timeout 300 "$GLMCTL" generate "$YAML" --tokens "$PROMPT" --max-tokens "$TOKENS" "${extra[@]}")
  n=$(sed -n 's/.*completion_tokens=\([0-9]*\).*/\1/p' <<<"$out")
  python3 -c "print('%.1f' % ($n / ($(now) - $start)))"
}

echo "PP 2 (layers [2, 1] + MTP on the last stage), $(basename "$FIXTURE"), CPU backend, loopback;" \
  "$TOKENS greedy tokens per request, $ROUNDS requests per k"
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
  d0=$(spec draft_tokens)
  a0=$(spec accepted_tokens)
  vals=()
  for ((r = 0; r < ROUNDS; r++)); do vals+=("$(run "$k")"); done
  d1=$(spec draft_tokens)
  a1=$(spec accepted_tokens)
  rate[$k]=$(median "${vals[@]}")
  echo "k=$k: ${rate[$k]} tokens/s ($(python3 -c "print('%.2f' % (${rate[$k]} / ${rate[0]}))")x k=0)," \
    "acceptance $(python3 -c "print('%.3f' % (($a1 - $a0) / max($d1 - $d0, 1)))") ($((a1 - a0)) of $((d1 - d0)) drafts) (runs: ${vals[*]})"
done
