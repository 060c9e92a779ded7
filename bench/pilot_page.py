"""docs/pilot/README.md and its figures, from the pilot's results (``sweeps/pilot.py``).

    vitsweep sweep pilot --data-root DIR --stage all --results results
    PYTHONPATH=. python3 bench/pilot_page.py --results results            # rewrites docs/pilot/

Every number on the page comes from the results' tables through the report's own code: the claims
and their tests from ``analysis.claims.evaluate_claims`` (the claim's test, its 95% interval, the
Holm-adjusted p, the minimum detectable effect, the precondition and the verdict), seed summaries
from ``analysis.seedstats``, the figures from ``analysis.figures`` (Study L's and the training-time
ones; each MAD figure draws the MAD of uniform attention as a dotted line). The page names the code
version(s) that trained the trials (the trials table's ``code_version``) and the one that wrote it.
Nothing here is edited by hand: rerun it after a new pilot run.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from analysis import canvas, figures, plotting  # noqa: E402
from analysis.claim_tests import MDE  # noqa: E402
from analysis.claims import evaluate_claims  # noqa: E402
from analysis.labels import protocol_label  # noqa: E402
from analysis.page import slug  # noqa: E402
from analysis.seedstats import INTERVAL, summarise  # noqa: E402
from analysis.study_data import StudyData  # noqa: E402
from analysis.uniform_attention import uniform_mad  # noqa: E402
from records.provenance import code_version  # noqa: E402

STUDY = "pilot"
SECTIONS = ("L", "T")
LEFT_UNIFORM = 0.02  # issue #35: attention has left uniform when the baseline's minimum MAD is this far below  # Study L's figures and the training-time ones; Study P left the pilot
STUDY_P_NEEDS = (
    "Study P's claims are **untestable at this scale**, and its five models (no PE, APE, sinusoidal, "
    "2-D RoPE, APE + RPT) are not in this pilot. Each of its claims needs a trained APE that has learned "
    "positions (the precondition \"APE frame\": dSSDC under RPI >= 0.10; the first pilot's 2-epoch APE "
    "stood at 0.001, the paper's at 0.47), and its fragility claims need Study P's setting: ViT-S at "
    "224 px on ImageNet-100, 60 epochs, where the paper's JPEG and blur severities mean what they say. "
    "What it would take: `vitsweep sweep study_p` on a GPU (5 models x 5 seeds, ~60 epochs of "
    "ImageNet-100; `vitsweep sweep study_p --dry-run` prints its GPU-hours), not a CPU.")

SMOKE_SCALE = (
    "The first pilot (code 73f43b5) trained a dim-96, depth-4 ViT for 2 epochs on a 5,000-image subset "
    "(78 optimiser steps, 39 of them warm-up), Study P's five models and Study L's four protocols, 3 seeds: "
    "test accuracy 25-28%, every head's MAD within 0.005 of uniform and the APE's dSSDC 0.001, so every "
    "claim was untestable at that scale. It showed the system running end to end on real images; it cost "
    "35 minutes, 45% of each epoch scoring the whole test split and half of it the analysis on one actor, "
    "the two costs this pilot removed (a 1,000-image subset per epoch, one actor per core).")


def cell(summary) -> str:
    """``mean [low, high]`` of a seed summary row (mean alone with one seed)."""
    if summary["n"] < 2 or not math.isfinite(summary["low"]):
        return f"{summary['mean']:.3f}"
    return f"{summary['mean']:.3f} [{summary['low']:.3f}, {summary['high']:.3f}]"


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}g}" if isinstance(value, float) and abs(value) < 1e-3 else (
        f"{value:.{digits}f}" if isinstance(value, float) else str(value))


def markdown(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v).replace("|", "/") for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def claims_section(data: StudyData) -> str:
    claims = evaluate_claims(data)
    rows = claims[(claims["paper"] == "Study L") & (claims["verdict"] != "no data")]
    table = pd.DataFrame({
        "claim": rows["claim"], "A vs B": rows["A"] + " vs " + rows["B"], "n A / B": rows["n A"].astype(str) + " / "
        + rows["n B"].astype(str), "mean A": rows["mean A"].map(fmt), "mean B": rows["mean B"].map(fmt),
        "effect A - B [95% CI]": [f"{fmt(e)} {ci or ''}" for e, ci in zip(rows["effect (A - B)"],
                                                                        rows["95% CI of effect"])],
        "test": rows["test"], "p (Holm)": rows["p (Holm)"].map(fmt), "MDE (80% power)": rows[MDE].map(fmt),
        "verdict": rows["verdict"] + rows["power"].map(lambda m: f" ({m})" if m else ""),
    })
    absent = claims[(claims["paper"] == "Study L") & (claims["verdict"] == "no data")]["claim"].tolist()
    preconditions = sorted({p for p in rows["precondition"].dropna()})
    parts = [markdown(table), ""]
    parts += [f"Precondition: {p}." for p in preconditions]
    if absent:
        parts += ["", "No data in this pilot (a protocol it did not train): " + "; ".join(absent) + "."]
    parts += ["", f"Each claim's test as the report runs it (`analysis.claims`): paired by seed, the "
                  f"{INTERVAL} of the effect, p Holm-adjusted within Study L, a directional verdict only where "
                  "the exact sign-flip test can reach p < 0.05 (5 pairs or more), the minimum detectable effect "
                  "at 80% power at the alpha of the row's Holm step, and, while the baseline's attention is within "
                  "0.05 of uniform (the precondition \"local heads\"), a reading aid beside the verdict, never "
                  "in its place."]
    return "\n".join(parts)


def emergence_section(data: StudyData) -> str:
    heads = data.local_heads(final=False)
    if heads.empty:
        return "No MAD was measured."
    per = heads.groupby(["trial_id", "protocol", "checkpoint_epoch"])["value"].min().reset_index()
    s = summarise(per, ["protocol", "checkpoint_epoch"])
    epochs = sorted({int(e) for e in s["checkpoint_epoch"]})
    rows = []
    for protocol, g in s.groupby("protocol"):
        by = {int(e): r for e, r in zip(g["checkpoint_epoch"], g.to_dict("records"))}
        rows.append({"protocol": protocol_label(protocol), "n": int(g["n"].max()),
                     **{f"epoch {e}": cell(by[e]) if e in by else "—" for e in epochs}})
    table = markdown(pd.DataFrame(rows))
    base = s[(s["protocol"] == "baseline") & (s["checkpoint_epoch"] == max(epochs))]
    if base.empty:
        return table
    grid = int(data.trials["img_size"].iloc[0] // data.trials["patch_size"].iloc[0])
    below = uniform_mad(grid) - float(base["mean"].iloc[0])
    return (f"{table}\n\nThe baseline's minimum MAD at the last snapshot (epoch {max(epochs)}) lies {below:.3f} below "
            f"uniform attention ({'at least' if below >= LEFT_UNIFORM else 'less than'} the {LEFT_UNIFORM} this pilot "
            "was sized to reach).")


def accuracy_section(data: StudyData) -> str:
    t = data.per_trial
    rows = []
    for protocol, g in t.groupby("protocol"):
        s = summarise(g.assign(value=g["test_acc"]), ["protocol"]).iloc[0]
        rows.append({"protocol": protocol_label(protocol), "n": int(s["n"]),
                     "test accuracy (whole test split)": cell(s)})
    return markdown(pd.DataFrame(rows))


def run_section(data: StudyData) -> list[str]:
    raw, e, m = data.raw_trials, data.epochs, data.measurements
    versions = sorted(raw["code_version"].dropna().unique()) if "code_version" in raw else []
    finished = int((raw["status"] == "finished").sum()) if "status" in raw else 0
    lines = [f"- Trials: {finished} finished of {len(raw)}; code version {', '.join(versions) or 'unknown'} "
             f"(the trials table's `code_version`; this page written by {code_version()})."]
    if "started_at" in raw and raw["started_at"].notna().any():
        span = (raw["ended_at"].max() - raw["started_at"].min()).total_seconds() / 60
        lines.append(f"- Training: {raw['started_at'].min():%Y-%m-%d %H:%M} to {raw['ended_at'].max():%H:%M} UTC "
                     f"({span:.0f} min); per trial {raw['wall_time_s'].min() / 60:.1f}-"
                     f"{raw['wall_time_s'].max() / 60:.1f} min of training loop.")
    if "eval_images" in e and e["eval_images"].notna().any():
        last = e["epoch"] == e.groupby("trial_id")["epoch"].transform("max")

        def sizes(rows) -> str:
            return ", ".join(map(str, sorted(rows["eval_images"].dropna().astype(int).unique()))) or "—"

        lines.append(f"- Scored each epoch on {sizes(e[~last])} test images, after the last on {sizes(e[last])}.")
    if not m.empty:
        lines.append(f"- Measured: {m.groupby(['trial_id', 'checkpoint_epoch']).ngroups} checkpoints (epochs "
                     f"{', '.join(map(str, sorted({int(x) for x in m['checkpoint_epoch']})))}) on "
                     f"{', '.join(map(str, sorted({int(x) for x in m['n_images'].dropna()})))} test images each.")
    return lines


def draw_figures(data: StudyData, out: Path) -> list[str]:
    """Every Study L and training-time figure as a PNG in ``out``: its Markdown (or why it is absent)."""
    for old in out.glob("*.png"):
        old.unlink()
    parts = []
    for section, title, draw in figures.FIGURES:
        if section not in SECTIONS:
            continue
        try:
            plots = draw(data)
        except plotting.NoData as missing:
            parts.append(f"*{title}: omitted ({missing}).*")
            continue
        for plot in plots:
            name = f"{slug(plot.title)}.png"
            (out / name).write_bytes(canvas.render_png(plot.figure))
            parts.append(f"![{plot.title}]({name})\n\n{plot.caption}")
    return parts


def training_images(t) -> str:
    cap = int(t.get("max_train_images") or 0)
    return f"a class-stratified {cap:,} training images" if cap else "every training image"


def render(data: StudyData, out: Path) -> str:
    grid = int(data.trials["img_size"].iloc[0] // data.trials["patch_size"].iloc[0])
    t = data.trials.iloc[0]
    return "\n".join([
        "# Pilot II: Study L's headline on all of CIFAR-10, at CPU scale",
        "",
        "*Written by `bench/pilot_page.py` from the pilot's results; do not edit by hand.*",
        "",
        f"A {int(t['depth'])}-block, dim-{int(t['dim'])}, {int(t['heads'])}-head ViT (8x8 patches of 4 px), "
        f"trained {int(t['epochs'])} epochs on {training_images(t)} of `{Path(str(t['data_root'])).name}` under Lee "
        "et al.'s recipe "
        "(`sweeps/pilot.py`: AdamW lr 1e-3, wd 0.05 on every parameter, pad-4 crop + flip, CutMix on half the "
        "batches, batch 128, 1 warm-up epoch then cosine), baseline vs CutMix, paired by seed. This is far "
        "below Study L's scale (2.4M parameters, 100 epochs, CIFAR-100): the question here is whether the "
        "direction of its headline shows once attention has left uniform.",
        "",
        f"**Uniform attention** on the {grid} x {grid} grid has MAD **{uniform_mad(grid):.3f}**; every MAD "
        "below stands beside it, and every MAD figure draws it as a dotted line.",
        "",
        "## What ran",
        "",
        "```",
        "vitsweep sweep pilot --data-root $DATA/cifar10-jpeg --stage all --results results",
        "PYTHONPATH=. python3 bench/pilot_page.py --results results",
        "```",
        "",
        *run_section(data),
        "",
        "## Study L's claims",
        "",
        claims_section(data),
        "",
        "## Emergence: minimum MAD over the snapshot epochs",
        "",
        f"Minimum over layers and heads (CLS sinks left out) per trial, then mean [{INTERVAL}] over seeds; "
        f"epoch 0 is the untrained model; uniform attention {uniform_mad(grid):.3f}.",
        "",
        emergence_section(data),
        "",
        "## Accuracy",
        "",
        accuracy_section(data),
        "",
        "## Study P",
        "",
        STUDY_P_NEEDS,
        "",
        "## The first pilot, at smoke scale",
        "",
        SMOKE_SCALE,
        "",
        "## Figures",
        "",
        *[p + "\n" for p in draw_figures(data, out)],
    ]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results", help="the pilot's results folder (default ./results)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "pilot"), help="the page's folder (default docs/pilot)")
    args = parser.parse_args(argv)
    data = StudyData.load(args.results, STUDY)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "README.md"
    page.write_text(render(data, out), encoding="utf-8")
    print(page)
    return page


if __name__ == "__main__":
    main()
