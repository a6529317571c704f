# procs.sh -- sourced by the bench shell scripts that start kvrouter processes (ab/real_ab.sh,
# admission/admission_bench.sh): the PID list they stop, by PID only, a free loopback port, and
# the workers and router they start alike. Shared (bench/scripts/lib/): no experiment of its own;
# writes only the logs it is told to.
#
#   PIDS="$PIDS $!"   after starting each process in the background
#   stop              SIGTERM to each, up to 5 s to exit, then SIGKILL; PIDS emptied
#   port              prints a free TCP port on 127.0.0.1
#   start_sims N S LOGS
#                     N `$KVR sim` workers on free ports, worker w with --time-scale S --seed w
#                     --enable-prompt-tokens-details, its output in LOGS/worker-w.log; sets
#                     WORKERS to their `--worker URL` flags
#   start_router WHO POLICY LOG [FLAGS...]
#                     `$KVR serve $WORKERS` on free ports RP (--listen) and AP (--admin-listen)
#                     with --policy POLICY --access-log false --scrape-interval-ms 100 FLAGS, its
#                     output in LOG; then up to 10 s for its /health, else "WHO: the router did
#                     not become healthy" on stderr and exit 1
# KVR is the caller's kvrouter binary. The caller sets `trap stop EXIT INT TERM` so nothing
# outlives the script.
PIDS=""
stop() {
  for p in $PIDS; do kill -TERM "$p" 2>/dev/null || true; done
  for p in $PIDS; do
    i=0
    while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL "$p" 2>/dev/null || true
  done
  PIDS=""
}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start_sims() {
  WORKERS=""
  w=0
  while [ $w -lt "$1" ]; do
    p=$(port)
    "$KVR" sim --listen "127.0.0.1:$p" --time-scale "$2" --seed "$w" --enable-prompt-tokens-details \
      >"$3/worker-$w.log" 2>&1 &
    PIDS="$PIDS $!"
    WORKERS="$WORKERS --worker http://127.0.0.1:$p"
    w=$((w + 1))
  done
}
start_router() {
  who=$1 policy=$2 log=$3
  shift 3
  RP=$(port)
  AP=$(port)
  # shellcheck disable=SC2086
  "$KVR" serve $WORKERS --listen "127.0.0.1:$RP" --admin-listen "127.0.0.1:$AP" \
    --policy "$policy" --access-log false --scrape-interval-ms 100 "$@" >"$log" 2>&1 &
  PIDS="$PIDS $!"
  i=0
  until curl -sf "http://127.0.0.1:$RP/health" >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "$who: the router did not become healthy" >&2; exit 1; }
    sleep 0.1
  done
}
