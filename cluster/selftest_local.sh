#!/usr/bin/env bash
# By-hand end-to-end check of cluster/local.yaml with the real cluster
# launcher, against this machine's own SSH server on 127.0.0.1 and nothing
# else. Not part of CI: it needs root and a minute or two.
#
#   sudo bash cluster/selftest_local.sh [--keep]
#
# 1. Installs Debian's openssh-server and rsync if missing (with a
#    policy-rc.d that stops the package from starting the system sshd).
# 2. Makes a client key and a host key in a temporary directory and starts a
#    private sshd on 127.0.0.1:<spare port> that accepts only that key. The
#    sshd runs in its own PID namespace (unshare --pid --mount-proc), and its
#    sessions get a temporary HOME (sshd_config SetEnv), so everything
#    `ray up` does lands in the temporary directory, and the `ray stop` that
#    local.yaml's start commands and `ray down` run can only see processes in
#    that namespace: other Ray instances on this machine are safe.
# 3. Writes a copy of local.yaml pointing at it (head_ip 127.0.0.1, no
#    workers, spare ports, the repository's .venv instead of the install
#    step, a temporary Ray auth token and NFS stand-in), runs `ray up -y`,
#    probes the cluster (token auth enforced, dashboard on 127.0.0.1 only,
#    MLflow healthy and not on a wildcard address, a task runs), runs
#    `ray submit ... sweeps/run.py -- demo --dry-run` if sweeps/run.py
#    exists, stops MLflow, runs `ray down -y`.
# 4. Cleans up by pid: kills the namespace's sshd (which takes every process
#    in the namespace with it) and removes the temporary directory (kept
#    with --keep).
set -euo pipefail

keep=0
[[ "${1:-}" == --keep ]] && keep=1
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VITSWEEP_VENV:-$repo/.venv}"
py="$venv/bin/python"
ray_cli="$venv/bin/ray"
user="$(id -un)"

say() { printf '\n== %s\n' "$*"; }
die() { printf 'selftest_local.sh: %s\n' "$*" >&2; exit 1; }

[[ "$(id -u)" -eq 0 ]] || die "run it as root: sudo bash cluster/selftest_local.sh"
[[ -x "$ray_cli" ]] || die "no ray at $ray_cli (run 'make install', or set VITSWEEP_VENV)"
command -v unshare >/dev/null || die "unshare (util-linux) is needed"

# --- 1. packages ----------------------------------------------------------------------
missing=()
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
command -v rsync >/dev/null || missing+=(rsync)
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    # Exit code 101 = "action forbidden": the package must not start the
    # system sshd (port 22, every interface) as a side effect.
    printf '#!/bin/sh\nexit 101\n' | tee /usr/sbin/policy-rc.d >/dev/null
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  apt-get update -qq
  env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  ((made_policy)) && rm -f /usr/sbin/policy-rc.d
  if [[ " ${missing[*]} " == *" openssh-server "* ]] && command -v systemctl >/dev/null; then
    echo "note: the ssh system service is now installed (not started); 'sudo systemctl disable ssh' keeps it off at boot"
  fi
fi

# --- 2. private sshd in its own PID namespace ---------------------------------------------
tmp="$(mktemp -d /tmp/vst.XXXXXX)"   # short: Ray's socket paths live below it
sshd_pid=""
control_dir=""
cleanup() {
  local rc=$?
  if [[ -n "$sshd_pid" ]]; then
    # SIGKILL the namespace's init (sshd, unshare's child): the kernel then
    # kills every process in the namespace (Ray, MLflow), and unshare reaps
    # sshd and exits. (unshare itself ignores SIGTERM while it waits; killing
    # it instead would leave sshd a zombie of PID 1.)
    local init
    init="$(ps -o pid= --ppid "$sshd_pid" 2>/dev/null | head -n1 | tr -d ' ')"
    kill -KILL "${init:-$sshd_pid}" 2>/dev/null || true
    wait "$sshd_pid" 2>/dev/null || true
  fi
  if [[ -n "$control_dir" ]]; then
    # The SSH ControlMaster socket dir Ray made for this cluster name
    # (ray/autoscaler/_private/command_runner.py); its parent is shared.
    rm -rf "$control_dir"
    rmdir "$(dirname "$control_dir")" 2>/dev/null || true
  fi
  if ((keep)); then
    echo "kept $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT

spare_ports() {
  "$py" - "$1" <<'EOF'
import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))
EOF
}
read -r ssh_port gcs_port dashboard_port client_port agent_port mlflow_port <<<"$(spare_ports 6)"

