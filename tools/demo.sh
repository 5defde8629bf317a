#!/usr/bin/env bash
# Main job: installs what the build needs, builds glmctl and the two daemons, brings up the
# local 4-node demo cluster (controller + 4 agents on 127.0.0.1, started by glmctl as background
# processes) and sends one chat completion through its OpenAI-compatible gateway. Leaves it
# running for curl and OpenAI clients; `build/glmctl down configs/local-demo.yaml` stops it.
# Env: BUILD_DIR (default build), JOBS (default 2), CONFIG (default configs/local-demo.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-2}
config=${CONFIG:-configs/local-demo.yaml}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build_dir" -j "$jobs" --target glmctl glm-controller glm-agent
glmctl="$build_dir/glmctl"

echo "== glmctl up $config"
"$glmctl" up "$config"
echo
echo "== glmctl status $config"
"$glmctl" status "$config"
echo
echo "== glmctl health $config"
"$glmctl" health "$config"
echo
echo "== glmctl generate $config --tokens 123,134,242,46 --max-tokens 8"
"$glmctl" generate "$config" --tokens 123,134,242,46 --max-tokens 8
echo

gateway="http://$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["controller"]["gateway"])' "$config")"
model=$(curl -sS --max-time 10 "$gateway/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
request='{"model": "'"$model"'", "messages": [{"role": "user", "content": "What is glmctl?"}], "max_tokens": 64, "chat_template_kwargs": {"enable_thinking": false}}'
echo "== POST $gateway/v1/chat/completions  $request"
curl -sS --max-time 120 "$gateway/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "$request" | python3 -c '
import json, sys
r = json.load(sys.stdin)
if "error" in r:
    sys.exit("gateway error: " + json.dumps(r["error"]))
m = r["choices"][0]["message"]
print("reasoning:", json.dumps(m.get("reasoning_content")))
print("answer:   ", json.dumps(m.get("content")))
print("finish:   ", r["choices"][0]["finish_reason"], " usage:", json.dumps(r["usage"]))'
echo
echo "The demo cluster keeps running (logs and pid files under $(dirname "$config")/.glmctl/)."
echo "Its OpenAI-compatible API: $gateway/v1 (model \"$model\"), for example"
echo "  curl $gateway/v1/chat/completions -H 'Content-Type: application/json' -d '$request'"
echo "Stop it with:   $glmctl down $config"
