"""cluster/slurm.sbatch, run by bash against stand-ins for what a laptop has no SLURM for (``srun``,
``scontrol``, ``getent``) and for the services it starts (``ray``, ``mlflow``, ``curl``, ``vitsweep``).

The stand-ins keep the rules that break the script on a real cluster: ``srun`` gives a step one CPU
unless it asks for more (``--cpus-per-task`` or ``SRUN_CPUS_PER_TASK``: since Slurm 22.05 steps do
not inherit the job's), ``hostname -I`` lists a docker bridge first, ``curl`` goes through the
site's ``http_proxy`` unless ``no_proxy`` names the host, and ``ray start --block`` blocks. A head
that never answers, one that dies, and nodes that never join must end the job within seconds, in
one line naming the log to read. About 12 s of wall time, mostly the script's 1 s polls and the bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# VITSWEEP_SLURM_SCRIPT: these tests against another version (`git show HEAD~3:cluster/slurm.sbatch > f`).
SCRIPT = Path(os.environ.get("VITSWEEP_SLURM_SCRIPT", REPO / "cluster" / "slurm.sbatch"))
NODES = ("gpu-01", "gpu-02", "gpu-03")
JOB = 4242
PROXY = "http://proxy.site.invalid:3128"

FAKES = {
    "scontrol": 'printf "%s\\n" gpu-01 gpu-02 gpu-03',
    # The name service: loopback first for the head (Debian's /etc/hosts), then its cluster address.
    "getent": '[ "$1" = ahostsv4 ] || exit 2; n=${2#gpu-0}\n'
              '[ "$n" = 1 ] && echo "127.0.1.1 STREAM $2"; echo "10.0.0.$n STREAM $2"; echo "10.0.0.$n DGRAM"',
    "hostname": 'case "$1" in -I) echo "172.17.0.1 10.0.0.${FAKE_NODE#gpu-0}";; '
                '-i|--ip-address) echo "10.0.0.${FAKE_NODE#gpu-0}";; *) echo "$FAKE_NODE";; esac',
    # `ray start` blocks (exec: the step's pid is the blocking process, as srun's would be); a head
    # or node that comes up writes itself into the state folder, which `ray status` reads.
    "ray": r'''
case "$1 $2" in
"start --head")
    case "$FAKE_HEAD" in fail) echo "head: cannot bind"; exit 1;; never) exec sleep 120;; esac
    for a in "$@"; do case "$a" in --node-ip-address=*) ip=${a#*=};; --port=*) port=${a#*=};; esac; done
    echo "$ip:$port" > "$STATE/gcs"; echo "$FAKE_NODE" >> "$STATE/nodes"; exec sleep 120;;
"start --block")
    [ "$FAKE_JOIN" = never ] || echo "$FAKE_NODE" >> "$STATE/nodes"; exec sleep 120;;
"status --address")
    [ -f "$STATE/gcs" ] && [ "$3" = "$(cat "$STATE/gcs")" ] || exit 1
    printf '======== Autoscaler status ========\nNode status\n----\nActive:\n'
    while read -r n; do echo " 1 node_${n}0123456789abcdef"; done < "$STATE/nodes"
    printf 'Pending:\n (no pending nodes)\nRecent failures:\n (no failures)\n';;
*) exit 2;;
esac''',
    # MLflow 3 answers the Host headers of localhost and private addresses, else only those it is told.
    "mlflow": 'for a in "$@"; do case "$p" in --host) h=$a;; --port) o=$a;; --allowed-hosts) ok=$a;; esac; p=$a; done\n'
              'echo "$h:$o" > "$STATE/mlflow"; echo "${ok:-}" > "$STATE/mlflow-hosts"; exec sleep 120',
    "curl": r'''
url=${!#}; hostport=${url#http://}; hostport=${hostport%%/*}; host=${hostport%:*}
if [ -n "${http_proxy:-}" ] && ! [[ ",${no_proxy:-}," == *",$host,"* ]]; then exit 5; fi  # the proxy knows no such host
[ -f "$STATE/mlflow" ] && [ "$hostport" = "$(cat "$STATE/mlflow")" ]''',
}
# srun: the CPUs a step holds are those it asks for, else 1; it runs the command on the node it names.
SRUN = r'''#!{python}
import json, os, sys
args, opts = sys.argv[1:], {{}}
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if "=" in flag:
        key, value = flag.split("=", 1)
    elif flag in ("-w", "-c", "-N", "-n"):
        key, value = flag, args.pop(0)
    else:
        sys.exit(f"fake srun: unknown option {{flag}}")
    opts[{{"-w": "--nodelist", "-c": "--cpus-per-task", "-N": "--nodes", "-n": "--ntasks"}}.get(key, key)] = value
cpus = int(opts.get("--cpus-per-task") or os.environ.get("SRUN_CPUS_PER_TASK") or 1)
node = opts.get("--nodelist") or "gpu-01"
with open(os.environ["STATE"] + "/steps.jsonl", "a") as log:
    log.write(json.dumps({{"node": node, "cpus": cpus, "argv": args}}) + "\n")
os.execvpe(args[0], args, {{**os.environ, "FAKE_NODE": node}})
'''


def run_job(tmp_path: Path, timeout: float = 30, **env: str) -> tuple[subprocess.CompletedProcess, float, Path]:
    """The batch script as SLURM would start it on the job's first node, with the stand-ins first on
    PATH; returns the finished process, its wall seconds and the state folder the stand-ins wrote."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / "srun").write_text(SRUN.format(python=sys.executable))
    (bin_dir / "vitsweep").write_text('#!/bin/bash\nprintf "%s\\n" "$no_proxy" "$*" > "$STATE/sweep"\n')
    for fake in bin_dir.iterdir():
        fake.chmod(0o755)
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("token")
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "USER": "tester",
                "STATE": str(state), "SLURM_JOB_NODELIST": "gpu-[01-03]", "SLURM_JOB_ID": str(JOB),
                "SLURMD_NODENAME": "gpu-01", "SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_PER_NODE": "1",
                "SHARED": str(tmp_path / "shared"), "VENV": str(tmp_path / "none"), "LOCAL": str(tmp_path / "local"),
                "http_proxy": PROXY, "https_proxy": PROXY, "FAKE_HEAD": "", "FAKE_JOIN": "", **env}
    started = time.monotonic()
    job = subprocess.Popen(["bash", str(SCRIPT)], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", ""
    finally:
        elapsed = time.monotonic() - started
        try:  # the steps left blocking, as SLURM ends them with the job
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()
    if elapsed >= timeout:
        pytest.fail(f"the job was still running after {timeout:.0f} s")
    return subprocess.CompletedProcess(job.args, job.returncode, out, err), elapsed, state


def steps(state: Path) -> list[dict]:
    return [json.loads(line) for line in (state / "steps.jsonl").read_text().splitlines()]


def option(argv: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    return value


def test_each_ray_node_holds_the_cpus_it_advertises_joins_the_head_by_its_cluster_address_and_the_sweep_plans(
        tmp_path, capsys):
    """Head first, on this node at its cluster address (not the docker bridge), every other node joins
    that address, each `ray start` step holds the CPUs it advertises, every port Ray and MLflow open
    lies in the job's block, curl and the sweep reach the head past the proxy, and the sweep the job
    launches parses and plans (`--dry-run`) on a GPU per trial at the head's explicit address."""
    from sweeps import run as launcher
    from sweeps.launch import options

    done, _, state = run_job(tmp_path)
    assert done.returncode == 0, done.stderr
    ray_steps = [s for s in steps(state) if s["argv"][:2] == ["ray", "start"]]
    head, *workers = ray_steps
    assert "--head" in head["argv"] and head["node"] == "gpu-01"
    assert (option(head["argv"], "--node-ip-address") == "10.0.0.1"
            and option(head["argv"], "--dashboard-host") == "127.0.0.1")
    port = int(option(head["argv"], "--port"))
    assert sorted(w["node"] for w in workers) == ["gpu-02", "gpu-03"]
    assert all(option(w["argv"], "--address") == f"10.0.0.1:{port}" for w in workers)
    assert all(s["cpus"] == int(option(s["argv"], "--num-cpus")) == 8 for s in ray_steps)
    opened = [int(a.split("=", 1)[1]) for s in ray_steps for a in s["argv"] if a.split("=")[0].endswith("-port")]
    assert opened and all(port <= p < port + 500 for p in opened)
    mlflow_at = (state / "mlflow").read_text().strip()
    assert mlflow_at.startswith("10.0.0.1:") and port <= int(mlflow_at.split(":")[1]) < port + 500
    assert {mlflow_at, "localhost:*"} <= set((state / "mlflow-hosts").read_text().strip().split(","))  # + a tunnel
    no_proxy, sweep = (state / "sweep").read_text().splitlines()
    assert "10.0.0.1" in no_proxy.split(",")
    argv = shlex.split(sweep)
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    assert (args.study, args.address, args.gpus_per_trial, args.stage) == ("study_l", f"10.0.0.1:{port}", 1.0, "all")
    assert args.mlflow_uri == f"http://{mlflow_at}" and args.results == str(tmp_path / "shared" / "results")
    args.dry_run = True
    assert launcher.run(args) == 0 and "60 trials" in capsys.readouterr().out


@pytest.mark.parametrize("fault, bounds, log", [
    ({"FAKE_HEAD": "never"}, {"HEAD_WAIT": "2"}, "ray-head.log"),  # a head that never answers
    ({"FAKE_HEAD": "fail"}, {}, "ray-head.log"),  # a head that dies: said at once, whatever the bound
    ({"FAKE_JOIN": "never"}, {"JOIN_WAIT": "2"}, "ray-gpu-02.log"),  # nodes that never join
], ids=["head-never-answers", "head-dies", "nodes-never-join"])
def test_a_cluster_that_does_not_come_up_ends_the_job_in_seconds_with_one_line_naming_the_log(
        tmp_path, fault, bounds, log):
    done, elapsed, state = run_job(tmp_path, timeout=20, **fault, **bounds)
    assert done.returncode != 0 and elapsed < 12
    (line,) = done.stderr.strip().splitlines()
    logs = tmp_path / "shared" / "logs" / f"job-{JOB}"
    assert str(logs / log) in line, line
    assert not (state / "sweep").exists()
