#!/usr/bin/env bash
# Start (or restart) the MLflow tracking server on the Ray head node.
#
# The cluster YAMLs run it as a head start command, after `ray start`:
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false bash ~/vitsweep/cluster/start_mlflow.sh \
#       --workers 1 --artifacts-destination s3://BUCKET/vitsweep/mlflow-artifacts
#
# Usage: start_mlflow.sh [--dry-run | --stop | --backup FILE] [MLFLOW_SERVER_OPTIONS...]
#   --dry-run      print the environment and command it would run, start nothing
#   --stop         stop the server this script started (by its pid file), start nothing
#   --backup FILE  write a consistent copy of the SQLite database to FILE
#                  (copy FILE to the bucket before `ray down`: the database lives
#                  on the head's disk and goes with it)
#   Other options go to `mlflow server` after this script's defaults, so they
#   override them (`--host` excepted: set VITSWEEP_MLFLOW_HOST instead).
#
# Defaults and why:
#   --backend-store-uri sqlite:///$STATE/mlflow.db   one file on the head's local disk
#   --host <this node's private IP>   trials on GPU workers log to it; never 0.0.0.0
#   --port 5000, --workers 1          one uvicorn worker is plenty for one sweep
#   --artifacts-destination $STATE/mlartifacts  (the YAMLs pass the bucket instead)
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false    no job runner processes
# Measured on a 2-core machine: with these, 2 processes and ~495 MB RSS; with
# MLflow's defaults, 15 processes and ~3.1 GB.
#
# Environment:
#   VITSWEEP_MLFLOW_HOST  address to bind (default: the source address of this
#                         node's default route, which is the address Ray uses)
#   VITSWEEP_MLFLOW_PORT  port (default 5000)
#   VITSWEEP_STATE_DIR    database, log, pid file, mlflow.env (default ~/.vitsweep)
#
# It writes $STATE/mlflow.env (`export VITSWEEP_MLFLOW_URI=http://HOST:PORT`),
# which ~/.vitsweep/env.sh sources, so on the head `--mlflow-uri
# "$VITSWEEP_MLFLOW_URI"` names the server every node can reach.
set -euo pipefail

mode=start
case "${1:-}" in
  --dry-run) mode=dry-run; shift ;;
  --stop) mode=stop; shift ;;
  --backup)
    mode=backup
    backup_file="${2:?--backup needs a destination file}"
    shift 2
    ;;
esac

state_dir="${VITSWEEP_STATE_DIR:-$HOME/.vitsweep}"
mkdir -p "$state_dir"
state_dir="$(cd "$state_dir" && pwd)"   # absolute: the sqlite URI needs it
db="$state_dir/mlflow.db"
pid_file="$state_dir/mlflow.pid"
log_file="$state_dir/mlflow.log"
env_file="$state_dir/mlflow.env"
python="${PYTHON:-python3}"

stop_server() {
  # Stop only the process group this script started, named by the pid file,
  # and only if that pid still belongs to an mlflow process.
  [[ -f "$pid_file" ]] || return 0
  local pid
  pid="$(cat "$pid_file")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
      && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q mlflow; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$pid_file"
}

if [[ "$mode" == stop ]]; then
  stop_server
  exit 0
fi

if [[ "$mode" == backup ]]; then
  [[ -f "$db" ]] || { echo "no MLflow database at $db" >&2; exit 1; }
  # sqlite3's online backup: consistent even while the server writes.
  "$python" - "$db" "$backup_file" <<'EOF'
import sqlite3, sys
source, target = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
with target:
    source.backup(target)
print(f"backed up {sys.argv[1]} to {sys.argv[2]}")
EOF
  exit 0
fi

for arg in "$@"; do
  case "$arg" in
    --host|--host=*|-h)
      echo "start_mlflow.sh: set VITSWEEP_MLFLOW_HOST instead of passing $arg" >&2
      exit 2
      ;;
  esac
done

host="${VITSWEEP_MLFLOW_HOST:-}"
if [[ -z "$host" ]]; then
  # The source address of the default route: the private IP in a VPC, the
  # address Ray itself picks for this node.
  host="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1 || true)"
fi
if [[ -z "$host" ]]; then
  host="$(hostname -I 2>/dev/null | awk '{print $1}' || true)"
fi
host="${host:-127.0.0.1}"
case "$host" in
  0.0.0.0|::|"[::]"|"*"|"")
    echo "start_mlflow.sh: refusing to bind MLflow to '$host' (every interface);" \
         "use 127.0.0.1 or this node's private IP" >&2
    exit 2
    ;;
esac
port="${VITSWEEP_MLFLOW_PORT:-5000}"

export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
cmd=(mlflow server
  --backend-store-uri "sqlite:///$db"
  --artifacts-destination "$state_dir/mlartifacts"
  --host "$host"
  --port "$port"
  --workers 1
  "$@")
uri="http://$host:$port"

if [[ "$mode" == dry-run ]]; then
  echo "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=$MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
  printf '%q ' "${cmd[@]}"
  echo
  echo "VITSWEEP_MLFLOW_URI=$uri"
  exit 0
fi

command -v mlflow >/dev/null || {
  echo "start_mlflow.sh: mlflow is not on PATH (install the project into the active environment)" >&2
  exit 1
}

stop_server
# setsid: the server and its uvicorn worker get their own process group,
# which stop_server can signal as a whole; nohup: it outlives this shell.
setsid nohup "${cmd[@]}" >>"$log_file" 2>&1 < /dev/null &
echo $! > "$pid_file"

for _ in $(seq 120); do
  if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
    echo "start_mlflow.sh: MLflow exited; last lines of $log_file:" >&2
    tail -n 30 "$log_file" >&2
    exit 1
  fi
  if "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      "$uri/health" 2>/dev/null; then
    echo "export VITSWEEP_MLFLOW_URI=$uri" > "$env_file"
    echo "MLflow at $uri (pid $(cat "$pid_file"), log $log_file, database $db)"
    exit 0
  fi
  sleep 1
done
echo "start_mlflow.sh: MLflow did not answer $uri/health within 120 s; see $log_file" >&2
exit 1
