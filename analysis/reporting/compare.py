"""Two results folders of one study side by side: the same claims and conditions, for two code
versions or two recipes, and what changed between them.

    vitsweep compare results-v1 results-v2 study_l          # prints what changed, writes CSV and index.html
    compare("results-v1", "results-v2", "study_l")           # -> {"claims": df, "conditions": df}

A claim row is one claim on one setting (``analysis.statistics.claims``), a condition row one condition
(``analysis.reporting.condition_tables.conditions_numbers``); a row only one folder has keeps its place, the other
side empty. Columns of A and B carry the suffixes `` (A)`` and `` (B)``; beside each compared number its
difference ``A - B``, and per row ``verdict changed`` (claims) and ``A = B`` (every value the same). Rows
with data come first (a claim that has none in either folder last), in the claims' own order.
"""

from __future__ import annotations

import argparse
import html
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.reporting.condition_tables import conditions_numbers
from analysis.statistics.claim_tests import TWO_SIDED
from analysis.statistics.claims import evaluate_claims
from analysis.statistics.labels import FACTORS, model_label, protocol_label
from analysis.statistics.study_data import StudyData

CLAIM_KEYS = ("paper", "claim", "setting")
# The claim's columns as compare names them: the folders are A and B, so a claim's groups are "group A / B".
CLAIM_VALUES = {"n A": "n group A", "n B": "n group B", "effect (A - B)": "effect", TWO_SIDED: "95% CI (two-sided)",
                "p (Holm)": "p (Holm)", "verdict": "verdict"}
CONDITION_VALUES = ("n", "test_acc mean", "min_mad mean", "dssdc mean", "fs_jpeg mean", "fs_blur mean")
DIFFERENCE = "A - B"  # suffix of a compared number's difference column
CHANGED, SAME = "verdict changed", "A = B"
WIDTH = 120  # the console table's width


def compare(results_a: str, results_b: str, study: str) -> dict[str, pd.DataFrame]:
    """{"claims", "conditions"}: the study's tables from both folders, joined on their keys, with the
    differences A - B, ``verdict changed`` and ``A = B``; rows with data first."""
    data = [StudyData.load(results, study) for results in (results_a, results_b)]
    claims = [evaluate_claims(d).rename(columns=CLAIM_VALUES) for d in data]
    conditions = [conditions_numbers(d) for d in data]
    keys = [c for c in (*FACTORS, *sorted(set().union(*(d.condition_fields for d in data)))) if
            all(c in t for t in conditions if not t.empty)]
    claims = _side_by_side(claims, list(CLAIM_KEYS), tuple(CLAIM_VALUES.values()), ("effect",))
    verdicts = claims[["verdict (A)", "verdict (B)"]].fillna("no data")
    claims.insert(len(CLAIM_KEYS), CHANGED, verdicts["verdict (A)"] != verdicts["verdict (B)"])
    data_first = _has_data(claims)
    claims = pd.concat([claims[data_first], claims[~data_first]], ignore_index=True)
    numbers = tuple(v for v in CONDITION_VALUES if v != "n")
    return {"claims": claims, "conditions": _side_by_side(conditions, keys, CONDITION_VALUES, numbers)}


def _has_data(claims: pd.DataFrame) -> pd.Series:
    """The claim rows with a verdict other than "no data" in either folder."""
    return (claims[["verdict (A)", "verdict (B)"]].fillna("no data") != "no data").any(axis=1)


