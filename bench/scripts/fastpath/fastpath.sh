#!/usr/bin/env bash
# fastpath.sh -- the fast-path table of issue 20: kvrouter against nginx and HAProxy, in one run.
#
# Experiment fastpath (bench/results/fastpath/): what does kvrouter cost per request, next to nginx
# and HAProxy on the same core? Writes OUT (default bench/results/fastpath, with --cores N
# bench/results/fastpath/Ncores): OUT/raw/ (below) and OUT/REPORT.md, whose first line is this
# command and the commit.
#
# What it runs, side by side in one run, all on loopback:
#   backend    one nginx (1 worker) serving fixed JSON on two ports: GET /v1/models and POST
#              /v1/chat/completions (`return 200 '...'`: nginx reads and discards the body, up to
#              2 MiB), plus /health and /metrics; pinned to --backend-cpu (default core 0, with wrk,
#              so the proxy under test owns core 1).
#   direct     wrk straight to the backend's first port.
#   nginx      nginx as reverse proxy: 1 worker, upstream keepalive 64 to both ports, request bodies
#              buffered in memory (client_body_buffer_size 512k: no temp files).
#   haproxy    HAProxy: nbthread 1, http-reuse always, roundrobin over both ports.
#   kvrouter   `kvrouter serve --policy round_robin --access-log false --scrape-interval-ms 0` with
#              the two ports as workers.
#   nginx_log, kvrouter_log   the same two with their access log on, one line per request to a
#              file in the run's temporary folder: nginx's default (combined format, a write(2) per
#              request: no `buffer=`), kvrouter `--access-log true` with its stderr to a file (its
#              lines leave once per loop iteration). After the cells each file must hold at least one
#              line per response wrk counted. HAProxy logs only to syslog and is not in these cells.
#   The proxies are pinned to core 1 and wrk (`wrk -t1`) to core 0. Rows: GET /v1/models (64
#   connections), POST small chat body (64), POST 64 KiB prompt (16), POST 400 KiB prompt (16); each
#   cell runs --duration seconds after a 1 s warm-up of every target. Before the cells each target
#   must answer 200 with the backend's body to a GET, a small POST and a 400 KiB POST, and every wrk
#   cell must end with zero socket errors and zero responses >= 400, or the run stops with the raw
#   output named.
#   streaming  a `kvrouter sim` in fixed-latency mode (no engine: TTFT 0, a fixed inter-token
#              latency) behind a second kvrouter: bench/scripts/fastpath/fastpath_sse.py runs N
#              streams of M events and reads the router's CPU time from /proc -> SSE events per
#              router CPU-second, paced (ITL 1 ms: the sim writes every event on its own, as vLLM
#              does) and unpaced (ITL 0: as fast as the sim writes, reads coalesce).
#   routing    `kvrouter bench routing` (64 KiB prompt, 4 workers, 1M blocks, kv_aware): decision
#              p99 warm/cold, index insert p50, bytes per index entry.
#   overhead   bench/scripts/fastpath/proxy_overhead.py: time the router adds to the first token
#              (p50), one streaming client at a time, and the same through nginx (proxy_buffering
#              off) for reference.
#   --perf     two extra kvrouter cells (small POST, 64 KiB POST), not in the table: `perf record
#              --call-graph dwarf` on the router's PID (frame pointers do not unwind through
#              Debian's libcurl and libuv) -> raw/perf_<cell>.txt (`perf report --no-children
#              --stdio | head -80`), raw/perf_flat_<cell>.txt (self time per function),
#              raw/perf_inclusive_<cell>.txt (time including callees), raw/perf_dso_<cell>.txt,
#              and libc allocation calls per request counted with uprobes (`perf probe` on malloc,
#              calloc, realloc, free; `perf stat -p`) -> raw/allocs_<cell>.txt. The probes are
#              removed at exit. Who allocates: every malloc/calloc/realloc with its call chain
#              during 1 s of small POSTs, attributed by bench/scripts/fastpath/fastpath_allocs.py ->
#              raw/alloc_sites_small.md. The paced streaming run once more under perf ->
#              raw/perf_*_sse.txt. And system calls per request of each proxy on the small POST
#              and the 64 KiB POST (syscall tracepoints, `perf stat -p`, 3 s each) ->
#              raw/syscalls_small.txt, raw/syscalls_p64.txt.
# Missing nginx, haproxy, wrk (and perf with --perf) are installed from Debian with apt-get; a
# service the package would start is prevented with policy-rc.d (created for the install and removed
# after, unless one was there) or else stopped through its PID file.
#
# Every process is started here, recorded by PID and stopped by PID at exit (trap), errors included.
#
# Output: OUT/REPORT.md (printed as well) rendered by bench/scripts/fastpath/fastpath_report.py from
# the raw files in OUT/raw/: wrk_<row>_<target>_r<round>.txt (wrk's output with --latency, ending
# with the Lua script's FASTPATH_RESULT line), cells.jsonl, sse.jsonl, bench_routing.md,
# proxy_overhead.{md,json}, access_log.jsonl (lines each access-logging target wrote, responses wrk
# counted), meta.json.
#
# usage: bench/scripts/fastpath/fastpath.sh [--duration S] [--quick] [--perf] [--kvrouter PATH]
#                                  [--out DIR] [--rounds N] [--base-port N] [--backend-cpu N]
#                                  [--note TEXT] [--cores N]
#   --duration S     seconds per wrk cell (default 10)
#   --quick          3 s cells, 100 x 500 SSE events, 1 s proxy_overhead cells
#   --rounds N       run every cell N times, rounds outermost (default 1); the table shows each
#                    cell's best round (most req/s): on a shared machine the least disturbed one
#   --perf           the profile cells above
#   --kvrouter PATH  the binary (default build/kvrouter)
#   --out DIR        results folder (default bench/results/fastpath)
#   --base-port N    ports N+1 .. N+9 on 127.0.0.1 are used (default 18600)
#   --backend-cpu N  core of the static backend (default 0)
#   --note TEXT      a line printed under the title (e.g. "preliminary, machine shared")
#   --cores N        N > 1: the wrk table only (no streaming, routing, overhead or --perf), every
#                    proxy with N workers -- nginx worker_processes N, HAProxy nbthread N, N kvrouter
#                    replicas sharing the port (`--reuse-port true`, each the others' --peer with
#                    --peer-sync-listen) -- and nothing pinned: wrk (-tN), the backend (N workers)
#                    and the proxy under test share cores 0..N-1. Ports N+10 .. N+9+N are the
#                    replicas' admin ports. Default results folder bench/results/fastpath/Ncores.
#                    (One core: ports N+20 .. N+22 are the access-log targets'.)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
DURATION=10
QUICK=0
PERF=0
KVROUTER=build/kvrouter
OUT=bench/results/fastpath
BASE=18600
BACKEND_CPU=0
NOTE=""
ROUNDS=1
CORES=1
OUT_SET=0
CMDLINE="bash bench/scripts/fastpath/fastpath.sh$(printf ' %q' "$@")"

