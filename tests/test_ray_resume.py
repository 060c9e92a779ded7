"""The hparam study end to end on the suite's local Ray; the helpers that check and clean up launchers
that are real processes with their own Ray (the loopback-only socket check runs during the SIGKILLed
sweep of tests/test_ray_faults.py)."""

import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow_runs import search_trial_runs

from records import stores

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parent.parent


def kill_ray_under(ray_tmp: str) -> None:
    """Kill whatever a killed launcher's Ray left behind, found by its own temp dir (never `ray stop`)."""
    subprocess.run(["pkill", "-9", "-f", ray_tmp], check=False)


def assert_listens_on_loopback_only(pid: int) -> None:
    """From the OS socket table: no listening socket of the launcher or any process it
    started (GCS, raylet, dashboard and its agent, Ray workers, Train workers) is bound
    beyond loopback (0.0.0.0, ::, or an address of this machine)."""
    import ipaddress

    import psutil  # the test extra (pyproject.toml); `make test` installs it
    root = psutil.Process(pid)
    listening = []
    for p in [root, *root.children(recursive=True)]:
        try:
            listening += [(p.name(), c.laddr) for c in p.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    assert len(listening) >= 5, listening  # GCS, raylet, dashboard, agents: the scan saw Ray

    def loopback(ip: str) -> bool:
        addr = ipaddress.ip_address(ip.split("%")[0])
        return addr.is_loopback or bool(getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback)

    assert all(loopback(laddr.ip) for _, laddr in listening), [x for x in listening if not loopback(x[1].ip)]


def test_hparam_search_writes_a_best_config_that_other_studies_pick_up(ray_local, tmp_path):
    from sweeps import run as sweep_launcher
    from sweeps.launch import options

    results = tmp_path / "results"
    parser = sweep_launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    # Two samples: both run at once on 2 CPUs, still a search (the TPE searcher proposes, ASHA judges).
    # On the suite's Ray, as the demo sweep of tests/conftest.py.
    assert sweep_launcher.run(parser.parse_args([
        "hparam", "--datasets", "shapes", "--preset", "tiny", "--epochs", "2", "--samples", "2",
        "--set", "max_train_images=256", "--set", "batch_size=64", "--results", str(results)])) == 0
    best = results / "hparam" / "best_config.json"
    import json

    doc = json.loads(best.read_text())
    assert set(doc["best_config"]) == {"lr", "weight_decay", "warmup_epochs"}
    assert doc["score"]["split"] == "holdout" and doc["trials"] == 2
    trials = pq.read_table(results / "hparam" / "trials").to_pandas()
    assert len(trials) == 2 and set(trials["eval_split"]) == {"holdout"}
    assert trials["test_acc"].isna().all()  # scored on holdout, the test split never looked at
    runs = search_trial_runs(stores.default_tracking_uri(str(results)), "hparam")
    assert len(runs) == 2 and set(runs["status"]) <= {"FINISHED"}

    # Another study's plan picks the file up (the dry run's JSON is tests/test_sweeps.py's).
    configs = [c.to_flat() for c in options.build_trials(
        parser.parse_args(["study_l", "--dry-run", "--defaults-from", str(best)]))]
    assert all(c["lr"] == pytest.approx(doc["best_config"]["lr"]) for c in configs)
    assert all(c["weight_decay"] == pytest.approx(doc["best_config"]["weight_decay"]) for c in configs)
