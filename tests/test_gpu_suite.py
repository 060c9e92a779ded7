"""bench/gpu_suite.py's CPU mode: every section of the code the H200 runs, at a tiny size; one
section's failure loses no other section's numbers."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["packing", "probe", "separate", "augment", "decode", "step", "deterministic", "compile"]


def test_gpu_suite_runs_every_section_in_tiny_cpu_mode_without_ray_or_mlflow(tmp_path):
    kept = tmp_path / "measured" / "gpu_suite.json"
    probe = ("import sys, runpy; sys.argv = ['gpu_suite', '--tiny', '--section-s', '0.05', '--fail-section', "
             f"'augment', '--keep', {str(kept)!r}]; runpy.run_path('bench/gpu_suite.py', run_name='__main__'); "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'pandas', 'pyarrow')); "
             "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "OUT": str(tmp_path), "PATH": "/usr/bin:/bin",
                               "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "estimated time per section" in done.stdout.splitlines()[0]
    result = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert json.loads(kept.read_text()) == result  # --keep's copy is the table
    assert result["tiny"] and result["device"] == "cpu"
    sections = result["sections"]
    assert list(sections) == SECTIONS  # packing first, compile last, every one recorded
    # The injected failure is recorded as a failure; every other section still has its numbers.
    assert result["failed"] == ["augment"] and "injected" in sections["augment"]["error"]
    packing = sections["packing"]
    for group in ("crop+flip", "autoaugment+cutmix"):  # through the real input path, per protocol group
        for k in (1, 2):
            row = packing[f"{group} K={k}"]
            assert row["images_per_s"] > 0 and row["train_images_per_s"] > 0 and row["eval_images_per_s"] > 0
    assert result["packing"]["tiny"]["K=1"]["images_per_s"] > 0  # the rows --dry-run estimates from
    probe = sections["probe"]
    assert probe["K=1"]["attention"].startswith("fused") and probe["K=2"]["attention"] == "explicit softmax"
    assert probe["K=2"]["attention_selected"] == "explicit" and probe["K=1"]["logits_dtype"] == "float32"
    separate = sections["separate"]["2 separate processes"]
    assert separate["children_ok"] == 2 and separate["images_per_s"] > 0 and "failures" not in separate
    decode = sections["decode"]
    assert decode["decode_images_per_s"] > 0
    assert decode["decoded_max_level_diff_vs_cpu"] == decode["resized_crop_max_level_diff_vs_cpu"] == 0  # CPU vs CPU
    assert sections["step"]["eager_step_images_per_s"] > 0
    assert "CUDA only" in sections["deterministic"]["skipped"] and "CUDA only" in sections["compile"]["skipped"]
    assert "section" in done.stdout and "packing" in done.stdout


def test_a_tiny_table_is_never_kept_as_the_measured_one(tmp_path):
    done = subprocess.run([sys.executable, "bench/gpu_suite.py", "--tiny", "--keep"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "OUT": str(tmp_path),
                                                       "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2 and "no GPU measurement" in done.stderr
    assert not (tmp_path / "gpu_suite.json").exists()
