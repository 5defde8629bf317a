#!/usr/bin/env bash
# Main job: installs what the build needs, builds glmctl and the two daemons, and brings up the
# local 4-node demo cluster (controller + 4 agents on 127.0.0.1, started by glmctl as background
# processes). Leaves it running; `build/glmctl down configs/local-demo.yaml` stops it.
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
echo "The demo cluster keeps running (logs and pid files under $(dirname "$config")/.glmctl/)."
echo "Stop it with:   $glmctl down $config"