def _side_by_side(tables: list[pd.DataFrame], keys: list[str], values: tuple[str, ...],
                  numbers: tuple[str, ...]) -> pd.DataFrame:
    """The two tables joined on ``keys`` in A's order (B's own rows after), each value as ``v (A)``, ``v (B)``
    and, for ``numbers``, ``v: A - B``; ``A = B`` where every value is the same (NaN equal to NaN)."""
    a, b = (t[[*keys, *(v for v in values if v in t)]].assign(**{f"_order {i}": range(len(t))}) if not t.empty
            else pd.DataFrame(columns=[*keys, f"_order {i}"]) for i, t in enumerate(tables))
    both = a.merge(b, on=keys, how="outer", suffixes=(" (A)", " (B)"))  # an outer merge sorts its keys:
    both = both.sort_values(["_order 0", "_order 1"], na_position="last", ignore_index=True)  # A's order back
    same = pd.Series(True, index=both.index)
    ordered = []
    for v in values:
        if f"{v} (A)" not in both:
            continue
        left, right = both[f"{v} (A)"], both[f"{v} (B)"]
        ordered += [f"{v} (A)", f"{v} (B)"]
        if v in numbers:
            both[f"{v}: {DIFFERENCE}"] = pd.to_numeric(left, errors="coerce") - pd.to_numeric(right, errors="coerce")
            ordered.append(f"{v}: {DIFFERENCE}")
        same &= _equal(left, right)
    both[SAME] = same
    return both[[*keys, *ordered, SAME]]


def _equal(left: pd.Series, right: pd.Series) -> pd.Series:
    """Per row: the same value in A and B (two missing values are the same; numbers to 1e-12)."""
    missing = left.isna() & right.isna()
    try:
        close = np.isclose(left.astype(float), right.astype(float), rtol=0, atol=1e-12)
    except (TypeError, ValueError):
        close = (left == right).to_numpy()
    return pd.Series(close, index=left.index) | missing


# -- what a reader sees: the console table and the HTML page ---------------------------------------
def short_verdict(verdict) -> str:
    """A verdict's first words: ``consistent with no effect`` for the long forms (the CSV has them whole)."""
    return "no data" if not isinstance(verdict, str) else verdict.split(" (")[0].split(":")[0]


def claim_lines(claims: pd.DataFrame, show_all: bool = False, width: int = WIDTH) -> list[str]:
    """The claims as fixed-width lines of at most ``width`` characters: ``*`` marks a changed verdict;
    equal rows and claims without data in either folder are folded into a count unless ``show_all``."""
    data = claims[_has_data(claims)]
    shown = claims if show_all else data[~data[SAME]]
    verdicts = [f"{short_verdict(r['verdict (A)'])} -> {short_verdict(r['verdict (B)'])}" if r[CHANGED]
                else short_verdict(r["verdict (A)"]) for r in shown.to_dict("records")]
    label = max(40, width - 32 - max(map(len, verdicts), default=14))
    lines = [f"  {'claim (its setting below)':<{label}} {'effect A':>8} {'effect B':>8} {'A - B':>8}"
             "   verdict (A -> B)"]
    for row, verdict in zip(shown.to_dict("records"), verdicts):
        name = _clip(f"{row['paper']}: {row['claim']}", label)
        lines += [f"{'*' if row[CHANGED] else ' '} {name:<{label}} {_fmt('effect', row['effect (A)']):>8} "
                  f"{_fmt('effect', row['effect (B)']):>8} {_fmt(DIFFERENCE, row[f'effect: {DIFFERENCE}']):>8}   "
                  f"{verdict}", "    " + _clip(row["setting"] if isinstance(row["setting"], str) else "", width - 4)]
    folded = [] if show_all else [f"{int(data[SAME].sum())} equal", f"{len(claims) - len(data)} without data in either"]
    return lines + ([f"  ({', '.join(folded)} folded: --all shows them)"] if any(not f.startswith("0 ") for f in folded)
                    else [])


