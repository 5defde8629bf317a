#!/usr/bin/env bash
# The gateway's overhead next to nginx proxying the same backend, on loopback.
#
#   BENCH=build-cp/controller/gateway/glm-gateway-bench bash tools/bench/gateway_vs_nginx.sh
#
# Builds nothing. Runs, each under a timeout (about a minute in all with the defaults):
#   backend  glm-gateway-bench --serve-baseline P1: the bench's baseline server alone (the
#            gateway's answer bytes, pre-built; stream frames one per backend step, unthrottled)
#   nginx    Debian's nginx, one worker, in front of it on P2: HTTP/1.1 upstream keep-alive,
#            proxy_buffering off; foreground, config/pid/logs in a temp dir (the system nginx
#            config and service are never touched)
#   (a) glm-gateway-bench --target 127.0.0.1:P1   the backend directly
#   (b) glm-gateway-bench --target 127.0.0.1:P2   through nginx
#   (c) glm-gateway-bench                         the in-process gateway and its baseline
# then prints both comparisons: nginx added = (b) - (a); gateway added = gateway - baseline in (c).
# Installs nginx-light (and jq) with apt-get when missing (Debian 12; needs root).
#
# Environment: BENCH (the binary), REQUESTS (2000), STREAMS (200), TOKENS (64), CONCURRENCY (16),
# REPEATS (5), IO_THREADS (2), NGINX_WORKERS (1).
set -euo pipefail

BENCH=${BENCH:-build/controller/gateway/glm-gateway-bench}
REQUESTS=${REQUESTS:-2000}
STREAMS=${STREAMS:-200}
TOKENS=${TOKENS:-64}
CONCURRENCY=${CONCURRENCY:-16}
REPEATS=${REPEATS:-5}
IO_THREADS=${IO_THREADS:-2}
NGINX_WORKERS=${NGINX_WORKERS:-1}

die() { echo "gateway_vs_nginx: $*" >&2; exit 1; }

[[ -x "$BENCH" ]] ||
  die "no bench binary at BENCH=$BENCH: build it (cmake --build <dir> --target glm-gateway-bench)"

