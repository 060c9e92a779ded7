"""The study report: the papers' figures and tables regenerated from Parquet, with seed-level spread.

    vitsweep report STUDY --results DIR          # or: python -m analysis.report STUDY --results DIR
    build_report("results", "study_l")           # -> results/study_l/report/index.html

Reads only ``<results>/<study>/{trials,epochs,measurements}/`` (``records.schema``) and writes
``<results>/<study>/report/``: per figure a PNG (150 dpi) and an SVG beside it, ``claims.csv`` and
one self-contained ``index.html`` (figures inline as base64 PNGs). Given a tracking URI, it logs
the page, ``claims.csv`` and the figures to the study's run ``<study>-report`` in its experiment,
and where the URI is an http(s) server the per-trial table links each trial's run. Any table may
be missing or empty: a figure without its data is replaced by a one-line note, never an error.
Figures live in ``analysis.figures``, claims and tables of numbers in ``analysis.claims``, what a
condition is in ``analysis.conditions``; this module loads the data, joins it and writes the page.

Conventions: a *condition* is one value of each factor (dataset, pe, rpt, protocol) and of every
other config field that varies among trials of one factor cell (``condition_fields``: an ``--set
lr=...`` run, a second launch with other epochs); a *trial* is one seed of a condition and the unit
of every spread and test. Two trials with the same seed in one condition are not two seeds: one is
counted and the report's Notes name the rest as an error, never pooled. Figures and claims hold the
fields they do not show at one value (``StudyData.pin``). Only finished trials count. Unless a
figure is about training time, each trial contributes its last measured checkpoint.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import logging
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
from pyarrow import fs as pafs

from analysis import claims as numbers
from analysis.claims import REFERENCE
from analysis.conditions import TRIAL_KEYS, normalise_trials
from records.schema import MEASUREMENTS, PAIRED_COUNTS, TRIAL_FIELDS
from records.tables import filesystem, list_studies, read_table, table_path

log = logging.getLogger(__name__)

# Headline severities of Study P's fragility score (FS): JPEG quality 5, blur kernel 5 sigma 2.5.
HEADLINE_JPEG_QUALITY, HEADLINE_BLUR_SIGMA = 5.0, 2.5
# Images of each data set's official test split: the n behind trials.test_acc (training measures it on
# the whole split), whatever cap the analysis set had. From trainables.datasets.DATASETS (shapes:
# trainables.shapes.TEST_SIZE; tests/test_figures.py checks both); a folder data set's is unknown here.
TEST_SPLIT_IMAGES = {"shapes": 2_000, "cifar10": 10_000, "cifar100": 10_000, "tinyimagenet": 10_000,
                     "imagenet100": 5_000}


@dataclass
class StudyData:
    """A study's tables, cleaned and joined; every frame carries the factor columns of its trial.

    trials: finished trials, one row each; dataset, pe, rpt (bool), protocol (canonical name), seed,
        model (``ape + RPT``) and the three protocol switches are always present.
    epochs: per-epoch rows of those trials.  measurements: long rows of every measured checkpoint.
    raw_trials: the trials table as stored (all statuses), for the configuration section.
    """

    study: str
    trials: pd.DataFrame
    epochs: pd.DataFrame
    measurements: pd.DataFrame
    raw_trials: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)
    condition_fields: list[str] = field(default_factory=list)  # config fields that split a factor cell

    @classmethod
    def load(cls, results: str, study: str) -> StudyData:
        fs, root = filesystem(f"{results.rstrip('/')}/{study}")
        if fs.get_file_info(root).type != pafs.FileType.Directory:
            raise ValueError(f"no study {study!r} under {results!r}; studies there: {list_studies(results)}")
        tables, notes = {}, []
        for name in ("trials", "epochs", "measurements"):
            table = read_table(results, study, name)
            if table is None or table.num_rows == 0:
                notes.append(f"table {name!r} is missing or empty ({table_path(results, study, name)}).")
                tables[name] = pd.DataFrame()
            else:
                tables[name] = table.to_pandas()
        return cls.from_frames(study, tables["trials"], tables["epochs"], tables["measurements"], notes=notes)

    @classmethod
    def from_frames(cls, study: str, trials: pd.DataFrame, epochs: pd.DataFrame, measurements: pd.DataFrame,
                    *, notes: list[str] | None = None) -> StudyData:
        """Clean and join raw tables (as ``pandas.read_parquet`` returns them)."""
        notes = list(notes or [])
        clean, extra = normalise_trials(trials, notes)
        keys = clean[[*TRIAL_KEYS, *extra]]
        joined_epochs = epochs.merge(keys, on="trial_id") if "trial_id" in epochs else pd.DataFrame()
        if measurements.empty or "trial_id" not in measurements:
            joined = pd.DataFrame(columns=[*MEASUREMENTS.names, *TRIAL_KEYS[1:], *extra])
        else:
            joined = measurements.merge(keys, on="trial_id")
            if dropped := len(measurements) - len(joined):
                notes.append(f"{dropped} measurement rows belong to no finished trial and are left out.")
        for column in ("level", "layer", "head_index"):  # null (NaN here): not per level / layer / head
            joined[column] = joined[column].astype(float)
        return cls(study, clean, joined_epochs, joined, trials, notes, extra)

    # -- views ---------------------------------------------------------------------
    @cached_property
    def final(self) -> pd.DataFrame:
        """Measurement rows of each trial's last measured checkpoint."""
        m = self.measurements
        if m.empty:
            return m
        return m[m["checkpoint_epoch"] == m.groupby("trial_id")["checkpoint_epoch"].transform("max")]

    def select(self, intervention: str, metric: str, *, level: float | None = None, per_layer: bool = False,
               per_head: bool = False, final: bool = True) -> pd.DataFrame:
        """Measurement rows of one (intervention, metric), optionally at one level; per_layer/per_head
        keep only rows with a layer / head_index (not null). ``final=False`` keeps every checkpoint."""
        m = self.final if final else self.measurements
        if m.empty:
            return m
        mask = (m["intervention"] == intervention) & (m["metric"] == metric)
        if level is not None:
            mask &= np.isclose(m["level"].to_numpy(float), level)
        if per_layer:
            mask &= m["layer"].notna()
        if per_head:
            mask &= m["head_index"].notna()
        return m[mask]

    @cached_property
    def per_trial(self) -> pd.DataFrame:
        """One row per finished trial: factors plus the headline metrics at the final checkpoint.

        test_acc (trials table; for a test-scored trial without it, the clean accuracy measurement;
        a holdout-scored trial, tuning, has none: its score is eval_acc on the holdout, and no number
        from the test split may stand in for it), eval_acc, min_mad (smallest per-head MAD in the
        network, Study L), dssdc (under RPI), fs_jpeg (q5) and fs_blur (sigma 2.5): the PE-scaling rows
        at alpha 1 (the unscaled model) stand in for fs_* when the severity grid lacks the headline
        level. did_not_learn (trials flag); n_images (evaluation images of the measurements) and the
        standard errors: test_acc_se (binomial) over test_images, the test split test_acc was measured
        on (``TEST_SPLIT_IMAGES``; test_acc_se_on_subset marks one over n_images instead: split size
        unknown, or test_acc from the analysis set); fs_jpeg_se, fs_blur_se over the analysis set (delta
        method from the paired counts, ``seedstats.fragility_se``; the binomial approximation for
        measurements stored without them); NaN where no n is known."""
        t = self.trials
        extra = [c for c in ("condition", *self.condition_fields, "img_size", "mlflow_run_id") if c in t]
        out = t[[*TRIAL_KEYS, "did_not_learn", *dict.fromkeys(extra)]]
        out = out.copy().set_index("trial_id")

        def per(df: pd.DataFrame, how: str = "mean") -> pd.Series:
            return df.groupby("trial_id")["value"].agg(how) if not df.empty else pd.Series(dtype=float)

        def column(name: str) -> pd.Series:
            return t.set_index("trial_id")[name].astype(float).reindex(out.index) if name in t else \
                pd.Series(np.nan, index=out.index)

        tuning = (t.set_index("trial_id")["eval_split"].reindex(out.index) == "holdout") if "eval_split" in t else \
            pd.Series(False, index=out.index)
        measured = per(self.select("clean", "acc")).reindex(out.index)
        acc = column("test_acc").where(~tuning)
        out["test_acc"] = acc.combine_first(measured).where(~tuning)
        out["eval_acc"] = column("eval_acc")
        out["min_mad"] = per(self.select("clean", "mad", per_layer=True, per_head=True), "min")
        out["dssdc"] = per(self.select("rpi", "dssdc"))
        paired, scaled_from = {}, ("pe_scale", "rope_scale")
        for name, kind, level in (("fs_jpeg", "jpeg", HEADLINE_JPEG_QUALITY), ("fs_blur", "blur", HEADLINE_BLUR_SIGMA)):
            headline = per(self.select(kind, "fs", level=level))
            scaled = pd.concat([per(self.select(iv, name, level=1.0)) for iv in scaled_from])
            scaled = scaled[~scaled.index.duplicated()]
            out[name] = headline.reindex(out.index).combine_first(scaled.reindex(out.index))
            counts = []
            for count in PAIRED_COUNTS:  # from the same rows as the value: the headline shift, else alpha 1
                at_alpha = pd.concat([per(self.select(iv, f"{name}_{count}", level=1.0)) for iv in scaled_from])
                at_alpha = at_alpha[~at_alpha.index.duplicated()]
                counts.append(per(self.select(kind, count, level=level)).reindex(out.index)
                              .combine_first(at_alpha.reindex(out.index)))
            paired[name] = counts
        clean = self.select("clean", "acc")
        if "n_images" in clean and not clean.empty:
            out["n_images"] = clean.groupby("trial_id")["n_images"].max().reindex(out.index)
        else:
            out["n_images"] = np.nan
        out["acc_clean"] = measured.where(~tuning)  # on the analysis set (the test split): none for tuning runs
        last = self.final.groupby("trial_id")["checkpoint_epoch"].max() if not self.final.empty else None
        out["checkpoint_epoch"] = last.reindex(out.index) if last is not None else np.nan
        acc_clean = measured.combine_first(out["test_acc"])
        # test_acc is over the whole test split (not the analysis set, which may be a capped subset); where
        # it stands in from the clean measurement, or the split's size is unknown, the analysis set's n.
        split = out["dataset"].map(TEST_SPLIT_IMAGES).where(acc.notna()).astype(float)
        out["test_images"] = split
        out["test_acc_se_on_subset"] = split.isna() & out["n_images"].notna() & out["test_acc"].notna()
        out["test_acc_se"] = numbers.binomial_se(out["test_acc"], split.fillna(out["n_images"]))
        for name, counts in paired.items():
            from_counts = pd.Series(numbers.fragility_se(*counts, out["n_images"]), index=out.index)
            approx = pd.Series(numbers.fragility_se_without_counts(out[name], acc_clean, out["n_images"]),
                               index=out.index)
            out[f"{name}_se"] = from_counts.where(counts[0].notna(), approx)
        return out.reset_index()

    def pin(self, df: pd.DataFrame, keep: set[str]) -> tuple[pd.DataFrame, str]:
        """Hold the factors a figure or claim does not show at one value, so nothing is pooled silently.

        For pe, rpt, protocol and every ``condition_fields`` column outside ``keep`` that takes several
        values in ``df``, keep only the ``REFERENCE`` value (ape, fixed order, baseline), or the most
        common one when there is none or it is absent (ties: the smallest). Returns the slice and a
        description such as ``"pe = ape, protocol = baseline, lr = 0.001"``."""
        said = []
        for factor in ("pe", "rpt", "protocol", *self.condition_fields):
            if factor in keep or factor not in df or df[factor].nunique() < 2:
                continue
            values = set(df[factor].unique())
            ref = REFERENCE.get(factor)
            value = ref if ref in values else min(df[factor].mode(), key=str)
            df = df[df[factor] == value]
            shown = {"rpt": lambda v: "RPT" if v else "fixed"}.get(factor, str)(value)
            said.append(f"{'token order' if factor == 'rpt' else factor} = {shown}")
        return df, ", ".join(said)

    def matches_paper_p(self, dataset: str) -> bool:
        """Study P's numbers compare only at its setting: ImageNet-100 or 224 px images."""
        if dataset == "imagenet100":
            return True
        t = self.trials[self.trials["dataset"] == dataset]
        return "img_size" in t and not t.empty and bool((t["img_size"] == 224).all())



