"""What a condition is: the trials table cleaned, keyed by every field that varies, one trial per seed.

``normalise_trials`` turns the stored ``trials`` table into the report's unit of analysis: finished
trials with the factor columns (dataset, pe, rpt, protocol) filled in and named canonically, the
condition fields beyond the factors (``condition_fields``: a field that takes two or more values
inside one factor cell, such as an ``--set lr=...`` run or a second launch with other epochs), a
readable ``condition`` label, and exactly one trial per (condition, seed): a second trial of one
seed is a rerun, not a seed, and is named in the notes as an error instead of being pooled.
"""

from __future__ import annotations

import pandas as pd

from analysis.statistics.labels import FACTORS, model_label, protocol_label
from records.schema import TRIAL_FIELDS
from records.vocab import EXECUTION_FIELDS, SWITCHES, canonical_protocol, did_not_learn, protocol_switches

TRIAL_KEYS = ("trial_id", *FACTORS, "seed", "model", *SWITCHES)
# Trials columns that are no part of a condition: outcomes and bookkeeping, settings that change how a
# run executes but not what it computes, the seed (it makes a condition a trial), the protocol's
# switches (named by `protocol`) and the preset (its fields are columns of their own).
_NOT_CONDITION = {*TRIAL_FIELDS.names, *TRIAL_KEYS, *EXECUTION_FIELDS, "checkpoint_every", "preset", "condition"}


def normalise_trials(raw: pd.DataFrame, notes: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Finished trials with the factor columns filled in and named canonically, one per seed of each
    condition, and the condition fields beyond the factors."""
    if raw.empty or "trial_id" not in raw:
        return pd.DataFrame(columns=[*TRIAL_KEYS, "test_acc", "did_not_learn", "condition"]), []
    t = raw.copy()
    if "status" in t:
        others = t.loc[t["status"] != "finished", "status"].fillna("unknown").value_counts()
        if len(others):
            notes.append("not counted: " + ", ".join(f"{n} {s} trial(s)" for s, n in others.items()) + ".")
        t = t[t["status"] == "finished"]
    t = t.drop_duplicates("trial_id", keep="last")
    if "protocol" not in t and all(s in t for s in SWITCHES):
        t["protocol"] = ["+".join(s for s in SWITCHES if row[s]) or "baseline"
                         for row in t[list(SWITCHES)].to_dict("records")]
    for column, default in (("dataset", "unknown"), ("pe", "unknown"), ("protocol", "unknown"), ("seed", -1)):
        if column not in t:
            notes.append(f"trials have no {column!r} column: every trial counted as {column} = {default}.")
            t[column] = default
        t[column] = t[column].fillna(default)
    t["rpt"] = t["rpt"].fillna(False).astype(bool) if "rpt" in t else False
    t["protocol"] = t["protocol"].map(canonical_protocol)
    # The switches follow the protocol name, so a claim about "CutMix on" and one about protocol agree.
    t[list(SWITCHES)] = pd.DataFrame([protocol_switches(p) for p in t["protocol"]], index=t.index)
    t["model"] = [model_label(pe, rpt) for pe, rpt in zip(t["pe"], t["rpt"])]
    t["did_not_learn"] = _did_not_learn(t)
    extra = condition_fields(t)
    for column in extra:  # a field some trials lack (added later) is its own value, not a hole in a key
        t[column] = t[column].astype(object).where(t[column].notna(), "unset")
    t["condition"] = [_condition_label(row, extra) for row in t.to_dict("records")]
    t = _one_trial_per_seed(t, notes)
    if t["did_not_learn"].any():
        ids = t.loc[t["did_not_learn"], "trial_id"].tolist()
        notes.append(f"did not learn: {len(ids)} trial(s) ended within 2 points of chance accuracy; each claim's "
                     "verdict is on the trials that learned and is repeated with these kept (all trials): "
                     f"{', '.join(ids[:20])}{' …' if len(ids) > 20 else ''}.")
    return t.reset_index(drop=True), extra


def condition_fields(t: pd.DataFrame) -> list[str]:
    """Config columns beyond ``FACTORS`` that take two or more values among the trials of one
    (dataset, pe, rpt, protocol) cell: they make conditions of their own. A field that varies only
    with the factors (``num_classes`` with the data set) splits nothing and is not one."""
    if t.empty:
        return []
    cells = t.groupby(list(FACTORS), dropna=False)
    return [c for c in t.columns if c not in _NOT_CONDITION and c not in FACTORS
            and cells[c].nunique(dropna=False).max() > 1]


def _condition_label(row: dict, extra: list[str]) -> str:
    parts = [str(row["dataset"]), model_label(row["pe"], row["rpt"]), protocol_label(row["protocol"])]
    return ", ".join(parts + [f"{c}={row[c]}" for c in extra])


def _one_trial_per_seed(t: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """One trial per (condition, seed): a second trial of one seed is a rerun, not a seed. The latest
    (``ended_at`` where the table has it, else the last trial id) is kept; the report names the rest."""
    order = [c for c in ("ended_at", "trial_id") if c in t]
    t = t.sort_values(order, na_position="first", kind="stable")
    dup = t.duplicated(["condition", "seed"], keep="last")
    for (condition, seed), g in t[t.duplicated(["condition", "seed"], keep=False)].groupby(["condition", "seed"]):
        ids = g["trial_id"].tolist()
        notes.append(f"ERROR: condition '{condition}' has {len(ids)} trials with seed {seed} ({', '.join(ids)}): "
                     f"runs of one seed are not independent, so they are not pooled; only {ids[-1]} is counted. "
                     "Give reruns distinct seeds, or write them to another study.")
    return t[~dup]


def _did_not_learn(t: pd.DataFrame) -> pd.Series:
    """The trials table's flag; where it is absent (tables written before it existed), recomputed
    from the final eval_acc and num_classes as the training loop does."""
    stored = t["did_not_learn"] if "did_not_learn" in t else pd.Series(None, index=t.index, dtype=object)
    if "eval_acc" in t and "num_classes" in t:
        again = [did_not_learn(a, int(c)) if pd.notna(a) and pd.notna(c) else None
                 for a, c in zip(t["eval_acc"], t["num_classes"])]
        stored = stored.where(stored.notna(), pd.Series(again, index=t.index, dtype=object))
    return stored.map(lambda v: bool(v) if pd.notna(v) else False).astype(bool)
