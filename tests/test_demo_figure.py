"""The README's figure (docs/demo_training_curves.png) is drawn by bench/demo_figure.py from the data file
beside it: the data are the demo's own columns, and the figure redraws from them alone (about 1 s)."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from conftest import load_script
from PIL import Image

from records.schema import EPOCHS
from sweeps.studies import demo
from trainables.config.run_config import RunConfig

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script(ROOT / "bench" / "demo_figure.py")


def test_the_data_file_has_the_columns_the_demo_writes_one_row_per_trial_and_epoch():
    demo_figure = _module()
    frame = pd.read_csv(demo_figure.CSV)
    assert tuple(frame.columns) == demo_figure.COLUMNS
    # A trial's factors are run-config fields (the trials table's columns); the curves the epochs table's.
    assert set(demo_figure.FACTORS) - {"trial_id"} <= set(RunConfig().to_flat())
    assert set(demo_figure.COLUMNS[len(demo_figure.FACTORS):]) | {"trial_id"} <= set(EPOCHS.names)
    # Today's demo: its conditions and seeds (not its trial ids, which hash every recipe value), every epoch.
    flat = [c.to_flat() for c in demo.trials(demo.DEFAULTS)]
    planned = {(f["dataset"], f["pe"], bool(f["rpt"]), f["protocol"], f["seed"]) for f in flat}
    trials = frame.drop_duplicates("trial_id")
    factors = zip(trials["dataset"], trials["pe"], trials["rpt"].astype(bool), trials["protocol"], trials["seed"])
    assert set(factors) == planned
    assert len(trials) == len(planned) and len(frame) == len(planned) * demo.DEFAULTS.epochs
    assert frame["eval_acc"].between(0, 1).all() and not frame.duplicated(["trial_id", "epoch"]).any()


def test_the_figure_redraws_from_the_data_file_at_the_committed_size():
    demo_figure = _module()
    png = demo_figure.draw(pd.read_csv(demo_figure.CSV))
    redrawn, committed = Image.open(io.BytesIO(png)), Image.open(demo_figure.PNG)
    assert redrawn.format == committed.format == "PNG" and redrawn.size == committed.size
    assert demo_figure.PNG.stat().st_size < 150_000