# -- the page -----------------------------------------------------------------------
SECTIONS = {
    "P": "Study P: positional encodings anchor spatial structure",
    "L": "Study L: the training protocol induces locality",
    "T": "Across conditions and over training",
}
_CSS = """
body{font-family:system-ui,sans-serif;max-width:1250px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0} th,td{border:1px solid #ddd;padding:3px 7px}
th{background:#f3f3f3} td{text-align:right} td:first-child,td:nth-child(2){text-align:left}
figure{margin:1.2em 0} img{max-width:100%} figcaption,.caption{font-size:.85em;color:#444;max-width:1100px}
.omitted{color:#777;font-style:italic;margin:.3em 0} .meta{color:#555}
td.v-supported{background:#dff3df} td.v-not-supported,td.v-differs{background:#f7e0e0}
"""


def build_report(results: str, study: str, *, out_dir: str | os.PathLike | None = None,
                 mlflow_uri: str | None = None) -> Path:
    """Write the report of ``study`` and return the path of its ``index.html``.

    results: the results folder (or a pyarrow URI such as ``s3://bucket/results``; then ``out_dir``,
    a local folder, is required). out_dir defaults to ``<results>/<study>/report``. mlflow_uri: where
    to log the report (run ``<study>-report``) and, for an http(s) server, whose runs to link; None
    logs nothing."""
    if out_dir is None:
        if "://" in results and not results.startswith("file://"):
            raise ValueError(f"results {results!r} is remote: pass out_dir, a local folder for the report")
        out_dir = Path(results.removeprefix("file://")) / study / "report"
    data = StudyData.load(results, study)  # first: a wrong study name must not leave a folder behind
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    body = {key: [] for key in SECTIONS}
    from analysis import figures  # matplotlib: imported when figures are drawn, not for --help

    for section, title, draw in figures.FIGURES:
        try:
            plots = draw(data)
        except figures.NoData as missing:
            body[section].append(f'<p class="omitted">{_e(title)}: omitted ({_e(str(missing))}).</p>')
            continue
        except Exception as err:  # noqa: BLE001 - one broken figure must not cost the whole report
            log.exception("figure %r failed", title)
            body[section].append(f'<p class="omitted">{_e(title)}: could not be drawn ({_e(repr(err))}).</p>')
            continue
        for plot in plots:
            slug = _slug(plot.title)
            png = figures.render_png(plot.figure)
            (out / f"{slug}.png").write_bytes(png)
            (out / f"{slug}.svg").write_bytes(figures.render_svg(plot.figure))
            (out / f"{slug}.pdf").write_bytes(figures.render_pdf(plot.figure))
            src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
            # Shown at a fixed scale (plotting.PX_PER_IN), so every figure's text renders at one size.
            body[section].append(f'<figure><h3>{_e(plot.title)}</h3><img src="{src}" alt="{_e(plot.title)}" '
                                 f'width="{figures.display_px(plot.figure)}"><figcaption>{_e(plot.caption)} '
                                 f"(<a href='{slug}.svg'>SVG</a>, <a href='{slug}.pdf'>PDF</a>)</figcaption></figure>")
    body["L"].extend(_ablation_html(data))
    body["T"].insert(0, _conditions_html(data))
    experiment_id = _experiment(mlflow_uri, study)
    body["T"].insert(1, _trials_html(data, _run_links(mlflow_uri, experiment_id)))

    claims = numbers.evaluate_claims(data)
    claims.to_csv(out / "claims.csv", index=False)
    page = _page(data, results, claims, body)
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    if experiment_id is not None:
        _log_report(mlflow_uri, experiment_id, study, index, out / "claims.csv")
    return index