def condition_lines(conditions: pd.DataFrame, show_all: bool = False) -> list[str]:
    """The conditions, one line per condition and metric that has a value: A, B and A - B; equal
    conditions folded into a count unless ``show_all``."""
    shown = conditions if show_all else conditions[~conditions[SAME]]
    lines = [f"  {'condition':<36} {'':<14} {'A':>8} {'B':>8} {'A - B':>8}"]
    for row in shown.to_dict("records"):
        name = _clip(condition_name(row), 36)
        lines.append(f"  {name:<36} {'n':<14} {_fmt('n', row.get('n (A)')):>8} {_fmt('n', row.get('n (B)')):>8}")
        for v in CONDITION_VALUES[1:]:
            if f"{v} (A)" in row and not (pd.isna(row[f"{v} (A)"]) and pd.isna(row[f"{v} (B)"])):
                lines.append(f"  {'':<36} {v.removesuffix(' mean'):<14} {_fmt(v, row[f'{v} (A)']):>8} "
                             f"{_fmt(v, row[f'{v} (B)']):>8} {_fmt(DIFFERENCE, row[f'{v}: {DIFFERENCE}']):>8}")
    if not show_all and conditions[SAME].any():
        lines.append(f"  ({int(conditions[SAME].sum())} equal condition(s) folded: --all shows them)")
    return lines


def condition_name(row: dict) -> str:
    """``cifar100, ape + RPT, CutMix`` and any extra field that splits the condition, as the report names it."""
    parts = [str(row.get("dataset")), model_label(row.get("pe"), bool(row.get("rpt"))),
             protocol_label(str(row.get("protocol")))]
    extra = [f"{k} = {v}" for k, v in row.items() if k not in FACTORS and " (" not in k and ": " not in k and k != SAME]
    return ", ".join(parts + extra)


def page(tables: dict[str, pd.DataFrame], results_a: str, results_b: str, study: str) -> str:
    """A self-contained HTML page: both tables as the reader compares them (verdicts and effects first),
    changed verdicts highlighted, rows the same in both folders (or without data) folded."""
    css = ("body{font-family:system-ui,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;color:#222}"
           "table{border-collapse:collapse;font-size:.85em;margin:.6em 0}th,td{border:1px solid #ddd;padding:3px 7px}"
           "th{background:#f3f3f3}td{text-align:right;white-space:nowrap}td.t{text-align:left;white-space:normal}"
           "td.claim{min-width:22em}td.set{min-width:14em}tr.changed td{background:#fff3cd}td.neg{color:#a40000}"
           "td.pos{color:#075e00}.meta{color:#555}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>vitsweep compare: {_e(study)}</title>"
             f"<style>{css}</style></head><body><h1>vitsweep compare: {_e(study)}</h1>",
             f"<p class='meta'>A: {_e(results_a)} · B: {_e(results_b)}. Rows with data first, a changed verdict "
             "highlighted, <i>A - B</i> beside each compared number (green above 0, red below); rows the same in "
             "both folders are folded. claims.csv and conditions.csv beside this page hold every column.</p>"]
    claims, conditions = tables["claims"], tables["conditions"]
    data = _has_data(claims)
    for name, table, differ in (("Claims", claims, data & ~claims[SAME]),
                                ("Conditions", conditions, ~conditions[SAME])):
        shown = _claims_view(table) if name == "Claims" else _conditions_view(table)
        changed = f", {int(claims[CHANGED].sum())} verdict(s) changed" if name == "Claims" else ""
        parts += [f"<h2>{name}</h2><p>{int(differ.sum())} of {len(table)} row(s) differ{changed}.</p>",
                  _html_table(shown[differ.to_numpy()]),
                  f"<details><summary>{int((~differ).sum())} row(s) the same in A and B"
                  + (", or without data in either" if name == "Claims" else "") + "</summary>"
                  + _html_table(shown[~differ.to_numpy()]) + "</details>"]
    return "\n".join([*parts, "</body></html>"])


