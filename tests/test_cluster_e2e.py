"""The demo study on a real three-node Ray cluster, submitted the way a cluster user does, and
one node lost mid-trial.

Everything is a real process on this machine, started with the same commands
cluster/README.md gives users:

    ray start --head ...          head node: GCS, dashboard + jobs API on 127.0.0.1
    ray start --address HEAD ...  two more nodes, each with its own CPU
    mlflow server ...             SQLite backend + artifact proxy in a temp folder
    ray job submit --working-dir <repo> -- python sweeps/run.py demo --address auto ...

A temp folder stands in for the NFS share (``--storage``) and another for the
results folder. Once a pack trains on a non-head node and its first checkpoint
is on the share, that node is lost: its raylet and every process it started are
SIGKILLed (``_lose_node``). Ray Train restarts the pack on a surviving node from
that checkpoint. The test waits for the job, then reads the results back the
way a user would: through the MLflow server's REST API and from Parquet.

Isolation on a machine other Ray instances share: every process gets its own
temp dirs and free ports, its own auth token (``RAY_AUTH_TOKEN_PATH``, never
``~/.ray/auth_token``), and teardown kills only what this test started (the
``ray start --block`` process groups, then any process still carrying this
test's marker in its environment). ``ray stop`` is never run: it would stop
every Ray instance of the user.

Run it alone with ``pytest tests/test_cluster_e2e.py -m ray``; set
``VITSWEEP_E2E_KEEP=1`` to keep the temp folder (Ray logs, MLflow database).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import server

from records import tracking
from trainables.loop import checkpoints

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv's bin: its `ray`, and `python` for the job
STUDY = "demo"
EPOCHS = 2  # a checkpoint at epoch 1, then the node is lost while a pack trains epoch 2
TRAIN_IMAGES = 1024  # an epoch long enough (seconds) for the test to see the checkpoint and lose the node
# Test images measured per checkpoint (the demo's own cap is 500): set by tests/evalcap/ in the job's
# launcher, as tests/conftest.py sets it for the local demo sweep; the analysis is linear in them.
EVAL_SIZE = 100
TRIALS = 4  # demo: PE {none, ape} x protocol {baseline, cutmix}
PACKS = 2  # trained two by two (--pack 2), as GPU clusters run: one Train worker per pack
JOB_DEADLINE_S = 330.0  # the job alone; measured 100-200 s on a busy 2-core machine
START_DEADLINE_S = 90.0  # each `ray start` until the node is alive
TIMEOUT_S = 540  # pytest-timeout backstop for the whole test, cluster start and teardown included
# Each node has 1 CPU and each pack's Train worker asks for a whole one: that fits only
# because Tune trial drivers ask for no CPU (trainables.trial.ray_start.DRIVER_RESOURCES).
CPUS_PER_TRIAL = "1"
MARKER = "VITSWEEP_E2E_CLUSTER"  # env var that tags every process this test starts
NODE_MARKER = "VITSWEEP_E2E_NODE"  # and the node (its raylet, its workers) a process belongs to
NON_HEAD = ("a", "b")
# The GCS declares a killed node dead after 3 missed 1 s health checks, not Ray's default 5 x 3 s.
FAST_HEALTH_CHECK = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                     "RAY_health_check_failure_threshold": "3"}
# Kept out of the uploaded working dir, as cluster/README.md tells users, on top of what
# Ray leaves out anyway: .gitignore'd paths and (Ray 2.60) .git, .venv, venv, __pycache__.
UPLOAD_EXCLUDES = ["/.venv", "/results", "/data", "/storage", "/bench/out", "*.egg-info",
                   "__pycache__", ".pytest_cache", "mlruns", "*.db"]

pytestmark = [pytest.mark.ray, pytest.mark.timeout(TIMEOUT_S)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({path}: {e.strerror})"


@dataclass
class Cluster:
    """A running head + worker node, an MLflow server and the folders the job writes to."""

    tmp: Path
    starters: dict[str, subprocess.Popen] = field(repr=False)  # node name -> its `ray start --block`
    # For `ray` CLI calls: venv first on PATH, token auth, this cluster's token. Out of the
    # repr, which pytest prints with every failure.
    env: dict[str, str] = field(repr=False)
    token: str = field(repr=False)
    dashboard: str  # http://127.0.0.1:PORT (Ray jobs API)
    mlflow_uri: str
    results: Path
    storage: Path  # stands in for the NFS share every node mounts
    head_node_id: str
    node_ids: dict[str, str]  # node name ("a", "b") -> Ray node id

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """A `ray` CLI command against this cluster, as a user types it."""
        return subprocess.run([str(BIN / "ray"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)

    def api(self, path: str) -> dict:
        """GET on the Ray dashboard with this cluster's token (what `ray job status` sends)."""
        return _get_json(f"{self.dashboard}{path}", self.token)