def _experiment(uri: str | None, study: str) -> str | None:
    """The study's MLflow experiment id (created if missing), or None without a URI or store."""
    if not uri:
        return None
    from records import tracking

    try:
        return tracking.ensure_experiment(uri, study)
    except Exception as err:  # noqa: BLE001 - a tracking outage must not cost the report
        log.warning("MLflow %s unreachable, report not logged: %s", uri, err)
        return None


def _run_links(uri: str | None, experiment_id: str | None) -> dict[str, str]:
    """{run_id: URL} base for a tracking server (http/https): the UI's run page; {} otherwise."""
    if not uri or experiment_id is None or not uri.startswith(("http://", "https://")):
        return {}
    return {"base": f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/"}


def _log_report(uri: str, experiment_id: str, study: str, index: Path, claims: Path) -> None:
    from records import tracking

    try:
        run_id = tracking.study_run(uri, experiment_id, f"{study}-report")
        tracking.log_artifact_file(uri, run_id, index)
        tracking.log_artifact_file(uri, run_id, claims)
        for figure in sorted(f for ext in ("png", "svg", "pdf") for f in index.parent.glob(f"*.{ext}")):
            tracking.log_artifact_file(uri, run_id, figure, "figures")
        tracking.end_trial_run(uri, run_id)
    except Exception as err:  # noqa: BLE001
        log.warning("could not log the report to MLflow %s: %s", uri, err)


def _trials_html(data: StudyData, links: dict[str, str]) -> str:
    """Every trial of the table (all statuses): condition, seed, status, accuracies, MLflow run."""
    raw = data.raw_trials
    if raw.empty or "trial_id" not in raw:
        return '<p class="omitted">Trials table: omitted (no trials table).</p>'
    pt = data.per_trial.set_index("trial_id") if not data.per_trial.empty else pd.DataFrame()
    any_tuning = "eval_split" in raw and bool((raw["eval_split"] == "holdout").any())
    rows = []
    for t in raw.drop_duplicates("trial_id", keep="last").sort_values("trial_id").to_dict("records"):
        tid = t["trial_id"]
        counted = tid in pt.index
        p = pt.loc[tid] if counted else {}
        condition = p["condition"] if counted else ", ".join(str(t.get(c, "?")) for c in ("dataset", "pe", "protocol"))
        status = t.get("status") or "unknown"
        if status == "finished" and not counted:
            status = "finished (not counted: a second trial of its seed)"
        elif counted and p["did_not_learn"]:
            status = "finished (did not learn)"
        tuning = t.get("eval_split") == "holdout"  # scored on the holdout: no number from the test split shown
        row = {"trial": tid, "condition": condition, "seed": t.get("seed"), "status": status,
               "test acc (test split)": "—" if tuning else _fmt(p["test_acc"] if counted else t.get("test_acc")),
               "clean acc (analysis set)": _fmt(p["acc_clean"]) if counted and not tuning else "—",
               "n images": "—" if not counted or pd.isna(p["n_images"]) else int(p["n_images"])}
        if any_tuning:
            row["holdout acc (tuning score)"] = _fmt(t.get("eval_acc")) if tuning else "—"
        run_id = t.get("mlflow_run_id")
        if links and isinstance(run_id, str) and run_id:
            row["MLflow run"] = f"<a href='{_e(links['base'] + run_id)}'>{_e(run_id[:8])}</a>"
        rows.append(row)
    table = pd.DataFrame(rows)
    caption = ("<h3>Trials</h3><p class='caption'>Every trial in the trials table. <i>test acc</i>: top-1 on the "
               "full test split, from training; <i>clean acc</i>: top-1 of the analysis job on its <i>n images</i> "
               "at the last measured checkpoint: the same number on the same set when n images is the whole test "
               "split (the default), a subset's accuracy when the analysis was capped (--eval-size). A tuning trial "
               "(scored on the holdout, the hparam study) shows neither: its score is its <i>holdout acc</i>, and "
               "no number from the test split is shown for it, so none can be selected on.</p>")
    return caption + table.to_html(index=False, border=0, na_rep="—", escape=False,
                                   formatters={c: _e for c in table.columns if c != "MLflow run"})


def _fmt(v) -> str:
    return "—" if v is None or pd.isna(v) else f"{float(v):.3f}"


def _page(data: StudyData, results: str, claims: pd.DataFrame, body: dict[str, list[str]]) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>vitsweep report: {_e(data.study)}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>vitsweep report: {_e(data.study)}</h1>",
        f"<p class='meta'>results: {_e(str(results))} · generated "
        f"{datetime.datetime.now().isoformat(timespec='seconds')} · code version: {_e(_code_version(data))} · "
        f"{_counts(data)}</p>",
        "<nav>" + " · ".join(f"<a href='#{k}'>{_e(v.split(':')[0])}</a>" for k, v in
                             [("claims", "Claims"), *SECTIONS.items(), ("config", "Configuration"),
                              ("paper", "Paper numbers"), ("notes", "Notes")]) + "</nav>",
        "<h2 id='claims'>Claims</h2>",
        "<p class='caption'>Each claim of the two papers tested on this study's trials, separately per data set "
        "and with the factors the claim does not name held at one value (shown in <i>setting</i>). Units are "
        "trials (seeds). Trials of one seed share initialisation, data order, crops, CutMix boxes and RPT "
        "permutations, so where every seed appears once in each group the comparison is <i>paired by seed</i>: "
        "the effect is the mean per-seed difference A - B over <i>n pairs</i>, with a 95% t interval (n - 1 df) "
        "and an exact sign-flip test of that mean; only where seeds do not pair (a group pooling several "
        "conditions) a Mann-Whitney U test and a percentile-bootstrap CI of the difference of means (<i>test</i>, "
        f"<i>CI</i> say which). alpha = {numbers.ALPHA}, no correction for the number of claims. 'not enough "
        f"seeds': with these sizes even the most extreme outcome cannot reach p &lt; {numbers.ALPHA}. A claim of "
        "<i>no</i> effect is never 'supported' by a test that fails to reject: it is 'consistent with no effect' "
        "only when the 95% CI of the effect lies inside ± <i>margin</i> (stored with each claim, in the metric's "
        "units: 0.01 accuracy, 0.02 minimum MAD or FS, 0.05 dSSDC), else 'inconclusive'. <i>did not learn A / "
        "B</i>: trials of each group within 2 points of chance accuracy; the verdict is on the trials that "
        "learned, the <i>(all trials)</i> columns repeat the claim with them kept (their measurements as they "
        "are), and <i>survivors vs all</i> flags a claim whose two verdicts disagree. <i>paper A / B</i>: the "
        "paper's numbers for the two groups where this data set's setting matches the paper's (Study P: "
        "ImageNet-100 or 224 px; Study L: CIFAR-100).</p>",
        _claims_html(claims),
    ]
    for key, title in SECTIONS.items():
        parts += [f"<h2 id='{key}'>{_e(title)}</h2>", *body[key]]
    parts += ["<h2 id='config'>Configuration</h2>", _config_html(data),
              "<h2 id='paper'>Paper numbers (for reference)</h2>",
              "<p class='caption'>As reported in STUDIES.md. Drawn beside ours as markers only where the setting "
              "matches (Study P: ImageNet-100 / 224 px; Study L: CIFAR-100); otherwise compare with care: severities "
              "set for 224 px are far harsher at 32 px, and Study L's MAD normalisation is not published.</p>",
              _table(numbers.paper_reference_table()),
              "<h2 id='notes'>Notes</h2>",
              "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in data.notes) + "</ul>" if data.notes else "<p>None.</p>",
              "</body></html>"]
    return "\n".join(parts)


