"""bench/gpu_study_l.py's CPU mode: the first GPU run's code end to end at a tiny size, without Ray,
MLflow or Optuna, writing the tables `vitsweep report` builds Study L's report from."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
from conftest import load_script

from analysis.reporting.report import build_report
from analysis.statistics.claims import SINKS_KEPT_MARK
from records import tables

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_study_l.py"


def _load_script():
    return load_script(SCRIPT)


def test_tiny_run_writes_the_tables_vitsweep_report_reads(tmp_path):
    out, storage = tmp_path / "results", tmp_path / "storage"
    probe = ("import sys, runpy; sys.argv = ['gpu_study_l', '--tiny', '--out', " + repr(str(out)) +
             ", '--storage', " + repr(str(storage)) + "]; "
             "runpy.run_path(" + repr(str(SCRIPT)) + ", run_name='__main__'); "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'optuna')); "
             "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vitsweep report study_l_gpu --results" in done.stdout
    # The tables under --out, the checkpoints and snapshots under --storage (not what a device tool brings back)
    assert not (out / "storage").exists() and len(list(storage.rglob("*.pt"))) >= 4 * 3

    trials = tables.read_table(str(out), "study_l_gpu", "trials").to_pandas()
    assert sorted(trials["protocol"]) == sorted(["baseline", "cutmix", "autoaugment",
                                                 "autoaugment+cutmix+label_smoothing"])
    assert set(trials["status"]) == {"finished"} and set(trials["seed"]) == {0} and set(trials["pe"]) == {"ape"}
    assert set(trials["pack"]) == {"study_l_gpu-pack"} and trials["test_acc"].notna().all()
    # Lee's recipe, Study L's grid (32 px, patch 4: 8x8)
    assert set(trials["decay_exempt"]) == {"none"} and set(trials["cutmix_prob"]) == {0.5}
    assert set(trials["img_size"] // trials["patch_size"]) == {8}
    epochs = tables.read_table(str(out), "study_l_gpu", "epochs").to_pandas()
    for _, rows in epochs.groupby("trial_id"):  # a subset each epoch, the whole test split (80) at the last
        assert rows.sort_values("epoch")["eval_images"].tolist() == [20, 80]
    m = tables.read_table(str(out), "study_l_gpu", "measurements").to_pandas()
    for metric in ("mad", "entropy", "cls_mass"):  # every snapshot (0, 1, 2) of every member, per layer and head
        rows = m[(m["metric"] == metric) & (m["intervention"] == "clean")]
        assert set(rows.groupby("trial_id")["checkpoint_epoch"].unique().map(tuple)) == {(0, 1, 2)}
        assert rows["head_index"].notna().all() and rows["value"].notna().all()
    assert not (m["intervention"].isin(["jpeg", "blur", "pe_scale"])).any()  # the fragility passes are left out

    index = build_report(str(out), "study_l_gpu")
    page = index.read_text()
    assert "CutMix alone lowers minimum MAD" in page and "Study L" in page
    claims = pd.read_csv(index.parent / "claims.csv")
    in_family = ~claims["setting"].fillna("").str.contains(SINKS_KEPT_MARK, regex=False)  # not the sensitivity row
    cutmix = claims[(claims["claim"] == "CutMix alone lowers minimum MAD") & in_family]
    # Measured, but one seed decides nothing (random images: counted with the trials that did not learn kept)
    assert len(cutmix) == 1 and cutmix["n A"].item() + cutmix["did not learn A"].item() == 1
    assert cutmix["verdict (all trials)"].item() == "not enough seeds"


def test_budget_affords_the_epochs_the_docstring_states():
    gpu = _load_script()
    train_s = gpu.BUDGET_S - gpu.START_S - gpu.MEASURE_S
    # The step model's estimate affords Lee's 100 epochs; a measured rate a third of it, fewer.
    assert gpu.affordable_epochs(train_s, gpu.STEP_MODEL_IMAGES_PER_S, 50_000, 4) == 100 == gpu.MAX_EPOCHS
    assert gpu.affordable_epochs(train_s, gpu.STEP_MODEL_IMAGES_PER_S / 3, 50_000, 4) == 38
    assert gpu.affordable_epochs(1.0, 10.0, 50_000, 4) == 1  # never none
    assert "64,847" in gpu.__doc__ and f"{gpu.STEP_MODEL_IMAGES_PER_S:,}" == "64,847"  # the H100's column


def test_a_run_killed_in_training_has_written_its_trials_and_epochs_under_out(tmp_path):
    """The tables go under --out as the run goes: killed after its first epoch's table, the run has
    left every member's trials row ("running") and that epoch's rows, each file whole."""
    import signal
    import time as clock

    out = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--tiny", "--epochs", "8", "--out", str(out), "--storage",
                             str(tmp_path / "storage")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    epochs = out / "study_l_gpu" / "epochs"
    try:
        while proc.poll() is None and len(list(epochs.glob("*.parquet"))) < 4:  # every member's first epoch
            clock.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()[-2000:]  # still training: 8 epochs, then 20 snapshots
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    trials = tables.read_table(str(out), "study_l_gpu", "trials").to_pandas()
    assert len(trials) == 4 and set(trials["status"]) <= {"running", "finished"}
    rows = tables.read_table(str(out), "study_l_gpu", "epochs").to_pandas()
    assert set(rows["trial_id"]) == set(trials["trial_id"]) and (rows["epoch"] >= 1).all()


def test_the_budget_sizes_the_training_split_of_a_two_epoch_run():
    gpu = _load_script()
    # 300 s, 40,000 img/s measured (20,000 counted), 2 s a snapshot: 4 x 3 snapshots = 24 s, 60 s start
    assert gpu.images_for_budget(300, 40_000, 2.0, 2, 4) == 50_000  # all of it: 216 s x 20,000 / 8 = 540,000
    assert gpu.images_for_budget(100, 8_000, 1.0, 2, 4) == 14_000  # 28 s x 4,000 / 8
    assert gpu.images_for_budget(50, 8_000, 1.0, 2, 4) == 1_280  # nothing left: the minimum, ten steps
