"""On a Ray cluster that reports GPUs, a study launched without GPU flags is refused before any trial
trains. The GPU is Ray's own logical resource (`ray.init(num_gpus=1)` on a CPU machine): a real Ray
that schedules as a GPU node would; nothing here uses a device."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, sys, ray
ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, _temp_dir=sys.argv[2], log_to_driver=False)
gpus = ray.cluster_resources().get("GPU")
from sweeps.launch import options
from sweeps import run as launcher
parser = launcher.argparse.ArgumentParser()
options.add_arguments(parser)
rc = launcher.run(parser.parse_args(["demo", "--results", sys.argv[1], "--set", "epochs=1"]))
print(json.dumps({"rc": rc, "gpus": gpus}))
"""


def test_a_launch_without_gpu_flags_on_a_gpu_cluster_is_refused_before_any_trial(tmp_path):
    results = tmp_path / "results"
    temp_dir = tempfile.mkdtemp(prefix="vsg-", dir="/tmp")  # Ray's socket paths must stay short
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, str(results), temp_dir], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["gpus"] == 1.0, "Ray did not take the logical GPU"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert got["rc"] == 2 and len(errors) == 1, done.stderr
    assert "--gpus-per-trial" in errors[0] and "has 1 GPU(s)" in errors[0], errors[0]
    study = results / "demo"
    assert not (study / "trials").exists() and not (study / "epochs").exists(), "a trial started"
    assert not (study / "sweep.json").exists() and not (results / "storage" / "demo").exists()