def _counts(data: StudyData) -> str:
    """``8 finished trial(s) in 4 condition(s), 2 seed(s) each`` (``1-3 seed(s) each`` where it varies)."""
    t = data.trials
    if t.empty:
        return "0 finished trial(s)"
    per = t.groupby("condition")["seed"].nunique()
    seeds = f"{per.min()}" if per.min() == per.max() else f"{per.min()}-{per.max()}"
    return f"{len(t)} finished trial(s) in {len(per)} condition(s), {seeds} seed(s) each"


def _claims_html(claims: pd.DataFrame) -> str:
    """The claims with data in the main table; those without folded away below it."""
    if claims.empty:
        return _table(claims)
    missing = claims["verdict"] == "no data"
    main = _verdict_table(claims[~missing]) if (~missing).any() else "<p class='omitted'>No claim has data.</p>"
    if not missing.any():
        return main
    folded = claims.loc[missing, ["paper", "claim", "metric", "A", "B"]]
    return (main + f"<details><summary>{int(missing.sum())} claim(s) without data in this study</summary>"
            + _table(folded) + "</details>")


def _verdict_table(claims: pd.DataFrame) -> str:
    fmt = claims.copy()
    for col in ("mean A", "mean B", "effect (A - B)", "effect (all trials)", "margin"):
        fmt[col] = fmt[col].map(lambda v: "—" if pd.isna(v) else f"{v:.3f}")
    for col in ("p", "p (all trials)"):
        fmt[col] = fmt[col].map(lambda v: "—" if pd.isna(v) else f"{v:.3g}")
    table = _table(fmt)
    # Colour the verdict cells: mark each <td> holding a verdict with a class.
    for v in numbers.VERDICTS:
        cls = "v-" + v.split(" (")[0].replace(" ", "-")
        table = table.replace(f"<td>{_e(v)}</td>", f"<td class='{cls}'>{_e(v)}</td>")
    return table.replace("<td>DISAGREE</td>", "<td class='v-differs'>DISAGREE</td>")


