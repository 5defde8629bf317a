#!/usr/bin/env bash
# Lifecycle timings of a local cluster on loopback: a rolling restart per replica, and a kill -9
# of an agent to out-of-rotation and to healed (no command: the launcher restarts the agent, the
# controller's self-healing re-forms its group, runs the canary and re-admits it).
#
#   BIN=build bash tools/bench/lifecycle.sh
#
# BIN: the folder holding glmctl (glm-controller and glm-agent are found next to it, or through
# GLM_BIN_DIR). Builds nothing. The cluster: tests/golden/tiny-chat, REPLICAS (2) replicas of
# one agent each (TP 1, CPU backend), in a temp dir with free loopback ports; `glmctl down` and
# the temp dir go at exit. ROUNDS (3) rounds of each measurement; the status is polled every
# 50 ms (`glmctl status --json`), which bounds the resolution. Prints one line per round and
# the medians. Needs python3 (free ports, JSON).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
REPLICAS=${REPLICAS:-2}
ROUNDS=${ROUNDS:-3}
# shellcheck source=tools/bench/lib.sh
source "$ROOT/tools/bench/lib.sh"
bench_find_bins lifecycle.sh

DIR=$(mktemp -d)
YAML=$DIR/cluster.yaml
NAME=bench-lifecycle-$$
cleanup() {
  timeout 60 "$GLMCTL" down "$YAML" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

read -r -a PORTS <<<"$(bench_free_ports $((REPLICAS + 2)))"
PROMPT=$(python3 -c "import json;print(json.load(open('$ROOT/tests/golden/tiny-chat/reference.json'))['prompt_ids'])")
EXPECT=$(python3 -c "import json;print(json.load(open('$ROOT/tests/golden/tiny-chat/reference.json'))['greedy_ids'][:8])")
{
  echo "name: $NAME"
  echo "local: true"
  echo "controller: {listen: 127.0.0.1:${PORTS[0]}, gateway: 127.0.0.1:${PORTS[1]}}"
  echo "model:"
  echo "  path: $ROOT/tests/golden/tiny-chat"
  echo "  max_model_len: 512"
  echo "  kv_cache_dtype: bf16"
  echo "  kv_cache_bytes: 8MiB"
  echo "  activation_reserve_bytes: 256MiB"
  echo "  max_num_seqs: 4"
  echo "  canary: {prompt_ids: $PROMPT, expect_ids: $EXPECT}"
  echo "parallel: {tensor: 1, pipeline: 1, replicas: $REPLICAS}"
  echo "lifecycle: {restart_budget: 100, restart_window_s: 600}"
  echo "node_defaults: {memory_budget_bytes: 1GiB}"
  echo "nodes:"
  for ((i = 1; i <= REPLICAS; i++)); do
    echo "  - {name: node-$i, agent: 127.0.0.1:${PORTS[$((i + 1))]}}"
  done
} >"$YAML"

timeout 300 "$GLMCTL" up "$YAML" >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log"; exit 1; }

now() { date +%s.%N; }
# replica_state R: "Ready", "Failed", ... of replica R.
replica_state() {
  timeout 10 "$GLMCTL" status "$YAML" --json 2>/dev/null |
    python3 -c "import json,sys;print(json.load(sys.stdin)['replicas'][$1]['state'])" 2>/dev/null || echo "?"
}
# await R STATE [not]: seconds until replica R is (not) STATE, polling every 50 ms; 120 s bound.
await() {
  local start t
  start=$(now)
  while :; do
    local s
    s=$(replica_state "$1")
    if { [[ ${3:-} == not ]] && [[ $s != "$2" ]]; } || { [[ ${3:-} != not ]] && [[ $s == "$2" ]]; }; then
      break
    fi
    t=$(python3 -c "print($(now) - $start)")
    python3 -c "import sys; sys.exit(0 if $t < 120 else 1)" || { echo "timeout"; return; }
    sleep 0.05
  done
  python3 -c "print('%.2f' % ($(now) - $start))"
}

echo "cluster: $REPLICAS replicas x 1 agent (tiny-chat, CPU backend), loopback; $ROUNDS rounds"
per_replica=()
for ((round = 1; round <= ROUNDS; round++)); do
  start=$(now)
  timeout 600 "$GLMCTL" restart "$YAML" --rolling >"$DIR/restart.log" 2>&1 || { cat "$DIR/restart.log"; exit 1; }
  total=$(python3 -c "print('%.2f' % ($(now) - $start))")
  mapfile -t each < <(sed -n 's/.*back in service (\([0-9.]*\) s).*/\1/p' "$DIR/restart.log")
  per_replica+=("${each[@]}")
  echo "rolling restart round $round: total ${total} s; per replica: ${each[*]} s"
done
echo "rolling restart: median per replica $(median "${per_replica[@]}") s (drain + stop + load + start + canary)"

out=()
healed=()
for ((round = 1; round <= ROUNDS; round++)); do
  r=$((REPLICAS - 1))
  pid=$(cat "$DIR/.glmctl/$NAME/agent-node-$REPLICAS.pid" 2>/dev/null || true)
  [[ -n $pid ]] || { echo "no pid file for node-$REPLICAS under $DIR/.glmctl/$NAME" >&2; exit 1; }
  kill -9 "$pid"
  o=$(await "$r" Ready not)
  h=$(await "$r" Ready)
  out+=("$o")
  healed+=("$o+$h")
  echo "kill -9 round $round: out of rotation after ${o} s, healed ${h} s later"
done
healed_total=()
for x in "${healed[@]}"; do healed_total+=("$(python3 -c "print($x)" 2>/dev/null || echo timeout)"); done
echo "kill -9: median to out of rotation $(median "${out[@]}") s, to healed $(median "${healed_total[@]}") s"
