#!/usr/bin/env bash
# Installs the Debian 12 packages glmctl needs to build and test. Idempotent: packages already
# present are skipped, so re-running it costs one dpkg query.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libxxhash-dev libpcre2-dev libboost-dev libssl-dev openssl libibverbs-dev libgloo-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3 python3-jinja2 python3-yaml curl
  clang libclang-rt-14-dev iproute2
  systemd shellcheck procps  # tests/deploy: systemd-analyze verify, shellcheck, /bin/kill
)
# Node.js runs the reference tokenizer in tests; any install of it will do (a machine may carry
# a newer one than Debian's, which apt's npm package would conflict with).
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present"
fi