def _get_json(url: str, token: str | None = None, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _alive_nodes(dashboard: str, token: str) -> list[dict]:
    """The cluster's alive nodes from the state API, [] while the dashboard is not up yet."""
    try:
        reply = _get_json(f"{dashboard}/api/v0/nodes?limit=100&detail=1", token)
    except (OSError, ValueError):  # connection refused / reset, HTTP 5xx while starting
        return []
    return [n for n in reply["data"]["result"]["result"] if n["state"] == "ALIVE"]


def _start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`ray start --block ...` in its own session: teardown signals its whole process group."""
    with open(log, "wb") as out:
        return subprocess.Popen([str(BIN / "ray"), "start", "--block", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=ROOT)


def _wait_for_nodes(dashboard: str, token: str, count: int, starters: list[tuple[subprocess.Popen, Path]]) -> list:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        nodes = _alive_nodes(dashboard, token)
        if len(nodes) >= count:
            return nodes
        for process, log in starters:
            if process.poll() is not None:
                raise RuntimeError(f"`ray start` exited with code {process.returncode}; {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {log}:\n{_tail(log)}" for _, log in starters)
            raise RuntimeError(f"{len(nodes)} of {count} Ray nodes alive after {START_DEADLINE_S:g} s\n{logs}")
        time.sleep(1)


def _marked_pids(marker: str) -> list[int]:
    """Pids of processes whose environment carries ``MARKER=marker``: what this test started,
    directly or through Ray (workers, the job driver), and nothing else on the machine."""
    needle = f"{MARKER}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # gone, or another user's process
            continue
    return pids


def _kill_marked(marker: str) -> list[int]:
    """SIGKILL stragglers (workers Ray put in their own process groups, a job driver)."""
    pids = _marked_pids(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@pytest.fixture(scope="module")
def cluster():
    # Short path: Ray's Unix sockets live under the temp dir (108-byte limit).
    tmp = Path(tempfile.mkdtemp(prefix="vse-", dir="/tmp"))
    marker = tmp.name
    token = secrets.token_hex(32)
    token_file = tmp / "auth_token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}  # no RAY_ADDRESS etc.
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # the job's `python` is the venv's
        # Token auth as cluster/*.yaml sets it, with this cluster's own token file: the
        # user's ~/.ray/auth_token (and other Ray instances using it) stay untouched.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_USAGE_STATS_ENABLED": "0",
        # On SIGTERM a node first drains for up to 30 s (for Serve replicas; nothing here
        # needs it): teardown would wait that long for the head.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        MARKER: marker,
    })
    head_port, dash_port = _free_port(), _free_port()
    dashboard = f"http://127.0.0.1:{dash_port}"
    # Every port a node would otherwise take from a fixed default (6379, 8265, 10001,
    # 52365) is a free one, so other Ray instances on the machine cannot collide.
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", "0",
              "--object-store-memory", str(200 * 1024**2), "--disable-usage-stats"]
    head_args = ["--head", "--port", str(head_port), "--temp-dir", str(tmp / "h"),
                 "--ray-client-server-port", str(_free_port()),
                 "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port),
                 "--dashboard-agent-listen-port", str(_free_port()), *common]
    starters: list[tuple[subprocess.Popen, Path]] = []
    node_ids: dict[str, str] = {}
    mlflow_server = None
    try:
        starters.append((_start_node(head_args, {**env, **FAST_HEALTH_CHECK}, tmp / "head.log"), tmp / "head.log"))
        (head,) = _wait_for_nodes(dashboard, token, 1, starters)
        for name in NON_HEAD:  # one at a time, so each node id is known by name
            args = ["--address", f"127.0.0.1:{head_port}", "--temp-dir", str(tmp / name),
                    "--dashboard-agent-listen-port", str(_free_port()), *common]
            starters.append((_start_node(args, {**env, NODE_MARKER: name}, tmp / f"{name}.log"), tmp / f"{name}.log"))
            nodes = _wait_for_nodes(dashboard, token, len(starters), starters)
            (node_ids[name],) = [n["node_id"] for n in nodes
                                 if n["node_id"] not in (head["node_id"], *node_ids.values())]
        mlflow_uri, mlflow_server = server.start_local_server(
            f"sqlite:///{tmp / 'mlflow' / 'mlflow.db'}", tmp / "mlflow" / "artifacts", host="127.0.0.1",
            log_path=tmp / "mlflow.log",
        )
        yield Cluster(tmp=tmp, starters={name: p for name, (p, _) in zip(("head", *NON_HEAD), starters)}, env=env,
                      token=token, dashboard=dashboard, mlflow_uri=mlflow_uri, results=tmp / "results",
                      storage=tmp / "nfs", head_node_id=head["node_id"], node_ids=node_ids)
    finally:
        if mlflow_server is not None:
            server.stop_local_server(mlflow_server)
        for process, _ in reversed(starters):  # worker first, as `ray down` does
            # SIGTERM a `ray start --block` group (it stops its GCS / raylet / workers), then SIGKILL.
            server.stop_local_server(process, timeout_s=20.0)
        left = _kill_marked(marker)
        if left:
            time.sleep(1)
        still = _marked_pids(marker)
        if os.environ.get("VITSWEEP_E2E_KEEP") == "1":
            print(f"\nkept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if still and sys.exc_info()[0] is None:  # never mask the error that got us here
            pytest.fail(f"processes of the test cluster outlived teardown: {still}")


def _submit(cluster: Cluster) -> str:
    """`ray job submit --no-wait` of the demo study; returns the submission id."""
    submission_id = f"vitsweep-e2e-{secrets.token_hex(4)}"
    entrypoint = [
        "python", "sweeps/run.py", STUDY, "--address", "auto", "--stage", "all",
        "--results", str(cluster.results), "--storage", str(cluster.storage),
        "--mlflow-uri", cluster.mlflow_uri,
        "--set", f"epochs={EPOCHS}", "--set", f"max_train_images={TRAIN_IMAGES}", "--cpus-per-trial", CPUS_PER_TRIAL,
        "--pack", str(TRIALS // PACKS),
        "--gpus-per-trial", "0",  # a launch with --address says what it trains on
    ]
    done = cluster.ray(
        "job", "submit", "--address", cluster.dashboard, "--submission-id", submission_id, "--no-wait",
        "--working-dir", str(ROOT), "--runtime-env-json", json.dumps({"excludes": UPLOAD_EXCLUDES, "env_vars": {
            "PYTHONPATH": str(ROOT / "tests" / "evalcap"), "VITSWEEP_TEST_EVAL_SIZE": str(EVAL_SIZE)}}),
        "--", *entrypoint,
    )
    assert done.returncode == 0, f"ray job submit failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return submission_id


@dataclass
class Loss:
    """The node lost mid-trial: its name and Ray node id, and the trials its pack trained there."""

    name: str
    node_id: str
    trials: list[str]


def _training_on(cluster: Cluster) -> tuple[str, list[str]] | None:
    """(node name, trial ids) of a pack training on a non-head node whose first checkpoint is on the
    share, from the trials rows (``node``: "<ip> <node id>") and the checkpoints; None: none yet."""
    try:
        rows = pq.read_table(cluster.results / STUDY / "trials").to_pylist()
    except (OSError, ValueError):  # not written yet, or a file mid-replace
        return None
    for name, node_id in cluster.node_ids.items():
        running = [r for r in rows if r["status"] == "running" and (r.get("node") or "").endswith(node_id)]
        saved = [r for r in running if Path(checkpoints.epoch_file(
            str(cluster.storage / STUDY / "checkpoints" / r["trial_id"]))).exists()]
        if saved:
            return name, sorted({r["trial_id"] for r in running if r["pack"] == saved[0]["pack"]})
    return None


def _lose_node(cluster: Cluster, name: str) -> None:
    """A node lost as a preempted machine is: its `ray start` group and every process its raylet
    started (workers Ray puts in their own groups) SIGKILLed at once."""
    os.killpg(cluster.starters[name].pid, signal.SIGKILL)
    needle = f"{NODE_MARKER}={name}".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _wait_for_job(cluster: Cluster, submission_id: str) -> tuple[str, Loss | None]:
    """Poll the jobs API until the job ends, losing a node once a pack trained there to its first
    checkpoint; returns the job's final status and the loss (None: no pack got there in time)."""
    deadline = time.monotonic() + JOB_DEADLINE_S
    loss = None
    while True:
        if loss is None and (found := _training_on(cluster)):
            name, trials = found
            _lose_node(cluster, name)
            loss = Loss(name, cluster.node_ids[name], trials)
            print(f"lost node {name} ({loss.node_id}) while it trained {trials}")
        status = cluster.api(f"/api/jobs/{submission_id}")["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status, loss
        if time.monotonic() > deadline:
            cluster.ray("job", "stop", "--address", cluster.dashboard, submission_id)
            return f"still {status} after {JOB_DEADLINE_S:g} s (stopped)", loss
        time.sleep(0.25 if loss is None else 3)


def _job_logs(cluster: Cluster, submission_id: str, lines: int = 150) -> str:
    done = cluster.ray("job", "logs", "--address", cluster.dashboard, submission_id)
    text = "\n".join((done.stdout + done.stderr).splitlines()[-lines:])
    return f"--- last {lines} lines of `ray job logs {submission_id}`:\n{text}"


@pytest.fixture(scope="module")
def job(cluster):
    """The demo sweep submitted as a Ray job, a node lost mid-trial, and the job finished:
    (cluster, submission id, the loss)."""
    t0 = time.monotonic()
    submission_id = _submit(cluster)
    status, loss = _wait_for_job(cluster, submission_id)
    wall = time.monotonic() - t0
    if status != "SUCCEEDED":
        # The full logs once (captured output of the first test's setup); every test that
        # uses this fixture then repeats only the short message.
        print(_job_logs(cluster, submission_id, lines=400))
        print(f"--- mlflow.log:\n{_tail(cluster.tmp / 'mlflow.log', 30)}")
        message = cluster.api(f"/api/jobs/{submission_id}").get("message")
        pytest.fail(f"job {submission_id}: {status} after {wall:.0f} s ({message}); its logs are in the "
                    f"captured stdout of the first test's setup\n{_job_logs(cluster, submission_id, lines=30)}")
    print(f"\njob {submission_id} succeeded in {wall:.0f} s")
    return cluster, submission_id, loss


def test_the_ray_cli_reports_the_job_succeeded(job):
    cluster, submission_id, _ = job
    done = cluster.ray("job", "status", "--address", cluster.dashboard, submission_id)
    assert done.returncode == 0 and f"Job '{submission_id}' succeeded" in done.stdout + done.stderr, (
        f"`ray job status` with the cluster's token: {done.stdout}\n{done.stderr}")
    logs = _job_logs(cluster, submission_id, lines=10_000)
    assert f"{STUDY}: {TRIALS} of {TRIALS} trials ended" in logs and f"({TRIALS} finished)" in logs, logs[-3000:]
    assert "Ray: joining auto" in logs and "[train] started" in logs, logs[-3000:]  # no silent start-up
    # The launcher joined the running cluster instead of starting a Ray of its own: Ray says so, in
    # the lines the launcher keeps off the console (<results>/<study>/logs/console-*.log).
    kept = "\n".join(p.read_text() for p in (cluster.results / STUDY / "logs").glob("console-*.log"))
    assert re.search(r"Connecting to existing Ray cluster at address: [\d.]+:\d+", logs + kept), kept[-3000:]


def test_the_token_is_required(job):
    cluster, _, _ = job
    with pytest.raises(urllib.error.HTTPError) as info:
        _get_json(f"{cluster.dashboard}/api/jobs/")
    assert info.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as info:
        _get_json(f"{cluster.dashboard}/api/jobs/", token="0" * 64)
    assert info.value.code == 403


def test_every_trial_is_a_finished_run_on_the_mlflow_server(job):
    cluster, _, _ = job
    api = f"{cluster.mlflow_uri}/api/2.0/mlflow"
    experiment = _get_json(f"{api}/experiments/get-by-name?experiment_name={STUDY}")["experiment"]
    runs = _get_json(f"{api}/runs/search", body={"experiment_ids": [experiment["experiment_id"]],
                                                 "max_results": 100})["runs"]
    names = sorted(r["info"]["run_name"] for r in runs)
    # The study's own run (its report and claims) lives in <study>-reports, out of the trials' charts.
    reports = _get_json(f"{api}/experiments/get-by-name?experiment_name={STUDY}-reports")["experiment"]
    report_runs = _get_json(f"{api}/runs/search", body={"experiment_ids": [reports["experiment_id"]]})["runs"]
    assert [r["info"]["run_name"] for r in report_runs] == [f"{STUDY}-report"], report_runs
    assert f"{STUDY}-report" not in names, names
    runs = [r for r in runs if any(t["key"] == "vitsweep.trial_id" for t in r["data"].get("tags", []))]
    assert len(runs) == TRIALS, names
    trials = pq.read_table(cluster.results / STUDY / "trials").to_pandas()
    assert sorted(r["info"]["run_name"] for r in runs) == sorted(trials["trial_id"])
    for run in runs:
        info, data = run["info"], run["data"]
        assert info["status"] == "FINISHED", info
        metrics = {m["key"]: m for m in data.get("metrics", [])}
        params = {p["key"]: p["value"] for p in data.get("params", [])}
        tags = {t["key"]: t["value"] for t in data.get("tags", [])}
        per_epoch = {tracking.epoch_key(k) for k in ("train_loss", "train_acc", "eval_loss", "eval_acc")}
        assert per_epoch | {tracking.headline_key("test_acc")} <= set(metrics), sorted(metrics)
        eval_acc = metrics[tracking.epoch_key("eval_acc")]
        assert eval_acc["step"] == EPOCHS and 0 <= eval_acc["value"] <= 1
        assert params["epochs"] == str(EPOCHS) and params["pe"] in ("none", "ape") and "lr" in params
        assert tags["study"] == STUDY and tags[tracking.TRIAL_ID_TAG] == info["run_name"]
        # Computed once by the launcher (Ray ships the working dir without .git) and
        # the same in Parquet.
        assert tags["code_version"] not in ("", "unknown"), tags
        assert tags["code_version"] == trials.set_index("trial_id").loc[info["run_name"], "code_version"]
        # Artifacts went through the server's proxy (the trials never see its folder).
        listing = _get_json(f"{api}/artifacts/list?run_id={info['run_id']}")
        assert {"config.json", "provenance"} <= {f["path"] for f in listing.get("files", [])}, listing
    assert list((cluster.tmp / "mlflow" / "artifacts").rglob("config.json")), "no artifact reached the server"


def test_parquet_tables_hold_every_trial_and_epoch(job):
    cluster, _, _ = job
    trials = pq.read_table(cluster.results / STUDY / "trials").to_pandas()
    assert len(trials) == TRIALS and set(trials["status"]) == {"finished"}, trials[["trial_id", "status"]]
    assert set(trials["pe"]) == {"none", "ape"} and set(trials["protocol"]) == {"baseline", "cutmix"}
    assert (trials["epochs"] == EPOCHS).all() and (trials["max_train_images"] == TRAIN_IMAGES).all()
    epochs = pq.read_table(cluster.results / STUDY / "epochs").to_pandas()
    assert len(epochs) == TRIALS * EPOCHS and set(epochs["epoch"]) == set(range(1, EPOCHS + 1))
    assert sorted(epochs["trial_id"].unique()) == sorted(trials["trial_id"])
    assert (epochs["images_per_s"] > 0).all() and epochs["eval_acc"].between(0, 1).all()
    # Checkpoints and snapshots went to the shared storage, not to a node's local disk.
    for row in trials.itertuples():
        assert str(row.checkpoint_path).startswith(str(cluster.storage)), row.checkpoint_path
        assert Path(checkpoints.checkpoint_file(row.checkpoint_path)).exists()
        assert str(row.snapshot_dir).startswith(str(cluster.storage)) and any(Path(row.snapshot_dir).iterdir())


def test_trials_table_has_the_final_metrics(job):
    """trials.epochs_completed / test_acc come from the last report of each Train run, and the
    analysis stage labels each final checkpoint with epochs_completed (the demo measures every
    snapshot too: epoch 0 is the untrained one)."""
    cluster, _, _ = job
    trials = pq.read_table(cluster.results / STUDY / "trials").to_pandas()
    shown = trials[["trial_id", "epochs_completed", "eval_acc", "test_acc"]].to_string()
    assert (trials["epochs_completed"] == EPOCHS).all(), shown
    assert trials["test_acc"].between(0, 1).all(), shown
    measurements = pq.read_table(cluster.results / STUDY / "measurements").to_pandas()
    measured = set(measurements["checkpoint_epoch"])
    assert measured == set(range(EPOCHS + 1)), sorted(measured)
    assert (measurements.groupby("trial_id")["checkpoint_epoch"].max() == EPOCHS).all()


def test_analysis_and_report_stages_ran_on_the_cluster(job):
    cluster, _, _ = job
    measurements = pq.read_table(cluster.results / STUDY / "measurements").to_pandas()
    trials = pq.read_table(cluster.results / STUDY / "trials").to_pandas()
    assert sorted(measurements["trial_id"].unique()) == sorted(trials["trial_id"])
    assert {"clean", "jpeg", "blur", "rpi", "pe_scale"} == set(measurements["intervention"])
    assert (measurements["n_images"] == EVAL_SIZE).all()  # the study's cap reached the Ray Data job
    # The analysis job's summary reached each trial's run through the MLflow server.
    api = f"{cluster.mlflow_uri}/api/2.0/mlflow"
    experiment = _get_json(f"{api}/experiments/get-by-name?experiment_name={STUDY}")["experiment"]
    runs = _get_json(f"{api}/runs/search", body={"experiment_ids": [experiment["experiment_id"]],
                                                 "max_results": 100})["runs"]
    trial_runs = [r for r in runs if "vitsweep.study_run" not in {t["key"] for t in r["data"].get("tags", [])}]
    assert len(trial_runs) == len(runs) == TRIALS  # the study's own run (the report) is in <study>-reports
    for run in trial_runs:
        keys = {m["key"] for m in run["data"].get("metrics", [])}
        assert {"Headline/acc_clean", "Headline/mad_min", "Headline/dssdc_rpi"} <= keys, sorted(keys)
    assert (cluster.results / STUDY / "report" / "index.html").stat().st_size > 0


def test_trials_trained_on_several_nodes(job):
    """Ray Train workers (one per pack, and the restarted one) appear in the state API with the node
    they ran on: the lost node among them."""
    cluster, _, loss = job
    reply = cluster.api("/api/v0/actors?limit=1000&detail=1&filter_keys=class_name"
                        "&filter_predicates=%3D&filter_values=RayTrainWorker")
    workers = reply["data"]["result"]["result"]
    nodes = {w["node_id"] for w in workers}
    assert len(workers) >= PACKS + 1 and len(nodes) >= 2, workers
    assert loss is not None and loss.node_id in nodes, (loss, nodes)


def test_a_lost_node_moves_its_pack_to_a_surviving_node_from_its_checkpoint_and_the_records_say_so(job):
    cluster, submission_id, loss = job
    assert loss is not None, "no pack trained on a non-head node to its first checkpoint before the job ended"
    trials = pq.read_table(cluster.results / STUDY / "trials").to_pandas().set_index("trial_id")
    moved = trials.loc[loss.trials]
    assert (moved["status"] == "finished").all() and (moved["restarts"] == 1).all(), moved[["status", "restarts"]]
    assert not moved["node"].str.endswith(loss.node_id).any(), moved["node"]  # finished on a surviving node
    assert (trials.drop(index=loss.trials)["restarts"] == 0).all()
    # Each epoch recorded once, in Parquet and in MLflow: the moved pack went on from its checkpoint.
    epochs = pq.read_table(cluster.results / STUDY / "epochs").to_pandas()
    assert not epochs.duplicated(["trial_id", "epoch"]).any()
    assert (epochs.groupby("trial_id")["epoch"].apply(sorted) == [list(range(1, EPOCHS + 1))] * TRIALS).all()
    api = f"{cluster.mlflow_uri}/api/2.0/mlflow"
    for trial_id in loss.trials:
        run_id = trials.loc[trial_id, "mlflow_run_id"]
        for key in (tracking.epoch_key("eval_acc"), tracking.epoch_key("train_loss")):
            history = _get_json(f"{api}/metrics/get-history?run_id={run_id}&metric_key={key}")["metrics"]
            assert sorted(m["step"] for m in history) == list(range(1, EPOCHS + 1)), (trial_id, key, history)
        tags = {t["key"]: t["value"] for t in _get_json(f"{api}/runs/get?run_id={run_id}")["run"]["data"]["tags"]}
        assert tags[tracking.RESTARTS_TAG] == "1" and loss.node_id in tags[tracking.LAST_RESTART_TAG], tags
        assert tags[tracking.NODE_TAG] == trials.loc[trial_id, "node"]
    # The console said which pack lost its node, and where and from which epoch it resumed.
    logs = _job_logs(cluster, submission_id, lines=10_000)
    said = [line for line in logs.splitlines() if "resumed from epoch" in line]
    assert len(said) == 1 and loss.node_id in said[0] and "was lost" in said[0], said or logs[-3000:]
    resumed_on = re.search(r"resumed from epoch (\d+) on node \S+ (\w+)", said[0])
    assert resumed_on and int(resumed_on[1]) >= 1 and resumed_on[2] != loss.node_id, said[0]
    assert sum("after 1 restart(s)" in line for line in logs.splitlines()) == len(loss.trials), logs[-3000:]
