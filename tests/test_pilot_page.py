"""docs/pilot/README.md is generated from the pilot's tables (bench/pilot_page.py): Study L's claims
with the project's own test, interval, MDE and verdict; the emergence table over snapshot epochs; the
figures, each MAD figure with the uniform-attention level; the code version; Study P as untestable."""

import datetime
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from records import tables
from sweeps import pilot
from trainables.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = (0, 1, 2, 4, 5)


def _page_module():
    spec = importlib.util.spec_from_file_location("pilot_page", ROOT / "bench" / "pilot_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_pilot(results: str, cutmix_drop: float) -> None:
    """A finished pilot's tables: 2 protocols x 5 seeds; the minimum MAD falls from uniform over the
    snapshots, CutMix's by ``cutmix_drop`` more than the baseline's at the last (seed noise 0.005)."""
    rng = np.random.default_rng(0)
    start = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.timezone.utc)
    for protocol in pilot.PROTOCOLS:
        for seed in range(5):
            cfg = RunConfig.for_dataset("cifar10", preset="tiny", study="pilot", protocol=protocol, seed=seed,
                                        **pilot.RECIPE, epochs=pilot.EPOCHS)
            acc = 0.55 + rng.normal(0, 0.005)
            tables.write_trial(results, "pilot", cfg.to_flat(), {
                "trial_id": cfg.trial_id, "study": "pilot", "status": "finished", "epochs_completed": 5,
                "eval_acc": acc, "test_acc": acc, "did_not_learn": False, "wall_time_s": 600.0,
                "code_version": "abc1234", "started_at": start, "ended_at": start + datetime.timedelta(minutes=50)})
            tables.write_epochs(results, "pilot", cfg.trial_id, [
                {"epoch": e, "train_loss": 2.0 / e, "train_acc": 0.1 * e, "eval_loss": 2.0 / e, "eval_acc": 0.1 * e,
                 "eval_images": 10_000 if e == 5 else 1_000, "lr": 1e-3, "images_per_s": 450.0,
                 "wall_time_s": 120.0 * e} for e in range(1, 6)])
            for epoch in SNAPSHOTS:
                low = 0.418 - 0.012 * epoch - (cutmix_drop * epoch / 5 if protocol == "cutmix" else 0)
                rows = [{"intervention": "clean", "level": None, "layer": None, "head_index": None, "metric": "acc",
                         "value": 0.1 * epoch, "n_images": 500}]
                for layer in range(4):
                    for head in range(4):
                        mad = low + rng.normal(0, 0.005) + 0.01 * (layer + head)
                        rows += [{"intervention": "clean", "level": None, "layer": layer, "head_index": head,
                                  "metric": metric, "value": value, "n_images": 500}
                                 for metric, value in (("mad", mad), ("entropy", 3.5), ("cls_mass", 0.05))]
                tables.write_measurements(results, "pilot", cfg.trial_id, epoch, rows)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    results = str(tmp_path_factory.mktemp("results"))
    _write_pilot(results, cutmix_drop=0.05)
    out = tmp_path_factory.mktemp("docs_pilot")
    (out / "stale-figure.png").write_bytes(b"old")
    return _page_module().main(["--results", results, "--out", str(out)])


def test_page_states_study_l_claims_with_the_projects_tests(page):
    text = page.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| CutMix alone lowers minimum MAD"))
    # 5 paired seeds, CutMix ~0.05 lower, the baseline 0.06 below uniform: the precondition holds and it decides.
    assert "5 / 5" in row and "paired" in row and row.rstrip(" |").endswith("supported")
    assert "(-∞, " in row  # the effect's one-sided interval
    assert "local heads: baseline's minimum MAD" in text and ": met." in text
    assert "MDE (80% power)" in text and "p (Holm)" in text
    assert "AutoAugment alone leaves minimum MAD at baseline" in text.split("No data in this pilot")[1]


def test_page_has_the_emergence_table_over_every_snapshot_epoch(page):
    text = page.read_text()
    section = text.split("## Emergence")[1].split("## Accuracy")[0]
    header = next(line for line in section.splitlines() if line.startswith("| protocol"))
    assert header == "| protocol | n | " + " | ".join(f"epoch {e}" for e in SNAPSHOTS) + " |"
    assert "uniform attention 0.418" in section
    assert "(epoch 5) lies 0.062 below uniform attention (at least the 0.02" in section
    body = [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| protocol", "| ---"))]
    assert len(body) == 2  # baseline and CutMix


def test_page_draws_the_figures_with_the_uniform_level_and_names_the_code_version(page):
    text = page.read_text()
    assert "code version abc1234" in text and "Scored each epoch on 1000 test images, after the last on 10000" in text
    assert not (page.parent / "stale-figure.png").exists()  # a rerun leaves only its own figures
    images = [line.rsplit("](", 1)[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert images and all((page.parent / name).exists() for name in images)
    assert any("emergence" in name for name in images)
    mad_captions = [part for part in text.split("![")[1:] if "MAD" in part.split("]")[0]]
    assert mad_captions and all("uniform attention" in part for part in mad_captions)
    assert "Study P's claims are **untestable at this scale**" in text
