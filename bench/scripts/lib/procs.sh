# procs.sh -- sourced by the bench shell scripts that start kvrouter processes (ab/real_ab.sh,
# admission/admission_bench.sh): the PID list they stop, by PID only, and a free loopback port.
# Shared (bench/scripts/lib/): no experiment of its own; writes nothing.
#
#   PIDS="$PIDS $!"   after starting each process in the background
#   stop              SIGTERM to each, up to 5 s to exit, then SIGKILL; PIDS emptied
#   port              prints a free TCP port on 127.0.0.1
# The caller sets `trap stop EXIT INT TERM` so nothing outlives the script.
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