die() {
  echo "fastpath.sh: $*" >&2
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
  --duration) DURATION=${2:?--duration needs seconds}; shift 2 ;;
  --quick) QUICK=1; DURATION=3; shift ;;
  --perf) PERF=1; shift ;;
  --kvrouter) KVROUTER=${2:?--kvrouter needs a path}; shift 2 ;;
  --out) OUT=${2:?--out needs a folder}; OUT_SET=1; shift 2 ;;
  --cores) CORES=${2:?--cores needs a number}; shift 2 ;;
  --base-port) BASE=${2:?--base-port needs a number}; shift 2 ;;
  --backend-cpu) BACKEND_CPU=${2:?--backend-cpu needs a core}; shift 2 ;;
  --note) NOTE=${2:?--note needs text}; shift 2 ;;
  --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown option '$1' (see --help)" ;;
  esac
done
case "$DURATION" in '' | *[!0-9]*) die "--duration: must be a whole number of seconds" ;; esac
[ "$DURATION" -ge 2 ] || die "--duration: must be >= 2"
case "$ROUNDS" in '' | *[!0-9]* | 0) die "--rounds: must be a whole number >= 1" ;; esac
case "$BASE" in '' | *[!0-9]*) die "--base-port: must be a number" ;; esac
[ "$BASE" -ge 1024 ] && [ "$BASE" -le 65500 ] || die "--base-port: must be in 1024..65500"
[ "$(nproc)" -ge 2 ] || die "needs at least 2 cores (wrk on core 0, the proxy on core 1)"
case "$CORES" in '' | *[!0-9]* | 0) die "--cores: must be a whole number >= 1" ;; esac
[ "$CORES" -le "$(nproc)" ] || die "--cores: $CORES is more than this machine's $(nproc)"
if [ "$CORES" -gt 1 ]; then
  [ "$PERF" = 0 ] || die "--perf profiles the one-core setup: leave out --cores"
  [ "$OUT_SET" = 1 ] || OUT=bench/results/fastpath/${CORES}cores
  ALL_CPUS=0-$((CORES - 1))
fi
cd "$ROOT"
[ -x "$KVROUTER" ] || die "$KVROUTER: not an executable (build first, or pass --kvrouter)"
KVROUTER=$(cd "$(dirname "$KVROUTER")" && pwd)/$(basename "$KVROUTER")
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw

if [ "$QUICK" = 1 ]; then SSE_EVENTS=500; PO_DURATION=1; else SSE_EVENTS=2000; PO_DURATION=3; fi
SSE_STREAMS=100

P_BE1=$((BASE + 1)) P_BE2=$((BASE + 2)) P_NGINX=$((BASE + 3)) P_HAPROXY=$((BASE + 4))
P_KVR=$((BASE + 5)) P_KVR_ADMIN=$((BASE + 6)) P_SIM=$((BASE + 7)) P_SKVR=$((BASE + 8))
P_SKVR_ADMIN=$((BASE + 9))
P_NGINXL=$((BASE + 20)) P_KVRL=$((BASE + 21)) P_KVRL_ADMIN=$((BASE + 22))

