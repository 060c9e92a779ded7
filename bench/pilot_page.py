"""docs/pilot/README.md and its figures, from the pilot's results (``sweeps/studies/pilot.py``), and the pilot's tables
kept beside it so the page can be rebuilt without the results.

    vitsweep sweep pilot --data-root DIR --stage all --results results
    PYTHONPATH=. python3 bench/pilot_page.py --results results  # tables kept in docs/pilot/tables/, then the page
    PYTHONPATH=. python3 bench/pilot_page.py                    # the page again from docs/pilot/tables/ alone

With ``--results`` the pilot's trials, epochs and measurements tables (Parquet, no checkpoints) are copied into
``<out>/tables/`` with ``run.json`` (the commit that ran the trials and the commit that registered the claims it
tests); the page is then written from those kept tables only, so a rebuild from them gives the same text
(``tests/test_pilot_page.py`` compares it with the committed page once the run has kept its tables).

Every number comes from the kept tables through the report's own code: the claims and their tests from
``analysis.statistics.claims.evaluate_claims`` (the test, both intervals, the Holm-adjusted p and its family's size, the
minimum detectable effect at the verdict's alpha, the precondition beside the verdict), the per-layer tables from
``analysis.reporting.condition_tables.layer_tables`` at every snapshot, seed summaries from
``analysis.statistics.seedstats``, the figures from ``analysis.reporting.figures`` (Study L's and the training-time
ones; each MAD figure draws the MAD of uniform attention as a dotted line). Nothing on the page is edited by hand: rerun
it after a new pilot run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# noqa: E402 below: these imports follow the sys.path line above, which puts the repo root (analysis/) on the path
import pandas as pd  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from analysis.measuring import canvas  # noqa: E402
from analysis.measuring.uniform_attention import uniform_mad  # noqa: E402
from analysis.reporting import figures, plotting  # noqa: E402
from analysis.reporting.condition_tables import layer_tables  # noqa: E402
from analysis.reporting.page import slug  # noqa: E402
from analysis.statistics.claim_tests import (  # noqa: E402
    HOLM_FAMILY,
    MAD_BELOW_UNIFORM,
    MDE,
    NOT_MET,
    OPPOSITE,
    STEP_ALPHA,
    TWO_SIDED,
)
from analysis.statistics.claims import CLAIMS, MARGINS, SINKS_KEPT_MARK, evaluate_claims  # noqa: E402
from analysis.statistics.labels import protocol_label  # noqa: E402
from analysis.statistics.seedstats import INTERVAL, mde, summarise  # noqa: E402
from analysis.statistics.study_data import LOADED, StudyData  # noqa: E402
from records import tables  # noqa: E402

STUDY = "pilot"
SECTIONS = ("L", "T")  # Study L's figures and the training-time ones; Study P left the pilot
KEPT = "tables"  # the kept tables' folder beside the page
RUN = "run.json"
# where the claims and their tests are registered
CLAIM_CODE = ("analysis/statistics/claims.py", "analysis/statistics/claim_tests.py")
LIMIT = 1_000_000  # bytes: the page, its figures and the kept tables together
MAX_SEEDS = 200  # the most seeds a "what it would take" line names; beyond: "more than"

# What `cifar10-jpeg` is (../shared/data/README.md); any other folder is named as it is.
DATA_RECIPES = {
    "cifar10-jpeg": (
        "`cifar10-jpeg`: all of CIFAR-10, 50,000 training and 10,000 test images (32 x 32 RGB, 10 classes, the "
        "official labels and in-class order), each stored once as JPEG quality 75 (4:2:0) by its publisher, so "
        "pixels differ slightly from the original (PSNR ~30 dB) and accuracies are not exactly comparable with "
        "published CIFAR-10 numbers. Read as data set `folder` (`train/<class>/`, `test/<class>/`), decoded once "
        "into memory."),
}

EARLIER = (
    "- Pilot I (code 73f43b5): a dim-96 ViT, 2 epochs on 5,000 images, Study P's five models and Study L's four "
    "protocols, 3 seeds: accuracy 25-28%, every head within 0.005 of uniform attention: every claim untestable.",
    "- Pilot II (code 69da62b): this model, every training image, 5 epochs, CutMix on half the batches, 5 seeds: "
    "the baseline's minimum MAD 0.389 (0.029 below uniform), CutMix's 0.005 above it (opposite to the claim; "
    "one-sided bound 0.010, MDE 0.007); its results were not kept.",
)

STUDY_P = (
    "Study P's claims need its five models (no PE, APE, sinusoidal, 2-D RoPE, APE + RPT) at its setting (ViT-S, "
    "224 px, ImageNet-100, 60 epochs): `vitsweep sweep study_p` on a GPU, not this CPU pilot.")


# -- kept tables ----------------------------------------------------------------------------------
def keep_tables(results: str, out: Path) -> Path:
    """Copy the pilot's trials, epochs and measurements tables (the columns ``StudyData.load`` reads) from
    ``results`` into ``out/tables/`` as one zstd Parquet file each, with ``run.json``; returns the folder."""
    kept = out / KEPT
    kept.mkdir(parents=True, exist_ok=True)
    for name, columns in LOADED.items():
        table = tables.read_table(results, STUDY, name, columns)
        if table is None or table.num_rows == 0:
            raise ValueError(f"the pilot's {name} table under {results!r} is missing or empty: run "
                             f"`vitsweep sweep pilot --stage all --results {results}` first")
        pq.write_table(table, kept / f"{name}.parquet", compression="zstd")
    versions = sorted(set(pq.read_table(kept / "trials.parquet", columns=["code_version"])
                          .column("code_version").drop_null().to_pylist()))
    run = {"ran": versions, "claims_registered": sorted({registered(v) for v in versions})}
    (kept / RUN).write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    return kept


def registered(version: str) -> str:
    """The last commit at or before ``version`` (a trials row's ``code_version``) that changed the claims or
    their tests (``CLAIM_CODE``): the one that registered what the run tests; "unknown" without git history."""
    commit = version.removesuffix("-dirty")
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h", commit, "--", *CLAIM_CODE],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def load_kept(kept: Path) -> tuple[StudyData, dict]:
    """The pilot's ``StudyData`` and run record from its kept tables alone."""
    missing = [n for n in (*LOADED, RUN) if not (kept / (n if n == RUN else f"{n}.parquet")).exists()]
    if missing:
        raise FileNotFoundError(f"no kept pilot tables in {kept} (missing: {', '.join(missing)}): write them with "
                                "`bench/pilot_page.py --results DIR` after a pilot run")
    frames = {n: pq.read_table(kept / f"{n}.parquet").to_pandas() for n in LOADED}
    data = StudyData.from_frames(STUDY, frames["trials"], frames["epochs"], frames["measurements"])
    return data, json.loads((kept / RUN).read_text(encoding="utf-8"))


# -- formatting -----------------------------------------------------------------------------------
def cell(summary) -> str:
    """``mean [low, high]`` of a seed summary row (mean alone with one seed)."""
    if summary["n"] < 2 or not math.isfinite(summary["low"]):
        return f"{summary['mean']:.3f}"
    return f"{summary['mean']:.3f} [{summary['low']:.3f}, {summary['high']:.3f}]"


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if 0 < abs(value) < 1e-3 else f"{value:.{digits}f}"
    return str(value)


def markdown(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v).replace("|", "/") for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def grid_of(data: StudyData) -> int:
    t = data.trials.iloc[0]
    return int(t["img_size"] // t["patch_size"])


# -- Study L's claims ---------------------------------------------------------------------------
def claim_rows(data: StudyData) -> pd.DataFrame:
    """Study L's claims that this pilot's arms can test, with the size of each row's Holm family
    (``claim_tests.HOLM_FAMILY``: its paper and data set's rows with a p; 0 for a row without a test)."""
    claims = evaluate_claims(data)
    rows = claims[(claims["paper"] == "Study L") & (claims["verdict"] != "no data")].copy()
    rows["family"] = rows[HOLM_FAMILY].astype(int)  # a sinks-kept repeat: its row's family, read at its row's step
    rows["sinks kept"] = rows["setting"].fillna("").str.contains(SINKS_KEPT_MARK, regex=False)
    return rows


def _claim(text: str):
    return next(c for c in CLAIMS if c.text == text)


def _whose(label: str, metric: str, first: bool) -> str:
    if label.startswith(("with ", "without ")):
        return f"the {metric} of the runs {label}" if first else f"that of the runs {label}"
    name = "the baseline" if label == "baseline" else label
    return f"{name}'s {metric}" if first else f"{name}'s"


def direction(row: dict) -> str:
    """The measured direction in words: ``CutMix's minimum MAD ran 0.005 ABOVE the baseline's, opposite to the
    claim``; for a claim of no effect, the margin it is read against."""
    claim, effect = _claim(row["claim"]), row["effect (A - B)"]
    if not math.isfinite(effect):
        return "no effect estimate"
    metric = row["metric"]
    head = _whose(row["A"], metric, True)
    if effect == 0:
        said = f"{head} equalled {_whose(row['B'], metric, False)}"
    else:
        said = f"{head} ran {fmt(abs(effect))} {'ABOVE' if effect > 0 else 'BELOW'} {_whose(row['B'], metric, False)}"
    said = said[0].upper() + said[1:]
    if claim.alternative == "two-sided":
        return f"{said} (a claim of no effect: within ±{claim.margin:g})"
    wanted = effect < 0 if claim.alternative == "less" else effect > 0
    return f"{said}, {'as the claim says' if wanted else 'opposite to the claim' if effect else 'no difference'}"


def _effect_se(row: dict, claim) -> float:
    """The standard error of the row's effect, from its MDE at the verdict's alpha (the MDE is linear in it)."""
    df = row["n pairs"] - 1 if row["n pairs"] else math.nan
    unit = mde(1.0, df, claim.alternative, alpha=row[STEP_ALPHA])
    return row[MDE] / unit if unit and math.isfinite(unit) else math.nan


def scale_needed(row: dict) -> str:
    """What it would take to detect an effect the size of the claim's margin (the smallest effect this project
    counts) with 80% power at the row's verdict's alpha: the paired seeds at this spread of the paired
    differences (up to ``MAX_SEEDS``)."""
    claim = _claim(row["claim"])
    se, n, target = _effect_se(row, claim), row["n pairs"], MARGINS[claim.metric]
    if not (n and math.isfinite(se)):
        return f"with {n} pair(s) the spread is unknown, so no seed count can be said for an effect of {target:g}"
    sd = se * math.sqrt(n)
    for k in range(2, MAX_SEEDS + 1):
        if mde(sd / math.sqrt(k), k - 1, claim.alternative, alpha=row[STEP_ALPHA]) <= target:
            return f"{k} paired seeds at this spread would detect an effect of {target:g} (the claim's margin)"
    return f"more than {MAX_SEEDS} paired seeds at this spread would be needed for an effect of {target:g} (the margin)"


def excludes(row: dict) -> str:
    """What the two-sided interval excludes, in the claim's own direction."""
    claim, (low, high) = _claim(row["claim"]), _bounds(row[TWO_SIDED])
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval (no spread)"
    if claim.alternative == "less":
        said = f"a fall of more than {-low:.3f}" if low < 0 else "any fall at all (the interval lies at or above 0)"
    elif claim.alternative == "greater":
        said = f"a rise of more than {high:.3f}" if high > 0 else "any rise at all (the interval lies at or below 0)"
    else:
        said = f"effects outside [{low:.3f}, {high:.3f}]"
    return f"the two-sided 95% interval {row[TWO_SIDED]} excludes {said}"


def _bounds(text: str | None) -> tuple[float, float]:
    if not text:
        return math.nan, math.nan
    low, high = text.strip("[]()").split(", ")
    return float(low.replace("-∞", "-inf")), float(high.replace("∞", "inf"))


def claims_section(data: StudyData) -> str:
    rows = claim_rows(data)
    if rows.empty:
        return "No Study L claim has both of its groups in this pilot."
    records = rows.to_dict("records")
    said = [r["precondition"] if isinstance(r["precondition"], str) else None for r in records]  # NaN: none
    table = pd.DataFrame({
        "claim": [r["claim"] + (" (CLS sinks kept)" if r["sinks kept"] else "") for r in records],
        "A vs B": [f"{r['A']} vs {r['B']}" for r in records],
        "pairs": [r["n pairs"] for r in records],
        "mean A": [fmt(r["mean A"]) for r in records],
        "mean B": [fmt(r["mean B"]) for r in records],
        "effect A - B": [fmt(r["effect (A - B)"]) for r in records],
        "95% CI (two-sided)": [r[TWO_SIDED] or "—" for r in records],
        "95% CI (the test's, one-sided)": [r["95% CI of effect"] or "—" for r in records],
        "p (Holm) [family]": [f"{fmt(r['p (Holm)'])} [outside; at its row's step]" if r["sinks kept"] else
                              f"{fmt(r['p (Holm)'])} [of {r['family']}]" if r["family"] else "— (no test)"
                              for r in records],
        MDE: [f"{fmt(r[MDE])} (alpha {fmt(r[STEP_ALPHA], 4)})" for r in records],
        "verdict": [r["verdict"] + (f" ({r['power']})" if r["power"] else "") for r in records],
        "precondition": [("⚠ " + NOT_MET) if r["reading aid"] else ("met" if p else "—")
                         for r, p in zip(records, said)],
    })
    tests = sorted({r["test"] for r in records})
    parts = [markdown(table), "", "In words (mean of the paired differences over seeds):", ""]
    parts += [f"- {r['claim']}{' (CLS sinks kept)' if r['sinks kept'] else ''}: {direction(r)}." for r in records]
    parts += ["", "Tests: " + "; ".join(tests) + "."]
    parts += [f"Precondition: {p}." for p in sorted(set(filter(None, said)))]
    parts += ["", "Each row as the report tests it (`analysis.statistics.claims`): paired by seed; the one-sided 95% "
                  "t interval is the test's, the two-sided one stands beside it so an estimate in the wrong direction "
                  "shows; p is Holm-adjusted within Study L on this data set (family: the rows with a p, the "
                  "CLS-sinks-kept repeat outside it); a directional verdict needs 5 pairs or more (the exact "
                  "sign-flip test's reach); the MDE (80% power) is at the alpha of the row's Holm step; a "
                  "precondition is a mark beside the verdict, never in its place."]
    return "\n".join(parts)


def result_section(data: StudyData) -> str:
    """The result in plain words: supported claims, or that the effect is not there, what the data exclude and
    what it would take."""
    rows = claim_rows(data)
    rows = rows[~rows["sinks kept"]]
    if rows.empty:
        return "No Study L claim could be tested."
    records = rows.to_dict("records")
    held = [r for r in records if r["verdict"] == "supported"]
    missed = [r for r in records if r["verdict"] in ("not supported", OPPOSITE)]
    open_ = [r for r in records if r not in held and r not in missed]  # not enough seeds: no verdict either way
    lines = []
    if held:
        lines.append("Supported at this scale: " + "; ".join(f"{r['claim']} (p Holm {fmt(r['p (Holm)'])})"
                                                             for r in held) + ".")
    for group, said in ((missed, ("Study L's effect is **not there** at this scale" if not held else "Not found")
                                 + f" for {len(missed)} of the {len(records)} claims tested:"),
                        (open_, f"Undecided for {len(open_)} of the {len(records)} claims tested:")):
        if not group:
            continue
        lines += [said, ""]
        lines += [f"- {r['claim']}: {r['verdict']}. {direction(r)}; {excludes(r)}; {scale_needed(r)}." for r in group]
        lines.append("")
    unmet = sorted({r["precondition"] for r in records if r["reading aid"]})
    if unmet:
        lines += [f"Beside the verdicts, {'; '.join(unmet)}: the baseline's heads have not left uniform "
                      f"attention by the {MAD_BELOW_UNIFORM} the minimum-MAD claims presuppose. Study L made its "
                      "claims at its own scale: a 2.4M-parameter ViT trained 100 epochs on CIFAR-100 (`vitsweep sweep "
                      "study_l`, a GPU run)."]
    return "\n".join(lines).rstrip()


# -- attention over training -------------------------------------------------------------------
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
    uniform = uniform_mad(grid_of(data))
    value = float(base["mean"].iloc[0])
    below = uniform - value
    said = (f"The baseline's minimum MAD at the last snapshot (epoch {max(epochs)}) is {value:.3f}, {below:.3f} "
            f"below uniform attention ({uniform:.3f}): ")
    if below >= MAD_BELOW_UNIFORM:
        said += f"at least the {MAD_BELOW_UNIFORM} the claims' precondition \"local heads\" asks."
    else:
        said += (f"{MAD_BELOW_UNIFORM - below:.3f} short of the {MAD_BELOW_UNIFORM} the claims' precondition "
                 "\"local heads\" asks.")
    return f"{table}\n\n{said}"


def layer_section(data: StudyData) -> str:
    """The per-layer MAD and entropy table (``layer_tables``) at every measured snapshot."""
    m = data.measurements
    if m.empty:
        return "No attention was measured."
    parts = []
    for epoch in sorted({int(e) for e in m["checkpoint_epoch"]}):
        at = dataclasses.replace(data, measurements=m[m["checkpoint_epoch"] == epoch])
        for _dataset, table, setting in layer_tables(at):
            parts += [f"### Epoch {epoch}" + (" (untrained)" if epoch == 0 else ""), "",
                      markdown(table) + (f"\n\nOther factors: {setting}." if setting else ""), ""]
    return "\n".join(parts).rstrip() or "No per-layer attention rows."


def accuracy_section(data: StudyData) -> str:
    t = data.per_trial
    rows = []
    for protocol, g in t.groupby("protocol"):
        s = summarise(g.assign(value=g["test_acc"]), ["protocol"]).iloc[0]
        rows.append({"protocol": protocol_label(protocol), "n": int(s["n"]),
                     f"test accuracy, whole test split [{INTERVAL}]": cell(s)})
    return markdown(pd.DataFrame(rows))


# -- the run -------------------------------------------------------------------------------------
def run_section(data: StudyData, run: dict) -> list[str]:
    raw, e, m = data.raw_trials, data.epochs, data.measurements
    finished = int((raw["status"] == "finished").sum()) if "status" in raw else 0
    lines = [f"- Trials: {finished} finished of {len(raw)}.",
             f"- Code: the trials ran at {', '.join(run['ran']) or 'unknown'} (the trials table's `code_version`); "
             f"the claims they test were registered at {', '.join(run['claims_registered']) or 'unknown'} (the last "
             "commit before the run to change the claims or their tests)."]
    if "started_at" in raw and raw["started_at"].notna().any():
        span = (raw["ended_at"].max() - raw["started_at"].min()).total_seconds() / 60
        lines.append(f"- Training: {raw['started_at'].min():%Y-%m-%d %H:%M} to {raw['ended_at'].max():%H:%M} UTC "
                     f"({span:.0f} min); per trial {raw['wall_time_s'].min() / 60:.1f}-"
                     f"{raw['wall_time_s'].max() / 60:.1f} min of training loop.")
    if "images_per_s" in e and e["images_per_s"].notna().any():
        rate = e.groupby("trial_id")["images_per_s"].median()
        lines.append(f"- Training rate: {rate.min():.0f}-{rate.max():.0f} images/s per trial (each trial's median "
                     "epoch, the epochs table).")
    if "eval_images" in e and e["eval_images"].notna().any():
        last = e["epoch"] == e.groupby("trial_id")["epoch"].transform("max")

        def sizes(rows) -> str:
            return ", ".join(f"{v:,}" for v in sorted(rows["eval_images"].dropna().astype(int).unique())) or "—"

        lines.append(f"- Scored after each epoch on {sizes(e[~last])} test images (a fixed class-stratified subset), "
                     f"after the last on {sizes(e[last])} (the whole test split).")
    if not m.empty:
        lines.append(f"- Measured: {m.groupby(['trial_id', 'checkpoint_epoch']).ngroups} snapshots (epochs "
                     f"{', '.join(map(str, sorted({int(x) for x in m['checkpoint_epoch']})))}), each on the same "
                     f"{', '.join(f'{int(x):,}' for x in sorted(set(m['n_images'].dropna())))} test images.")
    return lines


def recipe(data: StudyData) -> str:
    t = data.trials.iloc[0]
    cap = int(t.get("max_train_images") or 0)
    images = f"a class-stratified {cap:,} training images" if cap else "every training image"
    cutmix = float(t.get("cutmix_prob", 1.0))
    mixed = "every batch" if cutmix >= 1 else f"{cutmix:.0%} of the batches"
    grid = grid_of(data)
    return (f"A {int(t['depth'])}-block, dim-{int(t['dim'])}, {int(t['heads'])}-head ViT ({grid}x{grid} patches of "
            f"{int(t['patch_size'])} px, APE), trained {int(t['epochs'])} epochs on {images} of "
            f"`{Path(str(t['data_root'])).name}`, baseline vs CutMix, paired by seed (`sweeps/studies/pilot.py`): "
            f"AdamW lr {t['lr']:g}, weight decay {t['weight_decay']:g} on "
            f"{'every parameter' if t.get('decay_exempt') == 'none' else 'all but biases, norms, CLS and PE'}, "
            f"pad-{int(t.get('crop_padding') or 0)} random crop + horizontal flip, batch {int(t['batch_size'])}, "
            f"{int(t['warmup_epochs'])} warm-up epoch(s) then cosine. CutMix mixes {mixed}: an amplifier of "
            "Study L's mechanism, not Lee et al.'s recipe (half the batches). Study L's own scale is far larger "
            "(2.4M parameters, 100 epochs, CIFAR-100).")


def data_recipe(data: StudyData) -> str:
    name = Path(str(data.trials.iloc[0]["data_root"])).name
    return DATA_RECIPES.get(name, f"`{name}`: a `train/<class>/` + `test/<class>/` folder of images (data set "
                                  "`folder`).")


# -- figures -------------------------------------------------------------------------------------
def draw_figures(data: StudyData, out: Path, pngs: bool = True) -> list[str]:
    """Every Study L and training-time figure as a PNG in ``out``: its Markdown (or why it is absent). ``pngs``
    False: the Markdown only, nothing written (the text of a rebuild, most of whose time is the rendering)."""
    for old in out.glob("*.png") if pngs else ():
        old.unlink()
    uniform = uniform_mad(grid_of(data))
    parts = []
    for section, title, draw in figures.FIGURES:
        if section not in SECTIONS:
            continue
        try:
            plots = draw(data)
        except plotting.NoData as missing:
            parts.append(f"### {title}\n\n*Omitted ({missing}).*")
            continue
        for plot in plots:
            name = f"{slug(plot.title)}.png"
            if pngs:
                (out / name).write_bytes(canvas.render_png(plot.figure))
            caption = plot.caption
            if plotting.UNIFORM_TEXT in caption:  # the level, in numbers, on every MAD figure
                caption += f" Here {uniform:.3f} ({grid_of(data)} x {grid_of(data)})."
            parts.append(f"### {plot.title}\n\n![{plot.title}]({name})\n\n{caption}")
    return parts


# -- the page ------------------------------------------------------------------------------------
def render(data: StudyData, run: dict, out: Path, pngs: bool = True) -> str:
    grid = grid_of(data)
    uniform = uniform_mad(grid)
    return "\n".join([
        "# Pilot III: Study L's CutMix claims on all of CIFAR-10, at CPU scale",
        "",
        "*Written by `bench/pilot_page.py` from the pilot's kept tables (`tables/`); do not edit by hand.*",
        "",
        recipe(data),
        "",
        f"**Uniform attention** on the {grid} x {grid} grid has MAD **{uniform:.3f}**; every MAD below stands "
        "beside it, and every MAD figure draws it as a dotted line.",
        "",
        "## Result",
        "",
        result_section(data),
        "",
        "## Study L's claims",
        "",
        claims_section(data),
        "",
        "## Emergence: minimum MAD over the snapshots",
        "",
        f"Minimum over layers and heads (CLS sinks left out) per trial, then mean [{INTERVAL}] over seeds; epoch 0 "
        f"is the untrained model; uniform attention {uniform:.3f}.",
        "",
        emergence_section(data),
        "",
        "## Attention per layer at each snapshot",
        "",
        f"Per protocol and layer: the mean over the layer's heads per trial (CLS sinks included), then mean "
        f"[{INTERVAL}] over seeds; MAD beside uniform attention's {uniform:.3f}, entropy normalised by log N.",
        "",
        layer_section(data),
        "",
        "## Accuracy",
        "",
        accuracy_section(data),
        "",
        "## What ran",
        "",
        "```",
        "vitsweep sweep pilot --data-root $DATA/cifar10-jpeg --stage all --results results",
        "PYTHONPATH=. python3 bench/pilot_page.py --results results",
        "```",
        "",
        *run_section(data, run),
        "",
        "Data: " + data_recipe(data),
        "",
        "## Earlier pilots",
        "",
        *EARLIER,
        "",
        STUDY_P,
        "",
        "## Figures",
        "",
        *[p + "\n" for p in draw_figures(data, out, pngs)],
    ]).rstrip() + "\n"


def write_page(kept: Path, out: Path, pngs: bool = True) -> Path:
    """The page and its figures in ``out``, from the kept tables in ``kept`` alone (``pngs`` False: the page's
    text only)."""
    data, run = load_kept(kept)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "README.md"
    page.write_text(render(data, run, out, pngs), encoding="utf-8")
    return page


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", help="the pilot's results folder: its tables are kept beside the page first "
                                          "(without it the page is rebuilt from the kept tables)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "pilot"), help="the page's folder (default docs/pilot)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    kept = keep_tables(args.results, out) if args.results else out / KEPT
    page = write_page(kept, out)
    size = sum(f.stat().st_size for f in [page, *out.glob("*.png"), *kept.iterdir()])
    print(f"{page}: page, figures and kept tables {size / 1e6:.2f} MB"
          + ("" if size < LIMIT else f", over the {LIMIT / 1e6:.0f} MB they should stay under (issue #44)"))
    return page


if __name__ == "__main__":
    main()
