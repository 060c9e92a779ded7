"""The report's HTML page: one self-contained ``index.html`` from a ``StudyData``, the claims and the
figures' HTML (``analysis.reporting.report`` draws the figures and writes the files).

Sections: the claims, Study P, Study L, across conditions and over training (``SECTIONS``: the
figures' sections, ``analysis.reporting.figures.FIGURES``), the configuration, the papers' numbers and the
notes. Every table and note is escaped here; no number is computed here that a table module
(``analysis.statistics.claims``, ``analysis.reporting.condition_tables``) or ``StudyData`` does not give.
"""

from __future__ import annotations

import base64
import datetime
import html
import re
from typing import TYPE_CHECKING

import pandas as pd

from analysis.reporting import claims_page
from analysis.reporting.condition_tables import ablation_tables, conditions_table, layer_tables
from analysis.statistics.paper_numbers import PAPERS, paper_reference_table
from records.schema import TRIAL_FIELDS

if TYPE_CHECKING:
    from analysis.statistics.study_data import StudyData

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
"""


def omitted(text: str) -> str:
    """A one-line note in place of what could not be shown (a figure without its data)."""
    return f'<p class="omitted">{_e(text)}</p>'


def figure_html(title: str, caption: str, name: str, png: bytes, width_px: int) -> str:
    """One figure, inline as a base64 PNG shown ``width_px`` wide, linking its SVG and PDF beside the page
    (``name``.svg, ``name``.pdf)."""
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return (f'<figure><h3>{_e(title)}</h3><img src="{src}" alt="{_e(title)}" '
            f'width="{width_px}"><figcaption>{_e(caption)} '
            f"(<a href='{name}.svg'>SVG</a>, <a href='{name}.pdf'>PDF</a>)</figcaption></figure>")


def trials_html(data: StudyData, links: dict[str, str], ui: str | None = None) -> str:
    """Every trial of the table (all statuses): condition, seed, status, accuracies, MLflow run (``links``:
    ``report._run_links``; ``ui``: the command that serves a local store's UI, said in the caption)."""
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
               "n images": "—" if not counted or pd.isna(p["n_images"]) else int(p["n_images"]),
               "CLS sink heads": _sinks(p) if counted else "—"}
        if any_tuning:
            row["holdout acc (tuning score)"] = _fmt(t.get("eval_acc")) if tuning else "—"
        run_id = t.get("mlflow_run_id")
        if links and isinstance(run_id, str) and run_id:
            row["MLflow run"] = f"<a href='{_e(links['base'] + run_id + links.get('suffix', ''))}'>{_e(run_id[:8])}</a>"
        rows.append(row)
    table = pd.DataFrame(rows)
    caption = ("<h3>Trials</h3><p class='caption'>Every trial in the trials table. <i>test acc</i>: top-1 on the "
               "full test split, from training; <i>CLS sink heads</i>: heads whose attention mass on CLS is at least "
               "0.5, left out of the minimum MAD; <i>clean acc</i>: top-1 of the analysis job on its <i>n images</i> "
               "at the last measured checkpoint: the same number on the same set when n images is the whole test "
               "split (the default), a subset's accuracy when the analysis was capped (--eval-size). A tuning trial "
               "(scored on the holdout, the hparam study) shows neither: its score is its <i>holdout acc</i>, and "
               "no number from the test split is shown for it, so none can be selected on."
               + (" <i>MLflow run</i>: the trial's run in MLflow's UI, its headline numbers first" if links else "")
               + (f"; for this local store start the UI first: <code>{_e(ui)}</code>" if links and ui else "")
               + ("." if links else "") + "</p>")
    return caption + table.to_html(index=False, border=0, na_rep="—", escape=False,
                                   formatters={c: _e for c in table.columns if c != "MLflow run"})


def _sinks(p) -> str:
    """Heads left out of the trial's minimum MAD (CLS mass >= 0.5); a trial whose every head is one has
    no minimum, and says so rather than dropping out of the claims unseen."""
    if pd.isna(p.get("cls_sink_heads")):
        return "—"
    return f"{int(p['cls_sink_heads'])}" + (" (all: no minimum MAD)" if p.get("all_heads_cls_sinks") else "")


def _fmt(v) -> str:
    return "—" if v is None or pd.isna(v) else f"{float(v):.3f}"


