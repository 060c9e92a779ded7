"""The claims section of the report's page, what a reader sees first: a caption of three lines and a
colour legend, the claims table (``CLAIM_COLUMNS``; every other column of ``claims.csv`` in a details
row under its claim), the claims without data folded below it, then "How to read this table".

``visible_claims`` is the table as shown, text with blank cells where there is no number; the report
also writes it as ``claims.tex`` (``analysis.reporting.report``). Nothing is computed here that
``analysis.statistics.claims`` does not give.
"""

from __future__ import annotations

import html

import pandas as pd

from analysis.statistics.claim_tests import MDE, TWO_SIDED
from analysis.statistics.seedstats import ALPHA

# What a reader scans (7 columns, fits a 1,400-px window); NOTE goes under the verdict on the page.
CLAIM_COLUMNS = ("claim", "setting", "n", "effect (A - B)", "95% CI (two-sided)", "p (adjusted)", "verdict")
NOTE = "note"  # an unmet precondition's mark; the verdict with the non-learners kept where it differs

# Verdict colours: green where the data back the claim, red where they do not, grey where they cannot decide.
BACKED, AGAINST, UNDECIDED = "v-supported", "v-not-supported", "v-neutral"
CSS = """
.v-supported{background:#dff3df} .v-not-supported,.v-differs{background:#f7e0e0} .v-neutral{background:#f1f1f1}
table.claims{width:100%;table-layout:auto} table.claims td.claim{text-align:left;max-width:28em}
table.claims td.num{white-space:nowrap} p.tally{margin:.3em 0;font-size:.95em}
table.claims td:last-child{text-align:left}
table.claims tr.details td{border-top:0;padding:0 7px 4px;text-align:left;font-size:.9em}
table.claims tr.details summary{color:#555;cursor:pointer} table.kv th{text-align:left;font-weight:normal}
small.aid{color:#7a4d00} p.lead{font-size:.95em;max-width:1100px;margin:.4em 0}
p.legend{font-size:.85em;color:#333;margin:.3em 0 .6em}
p.legend span.sw{display:inline-block;width:.9em;height:.9em;border:1px solid #bbb;vertical-align:-.1em;
margin-right:.3em}
section.how{font-size:.85em;color:#333;max-width:1100px} section.how li{margin:.25em 0}
"""