def _claims_view(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims as the page shows them: verdicts and effects first, a claim's two group sizes in one cell."""
    def sizes(side: str) -> list[str]:
        return [f"{_fmt('n', a)} / {_fmt('n', b)}".strip(" /")
                for a, b in zip(claims[f"n group A ({side})"], claims[f"n group B ({side})"])]

    return pd.DataFrame({
        "claim": claims["paper"] + ": " + claims["claim"], "setting": claims["setting"].fillna(""),
        "verdict (A)": claims["verdict (A)"].map(short_verdict),
        "verdict (B)": claims["verdict (B)"].map(short_verdict),
        CHANGED: claims[CHANGED].map({True: "changed", False: ""}),
        **{c: claims[c] for c in ("effect (A)", "effect (B)", f"effect: {DIFFERENCE}")},
        **{f"95% CI ({s})": claims[f"95% CI (two-sided) ({s})"] for s in "AB"},
        **{f"p (Holm) ({s})": claims[f"p (Holm) ({s})"] for s in "AB"},
        "n groups A / B (A)": sizes("A"), "n groups A / B (B)": sizes("B")})


def _conditions_view(conditions: pd.DataFrame) -> pd.DataFrame:
    view = {"condition": [condition_name(r) for r in conditions.to_dict("records")]}
    view.update({c.replace(" mean", ""): conditions[c] for c in conditions.columns
                 if c.startswith(tuple(CONDITION_VALUES)) and c not in FACTORS})
    return pd.DataFrame(view)


def _html_table(table: pd.DataFrame) -> str:
    if table.empty:
        return "<p><i>(none)</i></p>"
    head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
    rows = []
    for row in table.to_dict("records"):
        cells = []
        for c, v in row.items():
            kind = ("claim t" if c in ("claim", "condition") else "set t" if c == "setting"
                    else "" if c.startswith("95% CI") else "t" if not _number(v)
                    else "neg" if c.endswith(DIFFERENCE) and v < 0 else "pos" if c.endswith(DIFFERENCE) and v > 0
                    else "")
            cells.append(f"<td class='{kind}'>{_e(_fmt(c, v))}</td>")
        rows.append(f"<tr{' class=changed' if row.get(CHANGED) else ''}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else textwrap.shorten(text, width, placeholder="…") or text[: width - 1] + "…"


def _number(v) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and not pd.isna(v)


def _fmt(column: str, v) -> str:
    """A value as the console and the page show it: blank where missing; counts whole, p to 3 significant
    digits, effects and differences signed."""
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return ""
    if not _number(v):
        return str(v)
    if column == "n" or column.startswith(("n (", "n group")):
        return str(int(v))
    if column.startswith("p "):
        return f"{v:.3g}"
    return f"{v:+.3f}" if column.startswith("effect") or column.endswith(DIFFERENCE) else f"{v:.3f}"


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


# -- command line ---------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_a", help="the first results folder (A)")
    parser.add_argument("results_b", help="the second results folder (B)")
    parser.add_argument("study", help="the study both folders hold")
    parser.add_argument("--out", help="folder for claims.csv, conditions.csv and index.html (default: compare-<study>)")
    parser.add_argument("--all", action="store_true", dest="show_all",
                        help="also print the rows that are the same in A and B, and claims without data in either")


def run(args: argparse.Namespace) -> int:
    tables = compare(args.results_a, args.results_b, args.study)
    out = Path(args.out or f"compare-{args.study}")
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    (out / "index.html").write_text(page(tables, args.results_a, args.results_b, args.study), encoding="utf-8")
    claims, conditions = tables["claims"], tables["conditions"]
    width = min(WIDTH, max(80, shutil.get_terminal_size((WIDTH, 24)).columns))
    print(f"A: {args.results_a}\nB: {args.results_b}\n\nclaims: {int(claims[CHANGED].sum())} verdict(s) changed "
          "(marked *)")
    print("\n".join(claim_lines(claims, args.show_all, width)))
    print(f"\nconditions: {int((~conditions[SAME]).sum())} of {len(conditions)} differ")
    print("\n".join(condition_lines(conditions, args.show_all)))
    print(f"\nwritten: {out}/claims.csv, conditions.csv, index.html")
    return 0