def _ablation_html(data: StudyData) -> list[str]:
    tables = numbers.ablation_tables(data)
    if not tables:
        return ['<p class="omitted">Protocol ablation table: omitted (needs minimum MAD for two or more '
                "protocols).</p>"]
    out = []
    for dataset, table, note in tables:
        out += [f"<h3>Protocol ablation table ({_e(dataset)})</h3>",
                "<p class='caption'>Minimum MAD = smallest per-head MAD in the network at the final checkpoint; "
                "mean ± std over seeds, n = seeds.</p>", _table(table), f"<p class='caption'>{_e(note)}</p>"]
    return out


def _conditions_html(data: StudyData) -> str:
    table = numbers.conditions_table(data)
    if table.empty:
        return '<p class="omitted">Conditions table: omitted (no finished trials).</p>'
    return ("<h3>Conditions table</h3><p class='caption'>Every condition at its final checkpoint: mean ± std over "
            "seeds, n = seeds. FS at JPEG q5 / blur sigma 2.5 (PE-scaling alpha 1 where the severity grid lacks "
            "them). Every seed is measured on the same images, so the seed spread holds no test-set sampling "
            "error: the SE columns give it (one trial's value: binomial for accuracy; for FS the delta method "
            "over the paired counts of images right clean and shifted, right clean only, right shifted only). "
            f"{_se_note(data.per_trial)} <i>did not learn</i>: trials within 2 points of chance accuracy, of the "
            "<i>n</i>; their values are in the means here, and the claims show them apart. <i>paper</i>: the "
            "paper's numbers where the setting matches.</p>" + _table(table))