def visible_claims(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims with data as the page shows them: ``CLAIM_COLUMNS`` and ``NOTE`` as text, a cell blank
    where there is no number (no interval below two seeds, no p without a test)."""
    rows = []
    for claim in claims[claims["verdict"] != "no data"].to_dict("records") if not claims.empty else []:
        pairs, effect, p = claim.get("n pairs"), claim.get("effect (A - B)"), claim.get("p (Holm)")
        n = f"{_int(claim.get('n A'))} / {_int(claim.get('n B'))}"
        if _number(pairs) and pairs > 0:
            n += f" ({int(pairs)} pair{'s' if pairs > 1 else ''})"
        notes = [_text(claim.get("reading aid"))]
        if claim.get("survivors vs all") == "DISAGREE":  # the verdict changes with the non-learners kept
            notes.append(f"all trials: {_text(claim.get('verdict (all trials)'))}")
        rows.append({"claim": f"{claim['paper']}: {claim['claim']}", "setting": _text(claim.get("setting")), "n": n,
                     "effect (A - B)": f"{effect:+.3f}" if _number(effect) else "",
                     "95% CI (two-sided)": _text(claim.get(TWO_SIDED)),
                     "p (adjusted)": f"{p:.3g}" if _number(p) else "",
                     "verdict": _text(claim.get("verdict")), NOTE: "; ".join(filter(None, notes))})
    return pd.DataFrame(rows, columns=[*CLAIM_COLUMNS, NOTE])


def claims_section(claims: pd.DataFrame) -> str:
    """The caption, the legend, the table, the claims without data (folded) and how to read it."""
    lead = ("<p class='lead'>Each row tests one claim of the two papers on this study's trials, per data set, the "
            "factors the claim does not name held at one value (<i>setting</i>). <i>effect</i>: the mean of A - B "
            "over seeds, with its two-sided 95% interval (blank below two seeds); <i>p</i>: Holm-adjusted per paper "
            "and data set. How each verdict is reached: <a href='#how-to-read'>How to read this table</a>, below; "
            "<i>details</i> under a row holds every column of claims.csv.</p>")
    if claims.empty:
        return lead + "<p class='omitted'>No claim could be tested: there are no trials.</p>"
    missing = claims["verdict"] == "no data"
    shown = _table_html(claims[~missing]) if (~missing).any() else "<p class='omitted'>No claim has data.</p>"
    folded = ""
    if missing.any():
        rest = claims.loc[missing, ["paper", "claim", "metric", "A", "B"]]
        folded = (f"<details><summary>{int(missing.sum())} claim(s) without data in this study</summary>"
                  + rest.to_html(index=False, border=0, na_rep="", escape=True) + "</details>")
    return lead + _tally(claims[~missing]) + _legend() + shown + folded + _how_to_read()


def _tally(claims: pd.DataFrame) -> str:
    """The verdicts counted by colour, and why none decides where no row can (the seeds it needs)."""
    if claims.empty:
        return ""
    colours = claims["verdict"].map(verdict_class).value_counts()
    said = [f"{colours.get(BACKED, 0)} back their claim", f"{colours.get(AGAINST, 0)} do not",
            f"{colours.get(UNDECIDED, 0)} cannot decide"]
    why = ""
    if (claims["verdict"] == "not enough seeds").all():
        why = (" At these seed counts no claim can be decided: each effect is an estimate only. A directional claim "
               "needs 5 paired seeds (<code>--seeds 5</code>), a claim of no effect 2.")
    return f"<p class='tally'><b>{len(claims)} rows tested:</b> {', '.join(said)}.{why}</p>"


def _legend() -> str:
    swatch = "<span class='sw {}'></span>"
    return ("<p class='legend'>" + " &nbsp; ".join([
        swatch.format(BACKED) + "the data back the claim: <i>supported</i>; for a claim of no effect, <i>consistent "
        "with no effect</i>",
        swatch.format(AGAINST) + "they do not: <i>not supported</i>, <i>opposite direction</i>, <i>differs</i>",
        swatch.format(UNDECIDED) + "they cannot decide: <i>not enough seeds</i>, <i>inconclusive</i>",
        "<small class='aid'>brown text</small>: a precondition not met, by how much (the verdict stands)"]) + "</p>")


def _table_html(claims: pd.DataFrame) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in CLAIM_COLUMNS)
    rows = []
    for claim, shown in zip(claims.to_dict("records"), visible_claims(claims).to_dict("records")):
        cells = [f"<td class='claim'>{_e(shown['claim'])}</td>", f"<td class='claim'>{_e(shown['setting'])}</td>",
                 *(f"<td class='num'>{_e(shown[c])}</td>" for c in CLAIM_COLUMNS[2:-1])]
        note = "".join(f"<br><small class='aid'>{_e(n)}</small>" for n in shown[NOTE].split("; ") if n)
        cells.append(f"<td class='{verdict_class(shown['verdict'])}'>{_e(shown['verdict'])}{note}</td>")
        rest = {k: v for k, v in claim.items() if k not in {"claim", "setting", "verdict", "paper"}}
        details = "".join(f"<tr><th>{_e(k)}</th><td{_flag(v)}>{_e(_cell(v))}</td></tr>" for k, v in rest.items())
        rows += [f"<tr>{''.join(cells)}</tr>",
                 f"<tr class='details'><td colspan='{len(CLAIM_COLUMNS)}'><details><summary>details</summary>"
                 f"<table class='kv'>{details}</table></details></td></tr>"]
    return f"<table class='claims'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def verdict_class(verdict: str) -> str:
    """The verdict cell's colour (``BACKED``, ``AGAINST``, ``UNDECIDED``): a claim of no effect whose
    interval lies inside its margin is backed as much as a directional claim that is supported."""
    if verdict == "supported" or verdict.startswith("consistent with no effect"):
        return BACKED
    if verdict.startswith(("not supported", "differs")):
        return AGAINST
    return UNDECIDED  # not enough seeds, inconclusive


def _how_to_read() -> str:
    items = [
        "<b>Units and pairing.</b> Units are trials (seeds). Trials of one seed share initialisation, data order, "
        "crops, CutMix boxes and RPT permutations, so where every seed appears once in each group the comparison is "
        "<i>paired by seed</i>: a paired t test of the mean per-seed difference A - B over the pairs decides, its p "
        "and its 95% interval from the same test (one-sided for a one-sided claim), with the exact sign-flip p "
        "beside it as a distribution-free check. A PE-scaling claim pairs within each trial, then across seeds; "
        "where seeds do not pair (a group pooling several conditions) Welch's t test decides. The details' "
        "<i>test</i> and <i>CI</i> say which.",
        f"<b>A directional claim</b> reads its Holm-adjusted p (the raw p values adjusted across the claims of one "
        f"paper on one data set) at alpha = {ALPHA}: <i>supported</i>, else <i>not supported</i>, said as "
        "<i>opposite direction</i> where the estimate runs against the claim. The table shows the two-sided 95% "
        "interval, so an estimate in the wrong direction is seen; the one-sided interval of a one-sided test is in "
        "the details.",
        "<b>A claim of no effect</b> reads its 95% interval against ± <i>margin</i>: <i>consistent with no "
        "effect</i> when it lies inside (a small effect, said so, when it also excludes 0), <i>differs</i> only "
        "when it lies wholly outside, else <i>inconclusive</i>.",
        "<b>Not enough seeds</b>: a directional claim whose exact sign-flip check cannot reach alpha at these sizes "
        "(fewer than 5 pairs), or a claim of no effect without an interval (one seed). A blank cell: no interval "
        "or no p at these sizes.",
        f"<b>Power</b> (details): <i>{MDE}</i> is the effect the test detects, from the observed sd; the alpha of "
        "a verdict is Holm's step, alpha / (m - k + 1) for the row ranked k of m by raw p; <i>underpowered</i> "
        "marks a row that did not find the effect where the MDE exceeds the paper's effect (for a claim of no "
        "effect, its margin).",
        "<b>Preconditions</b> are this project's choices, not the papers': a reading aid. An unmet one adds a mark "
        "under the verdict, what was measured against what it needs and by how much it misses, and never replaces "
        "the verdict.",
        "<b>Repeated rows.</b> A minimum-MAD claim is repeated with CLS-sink heads kept (a sensitivity check, "
        "outside the Holm family); dSSDC is tested per image and on the paper's estimator, and only the latter "
        "stands beside the paper's 0.473; away from 224 px an FS claim is also tested on the mean over the "
        "severity grid. <i>setting</i> says which.",
        "<b>Trials that did not learn</b> (within 2 points of chance accuracy) are counted in the details "
        "(<i>did not learn A / B</i>) and left out of the verdict; the <i>(all trials)</i> columns repeat the "
        "claim with them kept, <i>survivors vs all</i> says whether the two verdicts agree, and one that "
        "changes is marked under the verdict.",
        "<b>The paper's numbers</b> (<i>paper A / B</i>, details) stand beside a row only where this data set's "
        "setting matches the paper's (Study P: ImageNet-100 or 224 px; Study L: CIFAR-100).",
    ]
    return ("<section class='how' id='how-to-read'><h3>How to read this table</h3><ul>"
            + "".join(f"<li>{item}</li>" for item in items) + "</ul></section>")


def _flag(v) -> str:
    return " class='v-differs'" if v == "DISAGREE" else ""


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not pd.isna(v)


def _int(v) -> str:
    return str(int(v)) if _number(v) else ""


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)


def _cell(v) -> str:
    return f"{v:.4g}" if _number(v) and isinstance(v, float) else _text(v)


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
