"""The cluster YAMLs: valid for the installed Ray's cluster launcher, and safe.

Every ``cluster/*.yaml`` except the KubeRay manifest goes through Ray's own
config preparation (``prepare_config``: merge with the provider's
defaults.yaml, setup-command merging, per-type worker bounds) and then
``validate_config`` (ray-schema.json). Provider bootstrap (AMIs, subnets,
IAM, key pairs) needs cloud credentials, so it is left out; the node types
therefore declare their ``resources`` themselves, which the schema demands.

The security properties (see cluster/README.md "Security") are checked on the
parsed YAML, and ``cluster/start_mlflow.sh`` is run for real in its
dry-run, backup and stop modes.
"""

import copy
import functools
import os
import pathlib
import shlex
import sqlite3
import subprocess
import sys
import tomllib

import jsonschema
import pytest
import ray
import yaml
from packaging.requirements import Requirement
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = pathlib.Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
START_MLFLOW = CLUSTER / "start_mlflow.sh"
LAUNCHER_YAMLS = sorted(p.name for p in CLUSTER.glob("*.yaml") if p.name != "kuberay.yaml")
CLOUD_YAMLS = ["aws.yaml", "gcp.yaml"]
COMMAND_LISTS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")


@functools.cache
def raw_config(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


def commands(config: dict) -> list[str]:
    """Every shell command of the config, node-type overrides included."""
    out = [cmd for key in COMMAND_LISTS for cmd in config.get(key, [])]
    for node_type in config.get("available_node_types", {}).values():
        for key in ("initialization_commands", "worker_setup_commands"):
            out += node_type.get(key, [])
    return out


def ray_start(cmds: list[str], head: bool) -> str:
    starts = [c for c in cmds if "ray start" in c and ("--head" in c) == head]
    assert len(starts) == 1, starts
    return starts[0]


def option_values(cmd: str, option: str) -> list[str]:
    """Values of ``--option=V`` / ``--option V`` in a shell command."""
    tokens = shlex.split(cmd)
    values = []
    for i, token in enumerate(tokens):
        if token.startswith(option + "="):
            values.append(token.split("=", 1)[1])
        elif token == option and i + 1 < len(tokens):
            values.append(tokens[i + 1])
    return values


def gpu_types(config: dict) -> dict:
    return {
        name: t
        for name, t in config["available_node_types"].items()
        if t["resources"].get("GPU", 0) > 0
    }


# --- the installed Ray accepts them -------------------------------------------------


def test_every_launcher_yaml_is_checked():
    assert set(CLOUD_YAMLS) | {"local.yaml"} <= set(LAUNCHER_YAMLS)


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_validates_against_installed_ray_schema(name):
    prepared = prepare_config(copy.deepcopy(raw_config(name)))
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_schema_check_catches_a_misspelt_key():
    # Guards the test above: the validator must bite on a typo that Ray
    # would otherwise ignore at `ray up` time.
    broken = copy.deepcopy(raw_config("aws.yaml"))
    broken["available_node_types"]["gpu_small"]["min_worker"] = 0
    with pytest.raises(jsonschema.ValidationError, match="min_worker"):
        validate_config(prepare_config(broken))


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_pins_match_this_project(name):
    setup = " ".join(raw_config(name)["setup_commands"])
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = {Requirement(r).name: Requirement(r) for r in pyproject["project"]["dependencies"]}
    pins = {}
    for token in shlex.split(setup):
        if "==" in token:
            package, version = token.split("==")
            pins[Requirement(package).name] = version
    # The cluster's Ray must be the Ray that runs `ray up` / `ray job submit`.
    assert pins["ray"] == ray.__version__
    for package in ("ray", "torch", "torchvision"):
        assert requirements[package].specifier.contains(pins[package]), (package, pins[package])


# --- security -----------------------------------------------------------------------


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_nothing_binds_every_interface(name):
    for cmd in commands(raw_config(name)):
        for wildcard in WILDCARD_HOSTS:
            assert wildcard not in shlex.split(cmd), cmd
        assert "0.0.0.0" not in cmd, cmd


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_dashboard_and_client_ports_stay_private(name):
    head = ray_start(raw_config(name)["head_start_ray_commands"], head=True)
    assert option_values(head, "--dashboard-host") == ["127.0.0.1"]
    assert option_values(head, "--dashboard-port") == ["8265"]
    assert option_values(head, "--ray-client-server-port") == ["10001"]


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_token_authentication_stays_on(name):
    config = raw_config(name)
    text = (CLUSTER / name).read_text()
    assert "RAY_AUTH_MODE=disabled" not in text
    assert "RAY_AUTH_TOKEN=" not in text  # no literal token in a committed file
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert any("RAY_AUTH_MODE=token" in c for c in config["initialization_commands"])
    for head in (True, False):
        start = ray_start(config[f"{'head' if head else 'worker'}_start_ray_commands"], head)
        assert "RAY_AUTH_MODE=token ray start" in start


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_head_starts_a_lean_private_mlflow(name):
    starts = [c for c in raw_config(name)["head_start_ray_commands"] if "start_mlflow.sh" in c]
    assert len(starts) == 1
    mlflow = starts[0]
    tokens = shlex.split(mlflow)
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in tokens
    assert option_values(mlflow, "--workers") == ["1"]
    assert not option_values(mlflow, "--host")  # the script picks a private address
    script = next(t for t in tokens if t.endswith("start_mlflow.sh"))
    assert script.startswith("~/vitsweep/") and (REPO / script.removeprefix("~/vitsweep/")).is_file()
    destination = option_values(mlflow, "--artifacts-destination")
    assert len(destination) == 1
    if name in CLOUD_YAMLS:
        assert destination[0].startswith(("s3://", "gs://"))


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_code_and_token_are_mounted_without_local_state(name):
    config = raw_config(name)
    assert config["file_mounts"]["~/vitsweep"] == "."
    assert {".venv", "results", "data", "mlruns"} <= set(config["rsync_exclude"])


@pytest.mark.parametrize("name", CLOUD_YAMLS)
def test_gpu_workers_scale_from_zero_on_spot(name):
    config = raw_config(name)
    gpus = gpu_types(config)
    # A small type for Study L's fractional trials, a multi-GPU type for Study P.
    assert sorted(t["resources"]["GPU"] for t in gpus.values()) == [1, 4]
    for node_type in gpus.values():
        assert node_type["min_workers"] == 0
        node = node_type["node_config"]
        if config["provider"]["type"] == "aws":
            assert node["InstanceMarketOptions"]["MarketType"] == "spot"
        else:
            # An object (the API's type), not the list form of Ray's examples.
            assert isinstance(node["scheduling"], dict)
            assert node["scheduling"]["provisioningModel"] == "SPOT"
            assert node["scheduling"]["onHostMaintenance"] == "TERMINATE"


@pytest.mark.parametrize("name", CLOUD_YAMLS)
def test_head_is_on_demand_and_runs_no_trials(name):
    config = raw_config(name)
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}
    assert "InstanceMarketOptions" not in head["node_config"]
    assert "scheduling" not in head["node_config"]