say "starting sshd on 127.0.0.1:$ssh_port (temporary dir $tmp)"
mkdir -p "$tmp/home" "$tmp/nfs" "$tmp/launcher"
ssh-keygen -q -t ed25519 -N '' -C vitsweep-selftest -f "$tmp/id_ed25519"
ssh-keygen -q -t ed25519 -N '' -C vitsweep-selftest-host -f "$tmp/host_ed25519"
cp "$tmp/id_ed25519.pub" "$tmp/authorized_keys"
# Interactive login shells read ~/.profile; Ray also sources ~/.bashrc itself.
echo '[ -f ~/.bashrc ] && . ~/.bashrc' > "$tmp/home/.profile"
touch "$tmp/home/.bashrc"
cat > "$tmp/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $ssh_port
HostKey $tmp/host_ed25519
PidFile $tmp/sshd.pid
AuthorizedKeysFile $tmp/authorized_keys
AllowUsers $user
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
# The key files live under /tmp, which StrictModes rejects (world-writable).
StrictModes no
# Every session's HOME: ray up's files, the token and the venv PATH stay here.
SetEnv HOME=$tmp/home
EOF
mkdir -p /run/sshd
unshare --pid --fork --mount-proc --kill-child \
  /usr/sbin/sshd -D -e -f "$tmp/sshd_config" >"$tmp/sshd.log" 2>&1 &
sshd_pid=$!
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$ssh_port") 2>/dev/null && break
  sleep 0.2
done
ssh_check=(ssh -q -i "$tmp/id_ed25519" -p "$ssh_port" -o StrictHostKeyChecking=no
  -o UserKnownHostsFile=/dev/null -o BatchMode=yes "$user@127.0.0.1")
[[ "$("${ssh_check[@]}" 'echo $HOME')" == "$tmp/home" ]] \
  || die "sshd did not start with HOME=$tmp/home; see $tmp/sshd.log"

# --- 3. ray up / probe / submit / down ------------------------------------------------------
"$py" -c "import secrets; print(secrets.token_hex(32))" > "$tmp/auth_token"
chmod 600 "$tmp/auth_token"

"$py" - "$repo/cluster/local.yaml" "$tmp/cluster.yaml" <<EOF
import sys, yaml

config = yaml.safe_load(open(sys.argv[1]))

def replace(commands, old, new, count=1):
    """Swap a setting in local.yaml's commands; fail loudly if local.yaml changed."""
    hits = [i for i, c in enumerate(commands) if old in c]
    assert len(hits) == count, f"expected {old!r} in {count} command(s), found {len(hits)}"
    for i in hits:
        commands[i] = commands[i].replace(old, new)

config["cluster_name"] = "vitsweep-selftest-$ssh_port"
config["provider"].update(head_ip="127.0.0.1", worker_ips=[])
config["auth"] = {
    "ssh_user": "$user",
    "ssh_private_key": "$tmp/id_ed25519",
    # Ray's auth has no port setting: reach the spare port through bash.
    "ssh_proxy_command": "bash -c 'exec 3<>/dev/tcp/127.0.0.1/$ssh_port; cat <&3 & cat >&3'",
}
config["file_mounts"] = {"~/vitsweep": "$repo", "~/.ray/auth_token": "$tmp/auth_token"}
# This machine may be offline and the repository's venv already has the
# project: use it instead of local.yaml's install step.
config["setup_commands"] = [
    "chmod 600 ~/.ray/auth_token",
    "echo 'export PATH=\"$venv/bin:\$PATH\"' >> ~/.vitsweep/env.sh",
]
replace(config["initialization_commands"], "/tmp/vitsweep-\$USER", "$tmp/rt", count=2)
head = config["head_start_ray_commands"]
replace(head, "--port=6379", "--port=$gcs_port --num-cpus=1 --dashboard-agent-listen-port=$agent_port")
replace(head, "--dashboard-port=8265", "--dashboard-port=$dashboard_port")
replace(head, "--ray-client-server-port=10001", "--ray-client-server-port=$client_port")
replace(head, "/mnt/nfs/vitsweep", "$tmp/nfs")
replace(head, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "VITSWEEP_MLFLOW_PORT=$mlflow_port MLFLOW_SERVER_ENABLE_JOB_EXECUTION")
yaml.safe_dump(config, open(sys.argv[2], "w"), sort_keys=False)
EOF

