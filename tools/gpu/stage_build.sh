#!/usr/bin/env bash
# Stages a CPU-machine build of the kernel tests for the GPU machine: copies the test binaries and
# the bench (debug info stripped, to stay under the device tool's 64 MiB transfer limit) into
# .gpurun/bin and the non-system shared libraries they link (Debian's Abseil, spdlog, fmt; the
# GPU image has none of them) into .gpurun/lib. .gpurun/ is git-ignored via .git/info/exclude.
# Carry .gpurun to the GPU machine; run_kernel_tests.sh uses it when present.
# Env: BUILD_DIR (default build-gpu), STAGE_DIR (default .gpurun; any .gpurun* name is
# git-ignored), BINS (space-separated binaries; default the kernel tests and bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-gpu}
stage=${STAGE_DIR:-.gpurun}
mkdir -p .git/info
grep -qx "/.gpurun\*/" .git/info/exclude 2>/dev/null || echo "/.gpurun*/" >>.git/info/exclude
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"
if [[ -n ${BINS:-} ]]; then
  read -r -a bins <<<"$BINS"
else
  bins=("$build"/kernels/*_test "$build"/kernels/topk_radix_bench)
fi
for b in "${bins[@]}"; do
  strip --strip-debug -o "$stage/bin/$(basename "$b")" "$b"
done
for b in "${bins[@]}"; do
  ldd "$b"
done | awk '/=> \//{print $3}' | sort -u | grep -E "absl|spdlog|fmt|gtest|gmock|yaml|xxhash|pcre2" |
  xargs -r -I{} cp -L {} "$stage/lib/"
du -sh "$stage"
