#!/usr/bin/env bash
# Builds everything and runs every test (ctest). Installs what it needs first. CUDA targets are
# compiled when nvcc is present; GPU tests skip with a printed reason when no GPU is found.
# Usage: tools/test.sh [extra ctest args]   Env: BUILD_DIR (default build), JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-2}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 600 "$@"
