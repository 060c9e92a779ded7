"""The report's tables of numbers: Study L's protocol ablation and every condition's metrics.

Pure functions of a ``StudyData`` (``analysis.statistics.study_data``), mean ± std over seeds
(``analysis.statistics.seedstats``), with the papers' numbers beside them where the setting matches
(``analysis.statistics.paper_numbers``); the page (``analysis.reporting.page``) renders them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from analysis.statistics.labels import (FACTORS, METRIC_LABELS, SWITCH_LABELS, model_key, model_label, protocol_key,
                                        protocol_label)
from analysis.statistics.paper_numbers import PAPER_L_CUTMIX_MAX, PAPER_L_NO_CUTMIX_MIN, condition_numbers
from analysis.statistics.seedstats import INTERVAL, mean_ci, mean_std, seed_summary
from records.vocab import SWITCHES, protocol_switches

if TYPE_CHECKING:
    from analysis.statistics.study_data import StudyData


def ablation_tables(data: StudyData) -> list[tuple[str, pd.DataFrame, str]]:
    """Study L's protocol ablation per dataset: (dataset, table, separation note). Rows: protocols (all
    present, in ablation order); minimum MAD (smallest per-head MAD in the network) as mean ± std and
    test accuracy as mean [95% t interval] over seeds, with n. The note marks the paper's binary CutMix
    separation: the largest condition-mean minimum MAD among CutMix conditions against the smallest among
    the others."""
    pt = data.per_trial
    if pt.empty or pt["min_mad"].notna().sum() == 0:
        return []
    pinned, setting = data.pin(pt[pt["min_mad"].notna()], {"protocol"})
    out = []
    for dataset, g in pinned.groupby("dataset", sort=True):
        protocols = sorted(g["protocol"].unique(), key=protocol_key)
        if len(protocols) < 2:
            continue
        rows = []
        for proto in protocols:
            t = g[g["protocol"] == proto]
            sw = protocol_switches(proto)
            rows.append({"protocol": protocol_label(proto),
                         **{SWITCH_LABELS[s]: "✓" if sw[s] else "" for s in SWITCHES},
                         "min MAD": mean_std(t["min_mad"]), f"test acc [{INTERVAL}]": mean_ci(t["test_acc"]),
                         "n": len(t), "_mean": t["min_mad"].mean(), "_cutmix": sw["cutmix"]})
        table = pd.DataFrame(rows)
        note = _separation_note(table, g) + (f" Other factors: {setting}." if setting else "")
        out.append((str(dataset), table.drop(columns=["_mean", "_cutmix"]), note))
    return out


def _separation_note(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    cm, other = table[table["_cutmix"]], table[~table["_cutmix"]]
    if cm.empty or other.empty:
        return "CutMix separation: needs conditions with and without CutMix."
    hi, lo = cm.loc[cm["_mean"].idxmax()], other.loc[other["_mean"].idxmin()]
    verdict_means = "separate" if hi["_mean"] < lo["_mean"] else "overlap"
    cut = runs["cutmix"].astype(bool)
    by_run = "separate" if runs.loc[cut, "min_mad"].max() < runs.loc[~cut, "min_mad"].min() else "overlap"
    return (f"CutMix separation (paper: <= {PAPER_L_CUTMIX_MAX} vs >= {PAPER_L_NO_CUTMIX_MIN}): largest "
            f"CutMix condition mean {hi['_mean']:.3f} ({hi['protocol']}) vs smallest non-CutMix "
            f"{lo['_mean']:.3f} ({lo['protocol']}): condition means {verdict_means}; single runs {by_run}.")


def layer_tables(data: StudyData) -> list[tuple[str, pd.DataFrame, str]]:
    """Study L's claim is about early layers, so MAD and entropy per protocol and layer: (dataset,
    table, the factors held), one row per protocol and layer, each metric the mean over the layer's
    heads per trial (CLS sinks included, as ``mad_early``), then mean [95% t interval] over seeds, with
    n. The report and ``bench/pilot_page.py`` print it."""
    frames = [data.select("clean", m, per_layer=True, per_head=True) for m in ("mad", "entropy")]
    rows = pd.concat([f for f in frames if not f.empty]) if any(not f.empty for f in frames) else None
    if rows is None or (rows["metric"] == "mad").sum() == 0:
        return []
    rows, setting = data.pin(rows, {"protocol"})
    per_trial = rows.groupby(["dataset", "protocol", "layer", "metric", "trial_id"])["value"].mean().reset_index()
    out = []
    for dataset, g in per_trial.groupby("dataset", sort=True):
        table = []
        cells = {key: c["value"] for key, c in g.groupby(["protocol", "layer", "metric"])}
        for protocol, layer in sorted({k[:2] for k in cells}, key=lambda k: (protocol_key(k[0]), k[1])):
            mad, entropy = cells.get((protocol, layer, "mad"), []), cells.get((protocol, layer, "entropy"), [])
            table.append({"protocol": protocol_label(protocol), "layer": int(layer), "n": len(mad),
                          f"MAD [{INTERVAL}]": mean_ci(mad), f"entropy [{INTERVAL}]": mean_ci(entropy)})
        out.append((str(dataset), pd.DataFrame(table), setting))
    return out


# dSSDC on both scales side by side: per image (the project's) and per 1,000 images (the paper's, the
# one its 0.473 compares with; ``docs/studies.md``, "One scale per comparison").
CONDITION_METRICS = ("test_acc", "min_mad", "mad_early", "dssdc", "dssdc_per_batch", "fs_jpeg", "fs_blur")
SAMPLING_SE = {"test_acc": "test_acc_se", "fs_jpeg": "fs_jpeg_se", "fs_blur": "fs_blur_se"}  # per_trial columns


def conditions_table(data: StudyData) -> pd.DataFrame:
    """Every condition (dataset x pe x token order x protocol x each ``data.condition_fields``) with n and
    each metric as mean ± std, test accuracy also with its 95% t interval over seeds (``INTERVAL``).
    Beside accuracy and fragility: their standard error from ``n images`` (binomial for accuracy, the
    delta method over the paired counts for FS; mean over the condition's trials), the test-set sampling
    error the seed spread does not contain; and how many of the n trials ``did not learn``."""
    pt = data.per_trial
    if pt.empty:
        return pd.DataFrame()
    metrics = [m for m in CONDITION_METRICS if m in pt and pt[m].notna().any()]
    extra = [c for c in data.condition_fields if c in pt]  # fields beyond the factors that split a cell
    rows = []
    for key, g in pt.groupby([*FACTORS, *extra], sort=False):
        dataset, pe, rpt, proto = key[:4]
        row = {"dataset": dataset, "PE": model_label(pe, rpt), "protocol": protocol_label(proto),
               **dict(zip(extra, key[4:])), "n": len(g),
               "did not learn": int(g["did_not_learn"].sum()) if "did_not_learn" in g else 0}
        if "n_images" in g and g["n_images"].notna().any():
            row["n images"] = "/".join(str(int(v)) for v in sorted(g["n_images"].dropna().unique()))
        for m in metrics:
            row[METRIC_LABELS[m]] = mean_std(g[m])
            if m == "test_acc":
                row[f"test accuracy [{INTERVAL}]"] = mean_ci(g[m])
            se = SAMPLING_SE.get(m)
            if se in g and g[se].notna().any():
                kind = "binomial" if m == "test_acc" else "delta-method"  # FS: from its paired counts
                row[f"{METRIC_LABELS[m]}: {kind} SE"] = f"{g[se].mean():.3f}"
        row["paper"] = condition_numbers(str(dataset), model_label(pe, rpt), proto,
                                         data.matches_paper_p(str(dataset)))
        rows.append({**row, "_key": (str(dataset), model_key(pe, rpt), protocol_key(proto), *map(str, key[4:]))})
    return pd.DataFrame(rows).sort_values("_key").drop(columns="_key").reset_index(drop=True)


# -- the same tables as numbers, for a paper (``analysis.reporting.report`` writes them as CSV and LaTeX) -------
def _numbers(row: dict, metric: str, values) -> None:
    """``<metric> mean``, ``std``, ``CI low``, ``CI high`` of one value per trial (NaN where there is none)."""
    s = seed_summary(values)
    row.update({f"{metric} mean": s.mean, f"{metric} std": s.std, f"{metric} CI low": s.low,
                f"{metric} CI high": s.high})


def conditions_numbers(data: StudyData) -> pd.DataFrame:
    """``conditions_table`` as numbers: per condition its factors, n, did not learn, and for each metric
    the mean, std and ``INTERVAL`` over seeds (NaN where a metric has no value)."""
    pt = data.per_trial
    if pt.empty:
        return pd.DataFrame()
    keys = [*FACTORS, *(c for c in data.condition_fields if c in pt)]
    rows = []
    for key, g in pt.groupby(keys, sort=True):
        row = {**dict(zip(keys, key)), "n": len(g),
               "did not learn": int(g["did_not_learn"].sum()) if "did_not_learn" in g else 0}
        for m in CONDITION_METRICS:
            _numbers(row, m, g[m] if m in g else [])
        rows.append(row)
    return pd.DataFrame(rows)


def ablation_numbers(data: StudyData) -> pd.DataFrame:
    """``ablation_tables`` as numbers: per data set and protocol (other factors pinned as there), its
    switches, n, and minimum MAD and test accuracy as mean, std and 95% CI over seeds."""
    pt = data.per_trial
    if pt.empty or pt["min_mad"].notna().sum() == 0:
        return pd.DataFrame()
    pinned, _ = data.pin(pt[pt["min_mad"].notna()], {"protocol"})
    rows = []
    for (dataset, proto), g in pinned.groupby(["dataset", "protocol"], sort=True):
        row = {"dataset": dataset, "protocol": proto, **protocol_switches(proto), "n": len(g)}
        for m in ("min_mad", "test_acc"):
            _numbers(row, m, g[m])
        rows.append(row)
    return pd.DataFrame(rows)
