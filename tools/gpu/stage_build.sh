#!/usr/bin/env bash
# Stages a CPU-machine build for the GPU machine: copies the binaries (debug info stripped, to stay
# under the device tool's 64 MiB transfer limit once packed) into STAGE/bin, the non-system shared
# libraries they link (Debian's Abseil, spdlog, fmt, yaml-cpp, xxHash, PCRE2, GoogleTest, Gloo
# with hiredis, ibverbs and libnl; for the daemons gRPC, protobuf, c-ares, RE2 and OpenSSL; the
# GPU image has none of them) into STAGE/lib, and the commit
# they were built from (plus the count of changed files) into STAGE/build-info.txt. Carry STAGE
# (or a pack of it, see run_all_gpu.sh) to the GPU machine; tools/gpu/run_all_gpu.sh STAGE runs
# it there. Any .gpurun* name is git-ignored
# (through .git/info/exclude).
# Env: BUILD_DIR (default build-gpu), STAGE_DIR (default .gpurun-all), BINS (space-separated
# binaries; default every binary of `run_all_gpu.sh --bins BUILD_DIR`).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-gpu}
stage=${STAGE_DIR:-.gpurun-all}
mkdir -p .git/info
grep -qx "/.gpurun\*/" .git/info/exclude 2>/dev/null || echo "/.gpurun*/" >>.git/info/exclude
if [[ -n ${BINS:-} ]]; then
  read -r -a bins <<<"$BINS"
else
  read -r -a bins <<<"$(tools/gpu/run_all_gpu.sh --bins "$build")"
fi
((${#bins[@]} > 0)) || { echo "no binaries to stage (BINS empty, nothing built in $build)"; exit 2; }
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"
for b in "${bins[@]}"; do
  strip --strip-debug -o "$stage/bin/$(basename "$b")" "$b"
done
for b in "${bins[@]}"; do
  ldd "$b"
done | awk '/=> \//{print $3}' | sort -u | grep -E "absl|spdlog|fmt|gtest|gmock|yaml|xxhash|pcre2|gloo|hiredis|ibverbs|libnl|grpc|gpr|upb|address_sorting|cares|re2|protobuf|libssl|libcrypto" |
  xargs -r -I{} cp -L {} "$stage/lib/"
{
  git log -1 --format='commit %h %s' 2>/dev/null || echo "commit unknown"
  echo "changed files: $(GIT_OPTIONAL_LOCKS=0 git status --porcelain 2>/dev/null | wc -l), build $build"
} >"$stage/build-info.txt"
du -sh "$stage"