cat > "$tmp/probe.py" <<'EOF'
"""Runs on the head via `ray submit`: is the cluster up, private and authenticated?"""
import os, sys, urllib.error, urllib.request
from urllib.parse import urlparse

import ray  # before psutil: Ray ships its own copy
import psutil
from ray._private.authentication.authentication_utils import is_token_auth_enabled

dashboard_port, mlflow_port = int(sys.argv[1]), int(sys.argv[2])
failures = []

def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)

def status(url, headers=None):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code

def listen_addresses(port):
    return sorted({c.laddr.ip for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port == port})

ray.init(address="auto")
print("cluster resources:", ray.cluster_resources())
check(is_token_auth_enabled(), "driver runs with token authentication on")
check(ray.get(ray.remote(lambda: 41 + 1).remote()) == 42, "a task runs")
ray.shutdown()

token = open(os.path.expanduser("~/.ray/auth_token")).read().strip()
jobs = f"http://127.0.0.1:{dashboard_port}/api/jobs/"
check(status(jobs) == 401, "dashboard jobs API without token -> 401")
check(status(jobs, {"Authorization": "Bearer wrong"}) == 403, "dashboard jobs API with a wrong token -> 403")
check(status(jobs, {"Authorization": f"Bearer {token}"}) == 200, "dashboard jobs API with the token -> 200")
check(listen_addresses(dashboard_port) == ["127.0.0.1"], f"dashboard listens on {listen_addresses(dashboard_port)}")

uri = os.environ.get("VITSWEEP_MLFLOW_URI", "")
print("VITSWEEP_MLFLOW_URI =", uri)
check(urlparse(uri).port == mlflow_port, "MLflow URI exported to the head's shells")
check(status(f"{uri}/health") == 200, "MLflow /health -> 200")
addresses = listen_addresses(mlflow_port)
check(addresses == [urlparse(uri).hostname] and not {"0.0.0.0", "::"} & set(addresses),
      f"MLflow listens on {addresses} only")
procs = [p for p in psutil.process_iter(["cmdline", "memory_info"])
         if any("mlflow" in part for part in (p.info["cmdline"] or []))]
rss = sum(p.info["memory_info"].rss for p in procs) / 2**20
print(f"MLflow: {len(procs)} processes, {rss:.0f} MiB RSS")
sys.exit(1 if failures else 0)
EOF

# The launcher's cluster state file (RAY_TMPDIR) and the bootstrap config it
# uploads (TMPDIR) go to the temporary directory too.
export RAY_TMPDIR="$tmp/launcher" TMPDIR="$tmp/launcher"
control_dir="$("$py" - "vitsweep-selftest-$ssh_port" <<'EOF'
import getpass, hashlib, sys
h = lambda s: hashlib.sha256(s.encode()).hexdigest()[:10]
print(f"/tmp/ray_ssh_{h(getpass.getuser())}/{h(sys.argv[1])}")
EOF
)"
yaml_copy="$tmp/cluster.yaml"

say "ray up"
timeout 900 "$ray_cli" up -y --no-config-cache "$yaml_copy"

say "probe"
timeout 300 "$ray_cli" submit --no-config-cache "$yaml_copy" "$tmp/probe.py" -- "$dashboard_port" "$mlflow_port"

if [[ -f "$repo/sweeps/run.py" ]]; then
  say "ray submit sweeps/run.py -- demo --dry-run"
  timeout 600 "$ray_cli" submit --no-config-cache "$yaml_copy" "$repo/sweeps/run.py" -- demo --dry-run
else
  say "skipped: $repo/sweeps/run.py does not exist yet"
fi

say "stop MLflow, ray down"
timeout 120 "$ray_cli" exec --no-config-cache "$yaml_copy" 'bash ~/vitsweep/cluster/start_mlflow.sh --stop'
timeout 300 "$ray_cli" down -y "$yaml_copy"

say "selftest passed"