# ---- processes and cleanup: everything started is in PIDS and is stopped by PID ----

TMP=$(mktemp -d /tmp/fastpath.XXXXXX)
chmod 755 "$TMP" # nginx's workers run as nobody and read their prefix folders
PIDS=()
PROBES=()

stop_pid() { # TERM, up to 5 s, then KILL; the PID must be one this script started
  local pid=$1 _
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid p
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  for p in "${PROBES[@]}"; do perf probe -q -d "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

forget_pid() { # a process that ended: no longer ours to stop
  local pid=$1 keep=() p
  for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

drop_pid() { # stop one process and forget it
  stop_pid "$1"
  forget_pid "$1"
}

# ---- tools from Debian ----

install_tools() {
  local need=() made_policy=0
  command -v nginx >/dev/null || need+=(nginx)
  command -v haproxy >/dev/null || need+=(haproxy)
  command -v wrk >/dev/null || need+=(wrk)
  [ "$PERF" = 0 ] || command -v perf >/dev/null || need+=(linux-perf)
  [ ${#need[@]} -gt 0 ] || return 0
  echo "fastpath.sh: installing ${need[*]} from Debian" >&2
  if [ ! -e /usr/sbin/policy-rc.d ]; then # no service starts during the install
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >"$TMP/apt.log" 2>&1 || { cat "$TMP/apt.log" >&2; die "apt-get install ${need[*]} failed"; }
  [ "$made_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
  local pidfile # a service started anyway is stopped by its PID file, never by name
  for pidfile in /run/nginx.pid /run/haproxy.pid; do
    if [ -s "$pidfile" ]; then kill -TERM "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
}

# ---- configurations ----

MODELS_JSON='{"object":"list","data":[{"id":"fastpath","object":"model","created":0,"owned_by":"fastpath-static","root":"fastpath","max_model_len":131072}]}'
CHAT_JSON='{"id":"chatcmpl-fastpath-static","object":"chat.completion","created":0,"model":"fastpath","choices":[{"index":0,"message":{"role":"assistant","content":"Paris is the capital of France."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"total_tokens":24,"completion_tokens":8}}'

nginx_common() { # $1 prefix dir: the parts both nginx configurations share
  cat <<EOF
daemon off;
master_process on;
worker_processes $CORES;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; multi_accept on; }
http {
  access_log off;
  client_body_temp_path $1/body; proxy_temp_path $1/proxy; fastcgi_temp_path $1/fcgi;
  uwsgi_temp_path $1/uwsgi; scgi_temp_path $1/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  client_max_body_size 2m;
  client_body_buffer_size 512k;
EOF
}

write_backend_conf() {
  local d=$TMP/backend port
  mkdir -p "$d"
  {
    nginx_common "$d"
    for port in "$P_BE1" "$P_BE2"; do
      cat <<EOF
  server {
    listen 127.0.0.1:$port;
    default_type application/json;
    location = /v1/models { return 200 '$MODELS_JSON'; }
    location = /v1/chat/completions { return 200 '$CHAT_JSON'; }
    location = /health { return 200 ''; }
    location = /metrics { default_type text/plain; return 200 ''; }
    location / { return 404 '{"error":{"message":"not found","type":"NotFoundError","param":null,"code":404}}'; }
  }
EOF
    done
    echo "}"
  } >"$d/nginx.conf"
}

write_nginx_proxy_conf() { # $1 name (prefix folder), $2 port, $3 access log on (1) or off (0)
  local d=$TMP/$1
  mkdir -p "$d"
  {
    nginx_common "$d"
    cat <<EOF
  upstream backend {
    server 127.0.0.1:$P_BE1;
    server 127.0.0.1:$P_BE2;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$2 reuseport;
$([ "$3" = 0 ] || echo "    access_log $d/access.log;") # on: the default, combined (http's is off)
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
  } >"$d/nginx.conf"
}

write_haproxy_conf() {
  mkdir -p "$TMP/haproxy"
  cat >"$TMP/haproxy/haproxy.cfg" <<EOF
global
  nbthread $CORES
  maxconn 4096
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$P_HAPROXY
  default_backend be
backend be
  balance roundrobin
  server s1 127.0.0.1:$P_BE1
  server s2 127.0.0.1:$P_BE2
EOF
}

# ---- starting and checking ----

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # $1 port, $2 pid, $3 name, $4 log: up to 10 s
  local _
  for _ in $(seq 100); do
    if ! kill -0 "$2" 2>/dev/null; then
      cat "$4" >&2 || true
      die "$3 exited before listening on $1 (log above)"
    fi
    port_free "$1" || return 0
    sleep 0.1
  done
  die "$3 is not listening on 127.0.0.1:$1 after 10 s (log: $4)"
}

start() { # $1 name, $2 core, $3 port, rest: the command; sets LAST_PID
  local name=$1 core=$2 port=$3
  shift 3
  taskset -c "$core" "$@" >"$TMP/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
  wait_port "$port" "$LAST_PID" "$name" "$TMP/$name.log"
}

make_body() { # $1 bytes -> a chat body file of exactly that size (same shape as the Lua script's)
  python3 - "$1" "$TMP/body_$1.json" <<'EOF'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
head = '{"model":"fastpath","max_tokens":16,"messages":[{"role":"user","content":"'
tail = '"}]}'
words = "router cache prefix token block worker stream ".split(" ")[:-1]
s, i = "", 0
while len(s) < n - len(head) - len(tail):
    s += words[i % len(words)] + " "
    i += 1
s = s[: max(0, n - len(head) - len(tail))] or "What is the capital of France?"
open(path, "w").write(head + s + tail)
EOF
  echo "$TMP/body_$1.json"
}

check_200() { # $1 target, $2 port: GET, small POST and 400 KiB POST answer 200 with the backend body
  local t=$1 port=$2 code f
  code=$(curl -s -m 10 -o "$TMP/check.out" -w '%{http_code}' "http://127.0.0.1:$port/v1/models") || true
  [ "$code" = 200 ] && grep -q fastpath-static "$TMP/check.out" ||
    die "$t: GET /v1/models answered '$code': $(head -c 300 "$TMP/check.out" 2>/dev/null)"
  for f in "$(make_body 120)" "$(make_body 409600)"; do
    code=$(curl -s -m 10 -o "$TMP/check.out" -w '%{http_code}' -H 'Content-Type: application/json' \
      --data-binary "@$f" "http://127.0.0.1:$port/v1/chat/completions") || true
    [ "$code" = 200 ] && grep -q chatcmpl-fastpath-static "$TMP/check.out" ||
      die "$t: POST of $(stat -c %s "$f") bytes answered '$code': $(head -c 300 "$TMP/check.out")"
  done
}

proc_cpu() { # utime + stime in clock ticks of PIDs and their child processes (nginx's workers)
  local pid total=0 c
  for pid in "$@"; do
    for c in $pid $(cat "/proc/$pid/task/$pid/children" 2>/dev/null); do
      total=$((total + $(awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$c/stat" 2>/dev/null || echo 0)))
    done
  done
  echo "$total"
}

# ---- the wrk cells ----

ROWS=(get small p64 p400)
declare -A ROW_ARGS=([get]="get" [small]="post 0" [p64]="post 65536" [p400]="post 409600")
declare -A ROW_CONNS=([get]=64 [small]=64 [p64]=16 [p400]=16)
TARGETS=(direct nginx haproxy kvrouter)
[ "$CORES" -gt 1 ] || TARGETS+=(nginx_log kvrouter_log)
declare -A PORT PID_OF

run_wrk() { # $1 port, $2 connections, $3 seconds, $4 output file, rest: Lua arguments
  local port=$1 conns=$2 secs=$3 out=$4
  shift 4
  taskset -c "$WRK_CPUS" wrk -t"$CORES" -c"$conns" -d"${secs}s" --timeout 10s --latency \
    -s "$HERE/fastpath_wrk.lua" "http://127.0.0.1:$port" -- "$@" >"$out" 2>&1 ||
    die "wrk failed against port $port (output: $out)"
  grep -q '^FASTPATH_RESULT ' "$out" || die "wrk printed no FASTPATH_RESULT line (output: $out)"
}

result_of() { sed -n 's/^FASTPATH_RESULT //p' "$1"; }

check_errors() { # $1 wrk output: any socket error or response >= 400 fails the run
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
bad = {k: r[k] for k in ("connect", "read", "write", "status", "timeout") if r[k]}
if bad or r["requests"] == 0:
    sys.exit("fastpath.sh: %s: errors %s over %d requests" % (sys.argv[2], bad, r["requests"]))
' "$(result_of "$1")" "$1"
}

cell() { # $1 row, $2 target, $3 round: one measured cell, appended to cells.jsonl
  local row=$1 t=$2 round=$3 out="$RAW/wrk_$1_$2_r$3.txt" c0 c1 pid
  pid=${PID_OF[$t]}
  # shellcheck disable=SC2086 # a list of PIDs (kvrouter's replicas with --cores)
  c0=$(proc_cpu $pid)
  # shellcheck disable=SC2086
  run_wrk "${PORT[$t]}" "${ROW_CONNS[$row]}" "$DURATION" "$out" ${ROW_ARGS[$row]}
  # shellcheck disable=SC2086
  c1=$(proc_cpu $pid)
  check_errors "$out"
  printf '{"row":"%s","target":"%s","round":%d,"conns":%d,"cpu_ticks":%d,"tick_hz":%d,"wrk":%s}\n' \
    "$row" "$t" "$round" "${ROW_CONNS[$row]}" $((c1 - c0)) "$(getconf CLK_TCK)" \
    "$(result_of "$out")" >>"$RAW/cells.jsonl"
  printf '  r%d %-6s %-9s %s\n' "$round" "$row" "$t" "$(result_of "$out")" >&2
}

# ---- streaming cost, routing bench, proxy overhead ----

sse_cell() { # $1 inter-token latency in ms: sim + its own router, N streams of M events
  local itl=$1 sim skvr
  start sse_sim 0 "$P_SIM" "$KVROUTER" sim --listen "127.0.0.1:$P_SIM" --fixed-ttft-ms 0 \
    --fixed-itl-ms "$itl" --output-len-mean 0
  sim=$LAST_PID
  start sse_router 1 "$P_SKVR" "$KVROUTER" serve --worker "http://127.0.0.1:$P_SIM" \
    --listen "127.0.0.1:$P_SKVR" --admin-listen "127.0.0.1:$P_SKVR_ADMIN" --policy round_robin \
    --access-log false --scrape-interval-ms 0
  skvr=$LAST_PID
  taskset -c 0 python3 "$HERE/fastpath_sse.py" --port "$P_SKVR" --pid "$skvr" --streams 10 \
    --events 100 >/dev/null || die "SSE warm-up failed"
  taskset -c 0 python3 "$HERE/fastpath_sse.py" --port "$P_SKVR" --pid "$skvr" \
    --streams "$SSE_STREAMS" --events "$SSE_EVENTS" >"$TMP/sse.out" ||
    die "SSE streaming through the router failed (ITL $itl ms)"
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["itl_ms"]=float(sys.argv[2]); print(json.dumps(d))' \
    "$(sed -n 's/^FASTPATH_SSE //p' "$TMP/sse.out")" "$itl" >>"$RAW/sse.jsonl"
  echo "  sse itl=${itl}ms $(cat "$TMP/sse.out")" >&2
  if [ "$PERF" = 1 ] && [ "$itl" != 0 ]; then # an extra run under perf, not in the table
    perf_start "$skvr" "$TMP/perf_sse.data" --call-graph dwarf,16384 -F 999
    taskset -c 0 python3 "$HERE/fastpath_sse.py" --port "$P_SKVR" --pid "$skvr" \
      --streams "$SSE_STREAMS" --events "$SSE_EVENTS" >/dev/null || die "SSE run under perf failed"
    perf_stop
    perf_reports "$TMP/perf_sse.data" sse
  fi
  drop_pid "$skvr"
  drop_pid "$sim"
}

# ---- --perf: profile and allocation counts of kvrouter cells ----

add_probes() {
  local libc fn
  libc=$(ldd "$KVROUTER" | awk '/libc\.so/ {print $3}')
  [ -n "$libc" ] || die "--perf: libc of $KVROUTER not found with ldd"
  for fn in malloc calloc realloc free; do
    perf probe -q -d "probe_libc:$fn" 2>/dev/null || true
    perf probe -q -x "$libc" --add "$fn" || die "--perf: perf probe on $fn in $libc failed"
    PROBES+=("probe_libc:$fn")
  done
}

perf_start() { # $1 pid, $2 data file, rest: events/options; sets PERF_PID
  local pid=$1 data=$2
  shift 2
  perf record -q "$@" -p "$pid" -o "$data" >"$TMP/perf_rec.log" 2>&1 &
  PERF_PID=$!
  PIDS+=("$PERF_PID")
  sleep 0.3
}

perf_stop() {
  kill -INT "$PERF_PID" 2>/dev/null || true
  wait "$PERF_PID" 2>/dev/null || true
  forget_pid "$PERF_PID"
}

perf_reports() { # $1 data file, $2 name: the four reports of one profile into raw/
  local data=$1 name=$2
  # Whole reports to files first: `perf report | head` would end perf with SIGPIPE (pipefail).
  perf report -i "$data" --no-children --stdio >"$TMP/report.txt" 2>/dev/null ||
    die "perf report of $name failed"
  head -80 "$TMP/report.txt" >"$RAW/perf_$name.txt"
  perf report -i "$data" --no-children --stdio --sort dso -g none >"$TMP/report.txt" 2>/dev/null ||
    die "perf report --sort dso of $name failed"
  sed -e '/^#/d' -e '/^$/d' "$TMP/report.txt" | sed -n 1,20p >"$RAW/perf_dso_$name.txt"
  perf report -i "$data" --no-children --stdio -g none --percent-limit 0.5 \
    >"$TMP/report.txt" 2>/dev/null || die "perf report -g none of $name failed"
  sed -e '/^#/d' -e '/^$/d' "$TMP/report.txt" | sed -n 1,60p >"$RAW/perf_flat_$name.txt"
  perf report -i "$data" --children --stdio -g none --percent-limit 1.5 \
    >"$TMP/report.txt" 2>/dev/null || die "perf report --children of $name failed"
  sed -e '/^#/d' -e '/^$/d' "$TMP/report.txt" | sed -n 1,90p >"$RAW/perf_inclusive_$name.txt"
  rm -f "$data"
}

alloc_sites() { # who allocates: every malloc/calloc/realloc with its call chain, 1 s of small POST
  local kpid=${PID_OF[kvrouter]}
  perf_start "$kpid" "$TMP/allocs.data" --call-graph dwarf,4096 \
    -e probe_libc:malloc,probe_libc:calloc,probe_libc:realloc
  run_wrk "$P_KVR" 8 1 "$RAW/alloc_sites_wrk.txt" post 0
  perf_stop
  perf script -i "$TMP/allocs.data" -F event,ip,sym,dso 2>/dev/null >"$TMP/allocs.script" ||
    die "perf script of the allocation probes failed"
  rm -f "$TMP/allocs.data"
  python3 "$HERE/fastpath_allocs.py" \
    "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["requests"])' \
      "$(result_of "$RAW/alloc_sites_wrk.txt")")" 25 <"$TMP/allocs.script" \
    >"$RAW/alloc_sites_small.md" || die "fastpath_allocs.py failed"
  rm -f "$TMP/allocs.script"
  echo "  alloc sites: $(head -1 "$RAW/alloc_sites_small.md")" >&2
}

perf_cell() { # $1 row: perf record during one kvrouter cell, then allocations per request in another
  local row=$1 kpid=${PID_OF[kvrouter]} pstat
  perf_start "$kpid" "$TMP/perf_$row.data" --call-graph dwarf,16384 -F 999
  # shellcheck disable=SC2086
  run_wrk "$P_KVR" "${ROW_CONNS[$row]}" "$DURATION" "$RAW/perf_wrk_$row.txt" ${ROW_ARGS[$row]}
  perf_stop
  perf_reports "$TMP/perf_$row.data" "$row"
  perf stat -x, -e probe_libc:malloc,probe_libc:calloc,probe_libc:realloc,probe_libc:free \
    -p "$kpid" -o "$TMP/pstat_$row.txt" >/dev/null 2>&1 &
  pstat=$!
  PIDS+=("$pstat")
  sleep 0.3
  # shellcheck disable=SC2086
  run_wrk "$P_KVR" "${ROW_CONNS[$row]}" "$DURATION" "$RAW/allocs_wrk_$row.txt" ${ROW_ARGS[$row]}
  sleep 0.2
  kill -INT "$pstat" 2>/dev/null || true
  wait "$pstat" 2>/dev/null || true
  forget_pid "$pstat"
  python3 - "$TMP/pstat_$row.txt" "$(result_of "$RAW/allocs_wrk_$row.txt")" "$row" \
    >"$RAW/allocs_$row.txt" <<'EOF'
import json, sys
counts = {}
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if len(f) > 2 and f[2].startswith("probe_libc:"):
        counts[f[2].split(":")[1]] = int(f[0]) if f[0].isdigit() else None
req = json.loads(sys.argv[2])["requests"]
print("cell %s: %d requests (wrk under uprobes, so slower than the table's cell)" % (sys.argv[3], req))
for k, v in counts.items():
    print("%-8s %12s calls  %8s per request" % (k, v, "%.1f" % (v / req) if v and req else "n/a"))
EOF
  echo "  perf $row: $(head -1 "$RAW/allocs_$row.txt")" >&2
}

SYSCALLS=(raw_syscalls:sys_enter epoll_ctl epoll_wait epoll_pwait poll ppoll sendto sendmsg write writev
  recvfrom recvmsg read readv splice ioctl setsockopt getsockopt fcntl futex close accept4)

syscall_cell() { # $1 row: system calls per request of each proxy (tracepoints, perf stat -p)
  local row=$1 t ev=() s pids pstat
  for s in "${SYSCALLS[@]}"; do
    case "$s" in *:*) ev+=("$s") ;; *) ev+=("syscalls:sys_enter_$s") ;; esac
  done
  for t in nginx haproxy kvrouter; do
    pids=$(echo "${PID_OF[$t]} $(cat "/proc/${PID_OF[$t]}/task/${PID_OF[$t]}/children" 2>/dev/null)" |
      xargs | tr ' ' ,)
    perf stat -x, -e "$(IFS=,; echo "${ev[*]}")" -p "$pids" -o "$TMP/sys_$t.txt" >/dev/null 2>&1 &
    pstat=$!
    PIDS+=("$pstat")
    sleep 0.3
    # shellcheck disable=SC2086
    run_wrk "${PORT[$t]}" "${ROW_CONNS[$row]}" 3 "$TMP/sys_wrk_$t.txt" ${ROW_ARGS[$row]}
    sleep 0.2
    kill -INT "$pstat" 2>/dev/null || true
    wait "$pstat" 2>/dev/null || true
    forget_pid "$pstat"
    echo "$t $(result_of "$TMP/sys_wrk_$t.txt")" >>"$TMP/sys_requests.txt"
  done
  python3 - "$TMP" "$row" >"$RAW/syscalls_$row.txt" <<'PYEOF'
import json, os, sys
tmp, row = sys.argv[1], sys.argv[2]
reqs = {l.split(" ", 1)[0]: json.loads(l.split(" ", 1)[1])["requests"]
        for l in open(os.path.join(tmp, "sys_requests.txt"))}
table, names = {}, []
for t in ("nginx", "haproxy", "kvrouter"):
    for line in open(os.path.join(tmp, "sys_%s.txt" % t)):
        f = line.strip().split(",")
        if len(f) < 3 or ":" not in f[2]:
            continue
        name = "all" if f[2].startswith("raw_syscalls") else f[2].split("sys_enter_")[1]
        if name not in names:
            names.append(name)
        table.setdefault(t, {})[name] = int(f[0]) / reqs[t] if f[0].isdigit() else None
print("System calls per request, cell %s (3 s each; nginx = master + worker)" % row)
print("| syscall | nginx | HAProxy | kvrouter |")
print("|---|---:|---:|---:|")
for n in names:
    vals = [table.get(t, {}).get(n) for t in ("nginx", "haproxy", "kvrouter")]
    if all(not v for v in vals) and n != "all":
        continue
    print("| %s | %s |" % (n, " | ".join("%.2f" % v if v is not None else "n/a" for v in vals)))
PYEOF
  echo "  syscalls $row: $(grep '^| all' "$RAW/syscalls_$row.txt")" >&2
}

# ---- main ----

install_tools
for p in $(seq $((BASE + 1)) $((BASE + 9))); do
  port_free "$p" || die "127.0.0.1:$p is in use (pick other ports with --base-port)"
done
: >"$RAW/cells.jsonl"
: >"$RAW/sse.jsonl"
rm -f "$RAW/access_log.jsonl" "$RAW"/alloc_sites_* "$RAW"/syscalls_*.txt "$RAW"/perf_*.txt "$RAW"/allocs_*.txt "$RAW"/wrk_*.txt "$RAW"/perf_wrk_*.txt "$RAW"/allocs_wrk_*.txt

write_backend_conf
write_nginx_proxy_conf nginx "$P_NGINX" 0
write_haproxy_conf
if [ "$CORES" = 1 ]; then
  BE_CPUS=$BACKEND_CPU PROXY_CPUS=1 WRK_CPUS=0
else
  BE_CPUS=$ALL_CPUS PROXY_CPUS=$ALL_CPUS WRK_CPUS=$ALL_CPUS
fi
start backend "$BE_CPUS" "$P_BE2" nginx -p "$TMP/backend" -c "$TMP/backend/nginx.conf"
PID_OF[direct]=$LAST_PID
PORT[direct]=$P_BE1
start nginx "$PROXY_CPUS" "$P_NGINX" nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf"
PID_OF[nginx]=$LAST_PID
PORT[nginx]=$P_NGINX
start haproxy "$PROXY_CPUS" "$P_HAPROXY" haproxy -db -f "$TMP/haproxy/haproxy.cfg"
PID_OF[haproxy]=$LAST_PID
PORT[haproxy]=$P_HAPROXY
KVR_COMMON=(--worker "http://127.0.0.1:$P_BE1" --worker "http://127.0.0.1:$P_BE2"
  --policy round_robin --scrape-interval-ms 0)
KVR_FLAGS=("${KVR_COMMON[@]}" --listen "127.0.0.1:$P_KVR" --access-log false)
if [ "$CORES" = 1 ]; then
  start kvrouter "$PROXY_CPUS" "$P_KVR" "$KVROUTER" serve "${KVR_FLAGS[@]}" \
    --admin-listen "127.0.0.1:$P_KVR_ADMIN"
  PID_OF[kvrouter]=$LAST_PID
  for p in "$P_NGINXL" "$P_KVRL" "$P_KVRL_ADMIN"; do
    port_free "$p" || die "127.0.0.1:$p is in use (pick other ports with --base-port)"
  done
  write_nginx_proxy_conf nginx_log "$P_NGINXL" 1
  start nginx_log "$PROXY_CPUS" "$P_NGINXL" nginx -p "$TMP/nginx_log" -c "$TMP/nginx_log/nginx.conf"
  PID_OF[nginx_log]=$LAST_PID
  PORT[nginx_log]=$P_NGINXL
  # The same flags with the access log on; start() sends its stderr, the log, to a file.
  start kvrouter_log "$PROXY_CPUS" "$P_KVRL" "$KVROUTER" serve "${KVR_COMMON[@]}" \
    --listen "127.0.0.1:$P_KVRL" --admin-listen "127.0.0.1:$P_KVRL_ADMIN" --access-log true
  PID_OF[kvrouter_log]=$LAST_PID
  PORT[kvrouter_log]=$P_KVRL
else
  # N replicas on one port (SO_REUSEPORT), each the others' peer, synced over ZMQ.
  PID_OF[kvrouter]=""
  for i in $(seq 0 $((CORES - 1))); do
    peers=()
    for j in $(seq 0 $((CORES - 1))); do
      [ "$i" = "$j" ] || peers+=(--peer "http://127.0.0.1:$((BASE + 10 + j))")
    done
    port_free $((BASE + 10 + i)) || die "127.0.0.1:$((BASE + 10 + i)) is in use (--base-port)"
    start "kvrouter$i" "$PROXY_CPUS" $((BASE + 10 + i)) "$KVROUTER" serve "${KVR_FLAGS[@]}" \
      --admin-listen "127.0.0.1:$((BASE + 10 + i))" --reuse-port true \
      --peer-sync-listen "tcp://127.0.0.1:*" "${peers[@]}"
    PID_OF[kvrouter]="${PID_OF[kvrouter]} $LAST_PID"
  done
fi
PORT[kvrouter]=$P_KVR

echo "fastpath.sh: checking that every target answers 200" >&2
for t in "${TARGETS[@]}"; do check_200 "$t" "${PORT[$t]}"; done
echo "fastpath.sh: warm-up (1 s per target)" >&2
for t in "${TARGETS[@]}"; do
  run_wrk "${PORT[$t]}" 64 1 "$TMP/warm_$t.txt" post 0
  check_errors "$TMP/warm_$t.txt"
done
echo "fastpath.sh: cells of ${DURATION} s, $ROUNDS round(s)" >&2
for round in $(seq "$ROUNDS"); do
  for row in "${ROWS[@]}"; do
    for t in "${TARGETS[@]}"; do cell "$row" "$t" "$round"; done
  done
done

log_lines() { # $1 target, $2 its access log, $3 a line's marker: every response wrk counted logged
  python3 - "$1" "$2" "$3" "$RAW/cells.jsonl" "$TMP/warm_$1.txt" >>"$RAW/access_log.jsonl" <<'PYEOF' ||
import json, sys
t, log, marker, cells, warm = sys.argv[1:]
lines = sum(1 for l in open(log, errors="replace") if marker in l)
resp = 3  # check_200: a GET and two POSTs
for l in open(cells):
    c = json.loads(l)
    resp += c["wrk"]["requests"] if c["target"] == t else 0
for l in open(warm):
    if l.startswith("FASTPATH_RESULT "):
        resp += json.loads(l.split(" ", 1)[1])["requests"]
if lines < resp:
    sys.exit("fastpath.sh: %s: %d access-log lines for %d responses (%s)" % (t, lines, resp, log))
print(json.dumps({"target": t, "lines": lines, "responses": resp}))
PYEOF
    return 1
  echo "  access log $1: $(tail -n1 "$RAW/access_log.jsonl")" >&2
}

if [ "$CORES" = 1 ]; then
  sleep 0.5 # a loop iteration for kvrouter's last batch of lines
  : >"$RAW/access_log.jsonl"
  log_lines nginx_log "$TMP/nginx_log/access.log" 'HTTP/1.1"' || die "nginx's access log lost lines"
  log_lines kvrouter_log "$TMP/kvrouter_log.log" ' access: ' || die "kvrouter's access log lost lines"
fi

if [ "$CORES" -gt 1 ]; then
  : # the wrk table only
elif [ "$PERF" = 1 ]; then
  echo "fastpath.sh: perf cells" >&2
  syscall_cell small
  syscall_cell p64
  add_probes
  perf_cell small
  perf_cell p64
  alloc_sites
fi

rm -f "$RAW/bench_routing.md" "$RAW/proxy_overhead.json" "$RAW/proxy_overhead.md"
if [ "$CORES" = 1 ]; then
  echo "fastpath.sh: streaming ($SSE_STREAMS streams x $SSE_EVENTS events)" >&2
  sse_cell 1
  sse_cell 0

  echo "fastpath.sh: kvrouter bench routing" >&2
  taskset -c 1 "$KVROUTER" bench routing >"$RAW/bench_routing.md" 2>&1 || die "bench routing failed"
  echo "fastpath.sh: proxy_overhead.py (${PO_DURATION} s cells)" >&2
  # One stream at a time: the time added to a first token, not a queue of clients' (with 8
  # clients in lockstep on 2 cores the difference measured the sim's queue, down to -118 us).
  python3 "$HERE/proxy_overhead.py" --kvrouter "$KVROUTER" --duration "$PO_DURATION" \
    --stream-concurrency 1 --nginx "$(command -v nginx)" --json "$RAW/proxy_overhead.json" \
    >"$RAW/proxy_overhead.md" 2>&1 ||
    die "proxy_overhead.py failed"
fi

FP_CMD=$CMDLINE FP_NOTE=$NOTE python3 - "$RAW/meta.json" <<EOF
import json, os, platform, subprocess, sys
def out(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except Exception as e:
        return "n/a (%s)" % e
meta = {
    "command": os.environ["FP_CMD"],
    "date": subprocess.run(["date", "-u", "+%Y-%m-%d %H:%M UTC"], capture_output=True, text=True).stdout.strip(),
    "commit": out(["git", "rev-parse", "--short", "HEAD"]),
    "nproc": os.cpu_count(),
    "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "n/a"),
    "kernel": platform.release(),
    "loadavg_at_end": open("/proc/loadavg").read().split()[:3],
    "kvrouter": out(["$KVROUTER", "--version"]),
    "nginx": out(["nginx", "-v"]),
    "haproxy": out(["haproxy", "-v"]),
    "wrk": out(["wrk", "-v"]),
    "duration_s": $DURATION,
    "rounds": $ROUNDS,
    "backend_cpu": $BACKEND_CPU,
    "cores": $CORES,
    "sse": {"streams": $SSE_STREAMS, "events": $SSE_EVENTS},
    "note": os.environ["FP_NOTE"],
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
python3 "$HERE/fastpath_report.py" "$RAW" "$OUT/REPORT.md"
cat "$OUT/REPORT.md"