def _se_note(pt: pd.DataFrame) -> str:
    """Which images each SE is over: test accuracy's the test split it was measured on, FS's the
    analysis set (<i>n images</i>); says so where an accuracy SE had only the analysis set to go on."""
    if pt.empty or "test_images" not in pt:
        return ""
    split = pt.dropna(subset=["test_images"]).groupby("dataset")["test_images"].max()
    said = ", ".join(f"{_e(str(ds))} {int(n):,}" for ds, n in split.items())
    note = (f"Test accuracy's SE is over the test split's images ({said}), FS's over the analysis set's "
            "<i>n images</i>." if said else "FS's SE is over the analysis set's <i>n images</i>.")
    subset = sorted(map(str, pt.loc[pt["test_acc_se_on_subset"].astype(bool), "dataset"].unique()))
    if subset:
        note += (f" For {_e(', '.join(subset))} the test accuracy SE is over the analysis set's <i>n images</i> "
                 "(test split size unknown here, or the accuracy is the analysis set's): larger than the "
                 "test split's where that set is a capped subset.")
    return note


def _config_html(data: StudyData) -> str:
    raw = data.raw_trials
    if raw.empty:
        return '<p class="omitted">Configuration: omitted (no trials table).</p>'
    result_columns = set(TRIAL_FIELDS.names) - {"study"} | {"code_version"}
    varying, constant = [], []
    for col in (c for c in raw.columns if c not in result_columns):
        values = raw[col].dropna().unique()
        shown = sorted(map(str, values))
        if len(shown) > 1:
            listed = ", ".join(shown[:20]) + (f", … ({len(shown) - 20} more)" if len(shown) > 20 else "")
            varying.append({"column": col, "distinct": len(shown), "values": listed})
        else:
            constant.append({"column": col, "value": shown[0] if shown else "—"})
    code = f"<p>Code version: {_e(_code_version(data))}.</p>"
    return (code + f"<h3>Varying ({len(varying)})</h3>" + _table(pd.DataFrame(varying)) +
            f"<h3>Constant ({len(constant)})</h3>" + _table(pd.DataFrame(constant)))


