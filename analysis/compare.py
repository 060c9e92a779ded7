"""Two results folders of one study side by side: the same claims and conditions, for two code
versions or two recipes.

    vitsweep compare results-v1 results-v2 study_l          # prints both tables, writes them as CSV
    compare("results-v1", "results-v2", "study_l")           # -> {"claims": df, "conditions": df}

A claim row is one claim on one setting (``analysis.claims``), a condition row one condition
(``analysis.condition_tables.conditions_numbers``); a row only one folder has keeps its place, the other
side empty. Columns of A and B carry the suffixes `` (A)`` and `` (B)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.claims import evaluate_claims
from analysis.condition_tables import conditions_numbers
from analysis.labels import FACTORS
from analysis.study_data import StudyData

CLAIM_KEYS = ("paper", "claim", "setting")
CLAIM_VALUES = ("n A", "n B", "effect (A - B)", "95% CI of effect", "p (Holm)", "verdict")
CONDITION_VALUES = ("n", "test_acc mean", "min_mad mean", "dssdc mean", "fs_jpeg mean", "fs_blur mean")


def compare(results_a: str, results_b: str, study: str) -> dict[str, pd.DataFrame]:
    """{"claims", "conditions"}: the study's tables from both folders, joined on their keys."""
    data = [StudyData.load(results, study) for results in (results_a, results_b)]
    claims = [evaluate_claims(d) for d in data]
    conditions = [conditions_numbers(d) for d in data]
    keys = [c for c in (*FACTORS, *sorted(set().union(*(d.condition_fields for d in data)))) if
            all(c in t for t in conditions if not t.empty)]
    return {"claims": _side_by_side(claims, list(CLAIM_KEYS), CLAIM_VALUES),
            "conditions": _side_by_side(conditions, keys, CONDITION_VALUES)}


def _side_by_side(tables: list[pd.DataFrame], keys: list[str], values: tuple[str, ...]) -> pd.DataFrame:
    a, b = (t[[*keys, *(v for v in values if v in t)]] if not t.empty else pd.DataFrame(columns=keys)
            for t in tables)
    both = a.merge(b, on=keys, how="outer", suffixes=(" (A)", " (B)"), sort=True)
    ordered = [f"{v} ({side})" for v in values for side in "AB" if f"{v} ({side})" in both]
    return both[[*keys, *ordered]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_a", help="the first results folder (A)")
    parser.add_argument("results_b", help="the second results folder (B)")
    parser.add_argument("study", help="the study both folders hold")
    parser.add_argument("--out", help="folder for claims.csv and conditions.csv (default: compare-<study>)")


def run(args: argparse.Namespace) -> int:
    tables = compare(args.results_a, args.results_b, args.study)
    out = Path(args.out or f"compare-{args.study}")
    out.mkdir(parents=True, exist_ok=True)
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_colwidth", 60):
        for name, table in tables.items():
            table.to_csv(out / f"{name}.csv", index=False)
            print(f"{name} (A: {args.results_a}, B: {args.results_b}):\n{table.to_string(index=False)}\n")
    print(f"written: {out}/claims.csv, {out}/conditions.csv")
    return 0