install_missing() {
  local want=()
  command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || want+=(nginx-light)
  command -v jq >/dev/null 2>&1 || want+=(jq)
  ((${#want[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing ${want[*]}: run as root, or apt-get install -y ${want[*]}"
  echo "installing ${want[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  local install=(apt-get install -y --no-install-recommends "${want[@]}")
  timeout 90 "${install[@]}" >/dev/null ||
    { timeout 60 apt-get update >/dev/null && timeout 90 "${install[@]}" >/dev/null; } ||
    die "${install[*]} failed"
}
install_missing
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# A loopback port nothing listens on (connect refused). Should another process take it first,
# the backend's or nginx's bind fails and the script stops with its message.
free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  die "no free loopback port found"
}

# Waits up to $2 seconds for something to listen on 127.0.0.1:$1.
wait_listening() {
  local deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

TMP=$(mktemp -d /tmp/gateway_vs_nginx.XXXXXX)
chmod 755 "$TMP"  # nginx workers run as nobody when started as root
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

P1=$(free_port)
P2=$(free_port)
while [[ $P2 == "$P1" ]]; do P2=$(free_port); done

# The backend. --serve-seconds bounds it even if this script is killed -9.
timeout 200 "$BENCH" --serve-baseline "$P1" --serve-seconds 180 --tokens "$TOKENS" \
  --io-threads "$IO_THREADS" >"$TMP/backend.log" 2>&1 &
PIDS+=($!)
wait_listening "$P1" 20 || { cat "$TMP/backend.log" >&2; die "the backend did not listen on $P1"; }
grep '^glm-gateway-bench: baseline on' "$TMP/backend.log"

cat >"$TMP/nginx.conf" <<EOF
worker_processes $NGINX_WORKERS;
pid $TMP/nginx.pid;
error_log $TMP/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP/client_body;
  proxy_temp_path $TMP/proxy;
  fastcgi_temp_path $TMP/fastcgi;
  uwsgi_temp_path $TMP/uwsgi;
  scgi_temp_path $TMP/scgi;
  keepalive_requests 1000000;
  upstream backend {
    server 127.0.0.1:$P1;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$P2;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
timeout 200 "$NGINX" -e "$TMP/error.log" -p "$TMP" -c "$TMP/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
wait_listening "$P2" 10 || { cat "$TMP/error.log" >&2 || true; die "nginx did not listen on $P2"; }
echo "nginx: $("$NGINX" -v 2>&1 | sed 's/^nginx version: //'), $NGINX_WORKERS worker(s)," \
  "127.0.0.1:$P2 -> 127.0.0.1:$P1"

LOAD=(--requests "$REQUESTS" --streams "$STREAMS" --tokens "$TOKENS" --concurrency "$CONCURRENCY"
      --repeats "$REPEATS")
# Runs one bench step under a timeout; its output is shown and its last line (the JSON) kept.
step() {
  local name=$1
  shift
  echo
  echo "== $name: glm-gateway-bench $*"
  local rc=0
  timeout 120 "$BENCH" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || rc=$?
  grep -v '^{' "$TMP/$name.out" || true
  tail -n 1 "$TMP/$name.out" | jq -e . >"$TMP/$name.json" 2>/dev/null ||
    { cat "$TMP/$name.err" >&2; die "$name: no figures (exit $rc)"; }
  ((rc == 0)) || echo "WARNING: $name exited $rc (errors above); its figures are shown all the same"
}
step direct --target "127.0.0.1:$P1" "${LOAD[@]}"
step nginx --target "127.0.0.1:$P2" "${LOAD[@]}"
# Phase 3 (open streams) is not part of this comparison: a small --open keeps it short.
step gateway "${LOAD[@]}" --io-threads "$IO_THREADS" --open 200

# Summary: latency in ms; "+" columns in us, against the row named in parentheses.
fields() {  # file phase key jq-fields: their values, tab-separated
  jq -r --arg k "$3" ".$2[\$k] | [$4] | @tsv" "$TMP/$1.json"
}
row_req() {  # name file key [base_file base_key]
  local base=""
  [[ -z ${4:-} ]] || base=$(fields "$4" per_request "$5" '.p50_ms, .p99_ms')
  printf '%s\t%s\t%s\n' "$1" "$(fields "$2" per_request "$3" '.rps, .p50_ms, .p99_ms')" "$base" |
    awk -F'\t' '{ printf "  %-34s %9.0f %8.3f %8.3f", $1, $2, $3, $4
                  if ($5 == "") printf " %9s %9s\n", "-", "-"
                  else printf " %+9.0f %+9.0f\n", ($3 - $5) * 1e3, ($4 - $6) * 1e3 }'
}
row_tok() {  # name file key [base_file base_key]
  local base=""
  [[ -z ${4:-} ]] || base=$(fields "$4" per_token "$5" '.p50_ms, .first_event_p50_ms')
  printf '%s\t%s\t%s\n' "$1" "$(fields "$2" per_token "$3" \
    '.tokens_per_s, .p50_ms, .p99_ms, .first_event_p50_ms, .gap_p50_ms, .gap_p99_ms')" "$base" |
    awk -F'\t' -v k="$TOKENS" '{
      printf "  %-34s %9.0f %8.2f %8.2f %8.3f %6.3f/%-6.3f", $1, $2, $3, $4, $5, $6, $7
      if ($8 == "") printf " %9s %9s\n", "-", "-"
      else printf " %+9.0f %+9.2f\n", ($5 - $9) * 1e3, ($3 - $8) * 1e3 / k }'
}
errors() { jq -r '[.per_request[], .per_token[]] | map(.errors? // empty) | add' "$TMP/$1.json"; }
echo
echo "== summary: $(jq -r '"\(.machine.nproc) CPUs (\(.machine.cpu))"' "$TMP/direct.json");" \
  "$REQUESTS requests, $STREAMS streams x $TOKENS tokens, $CONCURRENCY connections;" \
  "median of $REPEATS runs, p50/p99 over all"
echo "per request (POST /v1/completions)      req/s   p50 ms   p99 ms   +p50 us   +p99 us"
row_req "backend direct (separate process)" direct target
row_req "nginx -> backend (vs direct)" nginx target direct target
row_req "baseline (in-process)" gateway baseline
row_req "gateway (vs in-process baseline)" gateway gateway gateway baseline
echo "per streamed token (chat, SSE)      tokens/s strm p50 strm p99  1st ev " \
  "gap p50/p99  +1st us  +us/tok"

row_tok "backend direct (separate process)" direct target
row_tok "nginx -> backend (vs direct)" nginx target direct target
row_tok "baseline (in-process)" gateway baseline
row_tok "gateway (vs in-process baseline)" gateway gateway gateway baseline
echo "(1st ev: request -> first SSE event at the client, p50; gap: between events as read;" \
  "+us/tok: added stream p50 / $TOKENS tokens. Errors: direct $(errors direct)," \
  "nginx $(errors nginx), gateway+baseline $(errors gateway))"
