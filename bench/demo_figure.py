"""The README's figure, docs/demo_training_curves.png, and the data it draws, docs/demo_training_curves.csv.

    make demo && make demo-figure                  # both, from the demo's tables (results/demo)
    python3 bench/demo_figure.py --results DIR     # the same from another results folder
    python3 bench/demo_figure.py                   # the PNG again from the CSV alone

The figure is the report's "Training curves" figure (``analysis.reporting.figures_l.training_curves``) of the
demo. The CSV holds what it draws, one row per trial and epoch, under the demo's own column names:
each trial's factors (``COLUMNS[:6]``, from its trials table) and accuracy after each epoch (the rest,
from its epochs table). ``tests/test_demo_figure.py`` redraws the PNG from the CSV and checks its columns.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from analysis.measuring import canvas  # noqa: E402
from analysis.reporting.figures_l import training_curves  # noqa: E402
from analysis.statistics.study_data import StudyData  # noqa: E402

STUDY = "demo"
COLUMNS = ("trial_id", "dataset", "pe", "rpt", "protocol", "seed", "epoch", "eval_acc", "train_acc")
FACTORS = COLUMNS[:6]
CSV = ROOT / "docs" / "demo_training_curves.csv"
PNG = ROOT / "docs" / "demo_training_curves.png"


def extract(results: str) -> pd.DataFrame:
    """The figure's data from a demo's results folder: its finished trials' factors and epochs."""
    data = StudyData.load(results, STUDY)
    if data.epochs.empty:
        raise SystemExit(f"no epochs of study {STUDY!r} under {results!r}: run `make demo` (or `vitsweep demo "
                         f"--results {results}`) first")
    frame = data.epochs[list(COLUMNS)].sort_values(["trial_id", "epoch"]).reset_index(drop=True)
    return frame.round({"eval_acc": 6, "train_acc": 6})


def draw(frame: pd.DataFrame) -> bytes:
    """The PNG of the report's training-curves figure of these rows, drawn by the report's own code."""
    trials = frame[list(FACTORS)].drop_duplicates("trial_id").assign(status="finished")
    data = StudyData.from_frames(STUDY, trials, frame[["trial_id", *COLUMNS[len(FACTORS):]]], pd.DataFrame())
    (plot,) = training_curves(data)
    return canvas.render_png(plot.figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", help="a demo's results folder: write the CSV from it first")
    args = parser.parse_args(argv)
    if args.results:
        extract(args.results).to_csv(CSV, index=False)
        print(f"wrote {CSV.relative_to(ROOT)}")
    PNG.write_bytes(draw(pd.read_csv(CSV)))
    print(f"wrote {PNG.relative_to(ROOT)} ({PNG.stat().st_size / 1000:.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
