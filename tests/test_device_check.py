"""bench/device_check.sh, the first command a lent GPU runs: its CPU dry run runs every step in its tiny
or skip form, each step's output lands under OUT with its rc line in the summary, and nothing it runs
imports Ray, MLflow or Optuna (the device machine's Python has none: here they are made unimportable);
without CUDA the real run stops after one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

from records import tables

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "device_check.sh"
STEPS = ["cuda", "host_syncs", "suite", "snapshot", "study_l"]


def _env(tmp_path: Path, out: Path) -> dict:
    """No GPU, and ray / mlflow / optuna shadowed by packages that refuse to import."""
    poison = tmp_path / "poison"
    for name in ("ray", "mlflow", "optuna"):
        (poison / name).mkdir(parents=True)
        (poison / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the device machine')\n")
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OUT": str(out), "PYTHON": sys.executable,
            "PYTHONPATH": str(poison), "CUDA_VISIBLE_DEVICES": ""}


def _summary(out: Path) -> dict[str, str]:
    lines = (out / "summary.txt").read_text().splitlines()
    return {line.split()[0]: line for line in lines}


def test_the_dry_run_runs_every_step_and_returns_each_file_and_rc(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=tmp_path, env=_env(tmp_path, out),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = _summary(out)
    assert list(summary) == STEPS, summary  # one line per step, in order
    for name in STEPS:
        assert summary[name].split()[1] == "rc=0", summary[name]
        assert (out / f"{name}.log").is_file(), name
    assert "dry run: CUDA not checked" in summary["cuda"]
    assert "float32" in (out / "host_syncs.log").read_text()  # the logits' dtype per case (CPU: no autocast)
    suite = json.loads((out / "suite" / "gpu_suite.json").read_text())
    assert list(suite["sections"]) == ["probe", "compile"] and suite["failed"] == []
    assert suite["sections"]["probe"]["K=1"]["attention"] == "fused: flash"  # the CPU's SDPA flash kernel
    assert "CUDA only" in suite["sections"]["compile"]["skipped"]
    timing = json.loads((out / "snapshot" / "snapshot_timing.json").read_text())
    assert timing["snapshot_s"] > 0 and timing["rows"] > 0
    results = str(out / "study_l" / "results")
    trials = tables.read_table(results, "study_l_gpu", "trials").to_pandas()
    assert len(trials) == 4 and set(trials["status"]) == {"finished"} and set(trials["epochs_completed"]) == {2}
    assert len(tables.measured(results, "study_l_gpu")) == 4 * 3  # snapshots 0, 1, 2 of every member
    assert not list(out.rglob("*.pt"))  # the checkpoints stay out of what the device tool brings back


def test_without_cuda_the_real_run_stops_after_one_line(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=_env(tmp_path, out), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    summary = _summary(out)
    assert list(summary) == ["cuda"] and "rc=1" in summary["cuda"] and "CUDA unusable" in summary["cuda"]
