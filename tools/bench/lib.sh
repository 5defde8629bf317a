# shellcheck shell=bash
# Shared by the local-cluster benchmarks (source it; needs ROOT set to the repository root).
#
# bench_find_bins SCRIPT: GLMCTL=$BIN/glmctl (BIN defaults to $ROOT/build) and GLM_BIN_DIR, a
# folder with glm-agent and glm-controller (found next to glmctl or in the build tree's
# subfolders unless GLM_BIN_DIR is set), exported for glmctl's local launcher.
# bench_free_ports N: N free loopback ports, space-separated.
# median V...: the median of the numbers given ("n/a" for none; "timeout" entries skipped).

bench_find_bins() {
  BIN=${BIN:-$ROOT/build}
  GLMCTL=$BIN/glmctl
  [[ -x $GLMCTL ]] || { echo "$1: no glmctl at BIN=$BIN (build glmctl glm-agent glm-controller)" >&2; exit 1; }
  if [[ -z ${GLM_BIN_DIR:-} ]]; then
    local d agent_dir="" controller_dir=""
    for d in "$BIN" "$BIN/../.." "$BIN/../../agent" "$BIN/.."; do
      [[ -x $d/glm-agent ]] && agent_dir=$d
      [[ -x $d/glm-controller ]] && controller_dir=$d
    done
    [[ -n $agent_dir && -n $controller_dir ]] ||
      { echo "$1: glm-agent / glm-controller not found near $BIN; set GLM_BIN_DIR" >&2; exit 1; }
    GLM_BIN_DIR=$(mktemp -d)
    ln -s "$(cd "$agent_dir" && pwd)/glm-agent" "$GLM_BIN_DIR/glm-agent"
    ln -s "$(cd "$controller_dir" && pwd)/glm-controller" "$GLM_BIN_DIR/glm-controller"
  fi
  export GLM_BIN_DIR
}

bench_free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

median() {
  python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[1:] if x!='timeout']; print('%.2f' % statistics.median(v) if v else 'n/a')" "$@"
}
