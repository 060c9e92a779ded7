"""bench/gpu_study_l.py's CPU mode: the first GPU run's code end to end at a tiny size, without Ray,
MLflow or Optuna, writing the tables `vitsweep report` builds Study L's report from."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

from analysis.claims import SINKS_KEPT_MARK
from analysis.report import build_report
from records import tables

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_study_l.py"


def _load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_study_l", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_the_tables_vitsweep_report_reads(tmp_path):
    out = tmp_path / "results"
    probe = ("import sys, runpy; sys.argv = ['gpu_study_l', '--tiny', '--out', " + repr(str(out)) + "]; "
             "runpy.run_path(" + repr(str(SCRIPT)) + ", run_name='__main__'); "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'optuna')); "
             "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vitsweep report study_l_gpu --results" in done.stdout

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
    assert gpu.affordable_epochs(train_s, gpu.STEP_MODEL_IMAGES_PER_S / 3, 50_000, 4) == 37
    assert gpu.affordable_epochs(1.0, 10.0, 50_000, 4) == 1  # never none
    assert "62,161" in gpu.__doc__ and f"{gpu.STEP_MODEL_IMAGES_PER_S:,}" == "62,161"