def test_aws_security_group_gets_no_extra_inbound_rules():
    provider = raw_config("aws.yaml")["provider"]
    assert not provider.get("security_group", {}).get("IpPermissions")


def test_local_cluster_keeps_its_own_ray_temp_dir():
    config = raw_config("local.yaml")
    assert config["provider"]["type"] == "local"
    assert config["provider"]["head_ip"] and isinstance(config["provider"]["worker_ips"], list)
    assert any("RAY_TMPDIR=" in c for c in config["initialization_commands"])
    destination = option_values(
        next(c for c in config["head_start_ray_commands"] if "start_mlflow.sh" in c),
        "--artifacts-destination",
    )
    assert destination == ["/mnt/nfs/vitsweep/mlflow-artifacts"]


# --- the KubeRay manifest -------------------------------------------------------------


def test_kuberay_rayjob_structure():
    docs = [d for d in yaml.safe_load_all((CLUSTER / "kuberay.yaml").read_text()) if d]
    assert [(d["apiVersion"], d["kind"]) for d in docs] == [("ray.io/v1", "RayJob")]
    spec = docs[0]["spec"]
    assert spec["entrypoint"].startswith("python sweeps/run.py study_l")
    assert "--results s3://" in spec["entrypoint"]
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    assert cluster["authOptions"]["mode"] == "token"
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] == 0
        container = group["template"]["spec"]["containers"][0]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1


# --- start_mlflow.sh, run for real ----------------------------------------------------


def run_start_mlflow(*args, tmp_path, **env):
    return subprocess.run(
        ["bash", str(START_MLFLOW), *args],
        env={**os.environ, "VITSWEEP_STATE_DIR": str(tmp_path), "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_start_mlflow_dry_run_command(tmp_path):
    result = run_start_mlflow(
        "--dry-run", "--workers", "1", "--artifacts-destination", "s3://bucket/a",
        tmp_path=tmp_path, VITSWEEP_MLFLOW_HOST="10.1.2.3",
    )
    assert result.returncode == 0, result.stderr
    env_line, command_line, uri_line = result.stdout.strip().splitlines()
    assert env_line == "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false"
    assert uri_line == "VITSWEEP_MLFLOW_URI=http://10.1.2.3:5000"
    assert shlex.split(command_line)[:2] == ["mlflow", "server"]

    def value(option):
        # `mlflow server` is a click command: a repeated option's last value
        # wins, so the YAML's options override the script's defaults.
        return option_values(command_line, option)[-1]

    assert value("--host") == "10.1.2.3"
    assert value("--port") == "5000"
    assert value("--workers") == "1"
    assert value("--artifacts-destination") == "s3://bucket/a"
    assert value("--backend-store-uri") == f"sqlite:///{tmp_path}/mlflow.db"


def test_start_mlflow_default_host_is_a_specific_address(tmp_path):
    result = run_start_mlflow("--dry-run", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    host = option_values(result.stdout.splitlines()[1], "--host")
    assert len(host) == 1 and host[0] not in WILDCARD_HOSTS


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_start_mlflow_refuses_wildcard_binds(tmp_path, host):
    result = run_start_mlflow("--dry-run", tmp_path=tmp_path, VITSWEEP_MLFLOW_HOST=host)
    assert result.returncode == 2
    assert "refusing" in result.stderr
    result = run_start_mlflow("--dry-run", "--host", "0.0.0.0", tmp_path=tmp_path)
    assert result.returncode == 2


def test_start_mlflow_backup_is_a_consistent_copy(tmp_path):
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
        db.executemany("INSERT INTO runs (name) VALUES (?)", [(f"trial-{i}",) for i in range(100)])
    result = run_start_mlflow("--backup", str(tmp_path / "copy.db"), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(tmp_path / "copy.db") as copy_db:
        assert copy_db.execute("SELECT count(*), max(name) FROM runs").fetchone() == (100, "trial-99")


def test_start_mlflow_stop_leaves_unrelated_processes_alone(tmp_path):
    # A stale pid file whose pid now belongs to something else must not be
    # signalled.
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "mlflow.pid").write_text(str(bystander.pid))
        result = run_start_mlflow("--stop", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert bystander.poll() is None
        assert not (tmp_path / "mlflow.pid").exists()
    finally:
        bystander.kill()
        bystander.wait()
