"""bench/gpu_suite.py's CPU mode: the same code the H200 runs, at a tiny size."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_suite_runs_in_tiny_cpu_mode_without_ray_or_mlflow(tmp_path):
    probe = ("import sys, runpy; sys.argv = ['gpu_suite', '--tiny', '--section-s', '0.05']; "
             "runpy.run_path('bench/gpu_suite.py', run_name='__main__'); "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'pandas', 'pyarrow')); "
             "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "OUT": str(tmp_path), "PATH": "/usr/bin:/bin",
                               "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert result["tiny"] and result["device"] == "cpu"
    sections = result["sections"]
    assert len(sections["augment"]) == 7 and all(r["images_per_s"] > 0 for r in sections["augment"].values())
    assert sections["decode"]["decode_images_per_s"] > 0
    assert sections["decode"]["resized_crop_max_level_diff_vs_cpu"] == 0  # the CPU against itself
    assert sections["step"]["eager_step_images_per_s"] > 0
    packing = sections["packing"]
    assert packing["packed K=2"]["images_per_s"] > 0 and packing["2 separate processes"]["images_per_s"] > 0
    assert packing["bf16 packed-vs-alone loss diff (rel.)"] < 1e-3  # fp32 on CPU: rounding only
    assert result["packing"]["tiny"]["K=1"]["images_per_s"] > 0  # the rows --dry-run estimates from
    assert "section" in done.stdout and "augment" in done.stdout