def _code_version(data: StudyData) -> str:
    """The code version behind the finished trials; several are named with their trial counts."""
    t = data.trials
    if "code_version" not in t or t["code_version"].isna().all():
        return "unknown"
    counts = t["code_version"].fillna("unknown").value_counts()
    if len(counts) == 1:
        return str(counts.index[0])
    return "MIXED: " + ", ".join(f"{v} ({n} trials)" for v, n in counts.items())


def _table(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p class='omitted'>(empty)</p>"
    return df.to_html(index=False, border=0, na_rep="—", escape=True)


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


# -- command line ---------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vitsweep report`` (the lead mounts them as a sub-command)."""
    parser.add_argument("study", help="study name: the folder <results>/<study>")
    parser.add_argument("--results", default="results", help="results folder or URI (default: ./results)")
    parser.add_argument("--out", default=None, help="report folder (default: <results>/<study>/report)")
    parser.add_argument("--mlflow-uri", default=None,
                        help="log the report to run <study>-report there; an http(s) server's runs are linked "
                             "(default: <results>/mlflow.db when it exists, else none)")


def run(args: argparse.Namespace) -> int:
    uri = args.mlflow_uri
    if uri is None and "://" not in args.results and (Path(args.results) / "mlflow.db").exists():
        from records.stores import default_tracking_uri

        uri = default_tracking_uri(args.results)
    index = build_report(args.results, args.study, out_dir=args.out, mlflow_uri=uri)
    print(index)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vitsweep report", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as err:  # a wrong study name or results folder: say so without a traceback
        parser.error(str(err))


if __name__ == "__main__":
    raise SystemExit(main())