def render(data: StudyData, results: str, claims: pd.DataFrame, body: dict[str, list[str]]) -> str:
    sections = [("claims", "Claims"), *SECTIONS.items(), ("config", "Configuration"), ("paper", "Paper numbers")]
    if data.notes:
        sections.append(("notes", "Notes"))
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>vitsweep report: {_e(data.study)}</title>"
        f"<style>{_CSS}{claims_page.CSS}</style></head><body>",
        f"<h1>vitsweep report: {_e(data.study)}</h1>",
        f"<p class='meta'>results: {_e(str(results))} · generated "
        f"{datetime.datetime.now().isoformat(timespec='seconds')} · code version: {_e(_code_version(data))} · "
        f"{_counts(data)}</p>",
        "<nav>" + " · ".join(f"<a href='#{k}'>{_e(v.split(':')[0])}</a>" for k, v in sections) + "</nav>",
        "<h2 id='claims'>Claims</h2>",
        claims_page.claims_section(claims),
    ]
    for key, title in SECTIONS.items():
        parts += [f"<h2 id='{key}'>{_e(title)}</h2>", *body[key]]
    parts += ["<h2 id='config'>Configuration</h2>", _config_html(data),
              "<h2 id='paper'>Paper numbers (for reference)</h2>",
              f"<p class='caption'>As the papers report them: {_e(PAPERS)}. Drawn beside ours as markers only where "
              "the setting matches (Study P: ImageNet-100 / 224 px; Study L: CIFAR-100); otherwise compare with care: "
              "severities set for 224 px are far harsher at 32 px, and Study L's MAD normalisation is not "
              "published.</p>",
              _table(paper_reference_table())]
    if data.notes:  # what the data model set aside or could not read; no section when there is nothing
        parts += ["<h2 id='notes'>Notes</h2>", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in data.notes) + "</ul>"]
    return "\n".join([*parts, "</body></html>"])


def _counts(data: StudyData) -> str:
    """``8 finished trial(s) in 4 condition(s), 2 seed(s) each`` (``1-3 seed(s) each`` where it varies)."""
    t = data.trials
    if t.empty:
        return "0 finished trial(s)"
    per = t.groupby("condition")["seed"].nunique()
    seeds = f"{per.min()}" if per.min() == per.max() else f"{per.min()}-{per.max()}"
    return f"{len(t)} finished trial(s) in {len(per)} condition(s), {seeds} seed(s) each"


def ablation_html(data: StudyData) -> list[str]:
    tables = ablation_tables(data)
    out = [] if tables else ['<p class="omitted">Protocol ablation table: omitted (needs minimum MAD for two or '
                             "more protocols).</p>"]
    for dataset, table, note in tables:
        out += [f"<h3>Protocol ablation table ({_e(dataset)})</h3>",
                "<p class='caption'>Minimum MAD = smallest per-head MAD in the network at the final checkpoint; "
                "mean ± std over seeds, n = seeds.</p>", _table(table), f"<p class='caption'>{_e(note)}</p>"]
    for dataset, table, setting in layer_tables(data):
        out += [f"<h3>MAD and entropy per layer ({_e(dataset)})</h3>",
                "<p class='caption'>Study L's claim is about early layers: per protocol and layer, the mean MAD and "
                "attention entropy over the layer's heads (CLS sinks included) per trial, then the mean with its 95% t "
                "interval over seeds, n = seeds. The early-layer claims test layers 0-1."
                + (f" Other factors: {_e(setting)}." if setting else "") + "</p>", _table(table)]
    return out


def conditions_html(data: StudyData) -> str:
    table = conditions_table(data)
    if table.empty:
        return '<p class="omitted">Conditions table: omitted (no finished trials).</p>'
    return ("<h3>Conditions table</h3><p class='caption'>Every condition at its final checkpoint: mean ± std over "
            "seeds, n = seeds. FS at JPEG q5 / blur sigma 2.5 (PE-scaling alpha 1 where the severity grid lacks "
            "them). dSSDC under RPI on two scales: one permutation per image (this project's estimand) and the "
            "paper's estimator (one per 1,000 images), the only one its 0.473 compares with. Every seed is measured "
            "on the same images, so the seed spread holds no test-set sampling "
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
        shown = sorted(map(str, raw[col].dropna().unique()))
        if len(shown) > 1:
            listed = ", ".join(shown[:20]) + (f", … ({len(shown) - 20} more)" if len(shown) > 20 else "")
            varying.append({"column": col, "distinct": len(shown), "values": listed})
        else:
            constant.append({"column": col, "value": shown[0] if shown else "—"})
    return (f"<p>Code version: {_e(_code_version(data))}.</p><h3>Varying ({len(varying)})</h3>"
            + _table(pd.DataFrame(varying)) + f"<h3>Constant ({len(constant)})</h3>" + _table(pd.DataFrame(constant)))


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


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
