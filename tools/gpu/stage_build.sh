#!/usr/bin/env bash
# Stages a CPU-machine build of the kernel tests for the GPU machine: copies the test binaries and
# the bench (debug info stripped, to stay under the device tool's 64 MiB transfer limit) into
# .gpurun/bin and the non-system shared libraries they link (Debian's Abseil, spdlog, fmt; the
# GPU image has none of them) into .gpurun/lib. .gpurun/ is git-ignored via .git/info/exclude.
# Carry .gpurun to the GPU machine; run_kernel_tests.sh uses it when present.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-gpu}
mkdir -p .git/info
grep -qx "/.gpurun/" .git/info/exclude 2>/dev/null || echo "/.gpurun/" >>.git/info/exclude
rm -rf .gpurun
mkdir -p .gpurun/bin .gpurun/lib
bins=("$build"/kernels/*_test "$build"/kernels/topk_radix_bench)
for b in "${bins[@]}"; do
  strip --strip-debug -o ".gpurun/bin/$(basename "$b")" "$b"
done
for b in "${bins[@]}"; do
  ldd "$b"
done | awk '/=> \//{print $3}' | sort -u | grep -E "absl|spdlog|fmt|gtest|gmock|yaml|xxhash" |
  xargs -r -I{} cp -L {} .gpurun/lib/
du -sh .gpurun
