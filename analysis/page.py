"""The report's HTML page: one self-contained ``index.html`` from a ``StudyData``, the claims and the
figures' HTML (``analysis.report`` draws the figures and writes the files).

Sections: the claims, Study P, Study L, across conditions and over training (``SECTIONS``: the
figures' sections, ``analysis.figures.FIGURES``), the configuration, the papers' numbers and the
notes. Every table and note is escaped here; no number is computed here that a table module
(``analysis.claims``, ``analysis.condition_tables``) or ``StudyData`` does not give.
"""

from __future__ import annotations

import base64
import datetime
import html
import re
from typing import TYPE_CHECKING

import pandas as pd

from analysis.claim_tests import TWO_SIDED
from analysis.condition_tables import ablation_tables, conditions_table, layer_tables
from analysis.paper_numbers import paper_reference_table
from analysis.seedstats import ALPHA
from records.schema import TRIAL_FIELDS

if TYPE_CHECKING:
    from analysis.study_data import StudyData

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
td.v-supported{background:#dff3df} td.v-not-supported,td.v-differs{background:#f7e0e0} td.v-neutral{background:#f1f1f1}
table.claims{width:100%;table-layout:auto} table.claims td.claim{text-align:left;max-width:28em}
table.claims tr.details td{border-top:0;padding:0 7px 4px;text-align:left;font-size:.9em}
table.claims tr.details summary{color:#555;cursor:pointer} table.kv th{text-align:left;font-weight:normal}
small.aid{color:#7a4d00}
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


def trials_html(data: StudyData, links: dict[str, str]) -> str:
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
               "full test split, from training; <i>CLS sink heads</i>: heads whose attention mass on CLS is at least 0.5, "
               "left out of the minimum MAD; <i>clean acc</i>: top-1 of the analysis job on its <i>n images</i> "
               "at the last measured checkpoint: the same number on the same set when n images is the whole test "
               "split (the default), a subset's accuracy when the analysis was capped (--eval-size). A tuning trial "
               "(scored on the holdout, the hparam study) shows neither: its score is its <i>holdout acc</i>, and "
               "no number from the test split is shown for it, so none can be selected on.</p>")
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
        "a paired t test of the mean per-seed difference A - B over <i>n pairs</i> decides, its p and its 95% "
        "interval from the same test (one-sided for a one-sided claim), with the exact sign-flip p beside it as a "
        "distribution-free check; a PE-scaling claim pairs within each trial, then across seeds; where seeds do "
        "not pair (a group pooling several conditions) Welch's t test (<i>test</i>, <i>CI</i> say which). "
        "<i>p (Holm)</i>: the raw p values Holm-adjusted across the claims of one paper on one data set; a "
        f"directional verdict reads the adjusted p at alpha = {ALPHA}: 'supported', else 'not supported', said as "
        "'opposite direction' where the estimate runs against the claim. The effect is shown with its "
        "<i>two-sided</i> 95% interval, so an estimate in the wrong direction is seen; the one-sided interval of a "
        "one-sided test is in the details. <i>MDE</i>: the effect the test used detects with 80% power at the alpha "
        "of its verdict (Holm's step, alpha / (m - k + 1) for the row ranked k of m by raw p), from the observed "
        "sd; 'underpowered' marks a row that did not find the effect where the MDE exceeds the paper's effect (for "
        "a claim of no effect, its margin). 'not enough seeds': a directional claim whose exact sign-flip check "
        "cannot reach alpha at these sizes (fewer than 5 pairs), or a claim of no effect without an interval. A "
        "claim of <i>no</i> effect reads its 95% interval against ± <i>margin</i>: 'consistent with no effect' "
        "when it lies inside (a small effect, said so, when it also excludes 0), 'differs' only when it lies "
        "wholly outside, else 'inconclusive'. A <i>precondition</i> (this project's choice, not the paper's) is "
        "a reading aid: an unmet one adds a mark under the verdict, with what was measured against what it needs, "
        "and never replaces the verdict. A minimum-MAD claim is repeated with CLS-sink heads kept (sensitivity, "
        "outside the Holm family); dSSDC is tested per image and on the paper's estimator, and only the latter "
        "stands beside the paper's 0.473. <i>did not learn A / "
        "B</i>: trials of each group within 2 points of chance accuracy; the verdict is on the trials that "
        "learned, the <i>(all trials)</i> columns repeat the claim with them kept (their measurements as they "
        "are), and <i>survivors vs all</i> flags a claim whose two verdicts disagree. <i>paper A / B</i>: the "
        "paper's numbers for the two groups where this data set's setting matches the paper's (Study P: "
        "ImageNet-100 or 224 px; Study L: CIFAR-100). Up front: each claim's <i>n</i> (trials in A / B, and "
        "pairs), its effect A - B with the two-sided 95% CI, the p the verdict uses (Holm-adjusted where given) "
        "and the verdict (grey where the data cannot decide); <i>details</i> under each claim holds every other "
        "column of claims.csv.</p>",
        _claims_html(claims),
    ]
    for key, title in SECTIONS.items():
        parts += [f"<h2 id='{key}'>{_e(title)}</h2>", *body[key]]
    parts += ["<h2 id='config'>Configuration</h2>", _config_html(data),
              "<h2 id='paper'>Paper numbers (for reference)</h2>",
              "<p class='caption'>As reported in STUDIES.md. Drawn beside ours as markers only where the setting "
              "matches (Study P: ImageNet-100 / 224 px; Study L: CIFAR-100); otherwise compare with care: severities "
              "set for 224 px are far harsher at 32 px, and Study L's MAD normalisation is not published.</p>",
              _table(paper_reference_table()),
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


# The claims table up front: what a reader scans (<= 8 columns, fits a 1,400-px window); every other
# column of ``claims.csv`` sits in a details row under its claim.
CLAIM_COLUMNS = ("claim", "setting", "n", "effect [95% CI, two-sided]", "p (adjusted)", "verdict")


def _verdict_table(claims: pd.DataFrame) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in CLAIM_COLUMNS)
    rows = []
    for claim in claims.to_dict("records"):
        verdict = str(claim.get("verdict", ""))
        pairs = claim.get("n pairs")
        n = f"{_int(claim.get('n A'))} / {_int(claim.get('n B'))}" + (
            f" ({_int(pairs)} pairs)" if _number(pairs) and pairs > 0 else "")
        effect = claim.get("effect (A - B)")
        shown = "—" if not _number(effect) else f"{effect:+.3f} {claim.get(TWO_SIDED) or ''}".strip()
        p = claim.get("p (Holm)")  # the p the verdict uses
        cells = [f"<td class='claim'>{_e(claim.get('paper', ''))}: {_e(claim['claim'])}</td>",
                 f"<td class='claim'>{_e(claim.get('setting', ''))}</td>", f"<td>{_e(n)}</td>",
                 f"<td>{_e(shown)}</td>", f"<td>{'—' if not _number(p) else f'{p:.3g}'}</td>",
                 f"<td class='{_verdict_class(verdict)}'>{_e(verdict)}</td>"]
        rest = {k: v for k, v in claim.items() if k not in {"claim", "setting", "verdict", "paper"}}
        details = "".join(f"<tr><th>{_e(k)}</th><td{_flag(v)}>{_e(_cell(v))}</td></tr>" for k, v in rest.items())
        if claim.get("reading aid"):  # an unmet precondition: beside the verdict, never in its place
            cells[-1] = cells[-1].replace("</td>", f"<br><small class='aid'>{_e(claim['reading aid'])}</small></td>")
        if claim.get("survivors vs all") == "DISAGREE":  # the verdict changes with the non-learners kept
            cells[-1] = cells[-1].replace("</td>", f"<br><small>all trials: {_e(claim.get('verdict (all trials)'))}"
                                                   "</small></td>")
        rows += [f"<tr>{''.join(cells)}</tr>",
                 f"<tr class='details'><td colspan='{len(CLAIM_COLUMNS)}'><details><summary>details</summary>"
                 f"<table class='kv'>{details}</table></details></td></tr>"]
    return f"<table class='claims'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _verdict_class(verdict: str) -> str:
    """The verdict cell's class: green supported, red against the claim, neutral where the data cannot decide."""
    if verdict == "supported":
        return "v-supported"
    if verdict.startswith(("not supported", "differs")):
        return "v-not-supported"
    return "v-neutral"  # not enough seeds, inconclusive, consistent with no effect


def _flag(v) -> str:
    return " class='v-differs'" if v == "DISAGREE" else ""


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not pd.isna(v)


def _int(v) -> str:
    return str(int(v)) if _number(v) else "—"


def _cell(v) -> str:
    if isinstance(v, float):
        return "—" if pd.isna(v) else f"{v:.4g}"
    return "—" if v is None else str(v)


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
            "paper's estimator (one per 1,000 images), the only one its 0.473 compares with. Every seed is measured on the same images, so the seed spread holds no test-set sampling "
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


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
