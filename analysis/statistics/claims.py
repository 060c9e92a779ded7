"""The two papers' claims, tested on a study's seeds.

A claim compares two groups of trials on one per-trial metric (paired by seed where seeds pair), tests
a within-trial statistic across seeds (``Claim.b`` None), or a per-seed ranking of several groups
(``Claim.order``); the statistics of one claim are ``analysis.statistics.claim_tests``, the tests themselves
``analysis.statistics.seedstats``. The p values of one report are Holm-adjusted per paper and data set (one family
each): every directional verdict reads the adjusted p, a claim of no effect its 95% interval against its margin.
Trials flagged ``did_not_learn`` (final accuracy within 2 points of chance) are counted per group, and every
claim is computed twice: on the trials that learned (the verdict) and with the non-learners kept, their
measurements as they are (``verdict (all trials)``); a row whose two verdicts differ is flagged. A
precondition is a reading aid: the row keeps its test's verdict and an unmet one adds a mark
(``reading aid``, ``claim_tests.PRECONDITIONS``). A minimum-MAD claim is repeated with CLS-sink heads
kept, outside the Holm family (it repeats a test). It knows no plotting and no storage: it reads a
``StudyData``'s ``per_trial`` table and its ``pin`` method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from analysis.statistics.claim_tests import (HOLM_FAMILY, MDE, STEP_ALPHA, TWO_SIDED, Needs, claim_stats, decides,
                                             is_null, paper_numbers, power_mark, precondition, reading_aid, verdict)
from analysis.statistics.labels import METRIC_LABELS, group_label
from analysis.statistics.paper_numbers import PAPER_P_MODELS
from analysis.statistics.seedstats import ALPHA, holm, holm_step_alpha, mde
from records.vocab import MODERN, SWITCHES

if TYPE_CHECKING:
    from analysis.statistics.study_data import StudyData


@dataclass(frozen=True)
class Claim:
    """A claim as a comparison of two groups of trials on one per-trial metric.

    a, b: factor filters (``{"protocol": "cutmix"}``, ``{"pe": "ape", "rpt": True}``, ``{"cutmix": True}``);
    b None: ``metric`` is a within-trial difference (one value per trial of A), tested against 0.
    alternative: scipy's: "less" claims A < B, "greater" A > B, "two-sided" claims A = B (a null claim).
    margin: the largest |A - B| that counts as no effect, in the metric's units: a null claim is
    "consistent with no effect" only when the effect's 95% t interval lies inside [-margin, margin].
    separation: the claim is that *every* trial of A lies below every trial of B, and the means differ.
    needs: the claim's precondition (``claim_tests.Needs``, ``PRECONDITIONS``; None: it has none).
    order: a ranking claim: groups from the highest ``metric`` to the lowest; per seed, the Spearman
    correlation of the metric with that order (seeds with every group once), tested > 0 across seeds
    (``a`` and ``b`` unused).
    Factors named in neither filter are pinned to ``labels.REFERENCE`` where they vary; each dataset is its own row.
    """

    paper: str
    text: str
    metric: str
    a: dict = field(default_factory=dict)
    b: dict | None = field(default_factory=dict)
    alternative: str = "less"
    separation: bool = False
    margin: float = math.nan
    needs: Needs | None = None
    order: tuple[dict, ...] = ()


# No-effect margins per metric: 1 accuracy point; 0.02 of normalised MAD (Study L's CutMix runs sit
# <= 0.024, the others >= 0.210); 0.05 of dSSDC (the paper's APE scaling steps are >= 0.05); 0.02 of FS
# (the paper's seed spread, and one binomial SE at 1,000 images); the early layers' mean MAD and entropy
# take minimum MAD's 0.02 (both in [0, 1]); a Spearman correlation 0.2 (a fifth of a perfect ranking).
MARGINS = {"test_acc": 0.01, "min_mad": 0.02, "dssdc": 0.05, "fs_jpeg": 0.02, "fs_blur": 0.02, "mad_early": 0.02,
           "entropy_early": 0.02, "spearman": 0.2}
# "ape + RPT is as fragile as none": a quarter of the paper's none - ape gap in FS JPEG (0.646 - 0.435),
# three times the paper's own ape + RPT - none gap (0.016).
RPT_AS_NONE_MARGIN = 0.05
APE, APE_RPT = {"pe": "ape", "rpt": False}, {"pe": "ape", "rpt": True}


def _claim(paper: str, text: str, metric: str, a: dict, b: dict | None, alternative: str = "less", **kw) -> Claim:
    return Claim(paper, text, metric, a, b, alternative, margin=kw.pop("margin", MARGINS.get(metric)), **kw)


# The PEs without RPT by the paper's clean accuracy, best first: rope2d > sincos2d > ape > none.
PAPER_CLEAN_ORDER = tuple(sorted((pe for pe in PAPER_P_MODELS if "RPT" not in pe),
                                 key=lambda pe: -PAPER_P_MODELS[pe]["test_acc"]))

CLAIMS = (
    _claim("Study L", "CutMix alone lowers minimum MAD", "min_mad", {"protocol": "cutmix"}, {"protocol": "baseline"},
           needs=Needs.LOCAL_HEADS),
    _claim("Study L", "modern lowers minimum MAD (0.316 -> 0.008)", "min_mad", {"protocol": MODERN},
           {"protocol": "baseline"}, needs=Needs.LOCAL_HEADS),
    # Study L's own words: "more local and concentrated attention in early layers". A minimum over every
    # layer and head can stay put while the early layers change, so layers 0-1 are tested on their own.
    _claim("Study L", "CutMix alone makes early layers more local (mean MAD of layers 0-1)", "mad_early",
           {"protocol": "cutmix"}, {"protocol": "baseline"}),
    _claim("Study L", "modern makes early layers more local (mean MAD of layers 0-1)", "mad_early",
           {"protocol": MODERN}, {"protocol": "baseline"}),
    _claim("Study L", "CutMix alone concentrates early-layer attention (mean entropy of layers 0-1)",
           "entropy_early", {"protocol": "cutmix"}, {"protocol": "baseline"}),
    _claim("Study L", "modern concentrates early-layer attention (mean entropy of layers 0-1)", "entropy_early",
           {"protocol": MODERN}, {"protocol": "baseline"}),
    _claim("Study L", "every CutMix run has lower minimum MAD than every run without", "min_mad",
           {"cutmix": True}, {"cutmix": False}, separation=True, needs=Needs.LOCAL_HEADS),
    _claim("Study L", "AutoAugment alone leaves minimum MAD at baseline", "min_mad", {"protocol": "autoaugment"},
           {"protocol": "baseline"}, "two-sided", needs=Needs.LOCAL_HEADS),
    _claim("Study L", "label smoothing alone leaves minimum MAD at baseline", "min_mad",
           {"protocol": "label_smoothing"}, {"protocol": "baseline"}, "two-sided", needs=Needs.LOCAL_HEADS),
    _claim("Study L", "CutMix adds accuracy", "test_acc", {"protocol": "cutmix"}, {"protocol": "baseline"}, "greater"),
    _claim("Study L", "AutoAugment adds accuracy", "test_acc", {"protocol": "autoaugment"}, {"protocol": "baseline"},
           "greater"),
    # The two gains over baseline differ by acc(AutoAugment) - acc(CutMix): the baseline cancels within a seed.
    _claim("Study L", "AutoAugment and CutMix add comparable accuracy (~6-7 points each)", "test_acc",
           {"protocol": "autoaugment"}, {"protocol": "cutmix"}, "two-sided"),
    _claim("Study P", "APE recovers SSDC under RPI more than none (dSSDC)", "dssdc", APE,
           {"pe": "none", "rpt": False}, "greater"),
    _claim("Study P", "RPT collapses APE's SSDC recovery under RPI (dSSDC)", "dssdc", APE_RPT, APE),
    _claim("Study P", "rope2d is less fragile to JPEG than ape", "fs_jpeg", {"pe": "rope2d", "rpt": False}, APE),
    _claim("Study P", "rope2d is less fragile to JPEG than sincos2d", "fs_jpeg", {"pe": "rope2d", "rpt": False},
           {"pe": "sincos2d", "rpt": False}),
    _claim("Study P", "rope2d is less fragile to blur than ape", "fs_blur", {"pe": "rope2d", "rpt": False}, APE),
    _claim("Study P", "none is more fragile to JPEG than ape", "fs_jpeg", {"pe": "none", "rpt": False}, APE,
           "greater"),
    _claim("Study P", "ape + RPT is more fragile to JPEG than ape", "fs_jpeg", APE_RPT, APE, "greater",
           needs=Needs.APE_FRAME),
    _claim("Study P", "ape + RPT is more fragile to blur than ape", "fs_blur", APE_RPT, APE, "greater",
           needs=Needs.APE_FRAME),
    _claim("Study P", "ape + RPT is as fragile to JPEG as none", "fs_jpeg", APE_RPT, {"pe": "none", "rpt": False},
           "two-sided", margin=RPT_AS_NONE_MARGIN, needs=Needs.APE_FRAME),
    _claim("Study P", "scaling the APE to 0.4 raises FS JPEG (FS at 0.4 - FS at 1.0 > 0)", "fs_jpeg_pe_scale_rise",
           APE, None, "greater", margin=MARGINS["fs_jpeg"], needs=Needs.APE_FRAME),
    _claim("Study P", "scaling the APE to 0.4 collapses dSSDC (dSSDC at 1.0 - at 0.4 > 0)", "dssdc_pe_scale_drop",
           APE, None, "greater", margin=MARGINS["dssdc"]),
    # The link itself, across every level rather than at two endpoints: as alpha falls dSSDC falls and
    # FS rises, so within a trial their rank correlation over alpha is negative.
    _claim("Study P", "scaling the APE links dSSDC and FS JPEG (per-trial Spearman over alpha 0.1-1.0 < 0)",
           "pe_scale_link", APE, None, margin=MARGINS["spearman"], needs=Needs.APE_FRAME),
    _claim("Study P", "clean accuracy ranks rope2d > sincos2d > ape > none (per-seed Spearman > 0)", "test_acc",
           {}, None, "greater", margin=MARGINS["spearman"],
           order=tuple({"pe": pe, "rpt": False} for pe in PAPER_CLEAN_ORDER)),
)

FS_GRID = {"fs_jpeg": "fs_jpeg_grid", "fs_blur": "fs_blur_grid"}  # the per-trial mean over the severity grid
HEADLINE_MARK, GRID_MARK = "paper's severity, 224 px", "mean FS over the measured severity grid"
# dSSDC on both scales (``docs/studies.md``, "One scale per comparison"): the per-image estimand, and the
# paper's estimator, the only one set beside the paper's 0.473.
PER_IMAGE_MARK, PER_BATCH_MARK = "one permutation per image", "the paper's estimator, one permutation per 1,000 images"
# Minimum MAD with CLS-sink heads kept: a sensitivity check of the 0.5 CLS-mass threshold, outside the family.
SINKS_KEPT = "min_mad_all_heads"
SINKS_KEPT_MARK = "sensitivity: CLS-sink heads kept (outside the Holm family)"
GRID_LABELS = {"fs_jpeg_grid": "FS JPEG, mean over the quality grid",
               "fs_blur_grid": "FS blur, mean over the sigma grid",
               SINKS_KEPT: "minimum MAD over every head, CLS sinks included"}
SCALING_LABELS = {"fs_jpeg_pe_scale_rise": "FS JPEG q5 at PE scale 0.4 - at 1.0",
                  "dssdc_pe_scale_drop": "dSSDC under RPI at PE scale 1.0 - at 0.4",
                  "pe_scale_link": "Spearman of dSSDC and FS JPEG q5 over PE scales 0.1-1.0"}


def _matches(df: pd.DataFrame, filters: dict) -> pd.Series:
    mask = pd.Series(True, index=df.index)
    for key, value in filters.items():
        mask &= df[key] == value
    return mask


def _groups(claim: Claim, g: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, pd.Series, pd.Series]:
    """(units, in A, in B) of a claim on one data set's pinned trials: its two groups; for a ranking
    claim one unit per seed that has every group once, its value the Spearman correlation of ``metric``
    with the claimed order, flagged did_not_learn where one of its trials is."""
    if not claim.order:
        in_a = _matches(g, claim.a)
        return g, in_a, (_matches(g, claim.b) if claim.b is not None else in_a)
    rank = pd.Series(np.nan, index=g.index)
    for k, group in enumerate(reversed(claim.order)):
        rank[_matches(g, group)] = k
    ranked = g[rank.notna()].assign(_rank=rank)
    flagged = ranked["did_not_learn"].astype(bool) if "did_not_learn" in ranked else pd.Series(False, ranked.index)
    units = []
    for seed, s in ranked.groupby("seed"):
        if len(s) == len(claim.order) == s["_rank"].nunique() and s[metric].nunique() > 1:
            units.append({"seed": seed, metric: float(stats.spearmanr(s[metric], s["_rank"]).statistic),
                          "did_not_learn": bool(flagged[s.index].any())})
    units = pd.DataFrame(units, columns=["seed", metric, "did_not_learn"])
    every = pd.Series(True, index=units.index)
    return units, every, every


def _kept(claim: Claim) -> set[str]:
    """The factors a claim shows (the rest are pinned); a switch filter shows the protocol."""
    keep = set(claim.a) | set(claim.b or {}) | {k for group in claim.order for k in group}
    return keep | {"protocol"} if keep & set(SWITCHES) else keep


def _variants(claim: Claim, data: StudyData, dataset: str) -> list[tuple[str, str]]:
    """(per-trial metric, setting mark) rows of a claim on one data set: an FS claim is tested at the
    paper's headline severity and, away from 224 px where a grid of severities was measured, on the
    mean over that grid; a dSSDC claim on both estimators; a minimum-MAD claim also with CLS sinks kept."""
    if claim.metric == "min_mad":
        return [(claim.metric, ""), (SINKS_KEPT, SINKS_KEPT_MARK)]
    if claim.metric == "dssdc":
        return [(claim.metric, PER_IMAGE_MARK), ("dssdc_per_batch", PER_BATCH_MARK)]
    if claim.metric not in FS_GRID:
        return [(claim.metric, "")]
    rows = [(claim.metric, HEADLINE_MARK)]
    shifted = data.select(claim.metric.removeprefix("fs_"), "fs")  # fs_jpeg: the jpeg rows
    if not data.matches_paper_p(dataset) and shifted.loc[shifted["dataset"] == dataset, "level"].nunique() > 1:
        rows.append((FS_GRID[claim.metric], GRID_MARK))
    return rows


def evaluate_claims(data: StudyData, claims: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
    """One row per claim, data set and metric variant that has its groups; a single "no data" row for
    a claim that has none. Columns: see ``docs/studies.md`` (claims); ``dataset`` keys the Holm family.

    The verdict is computed on the trials that learned; ``did not learn A`` / ``B`` count the flagged
    trials of each group, and the ``(all trials)`` columns repeat the claim with them kept, so a
    selection on the outcome shows: ``survivors vs all`` says whether the two verdicts agree."""
    per_trial = data.per_trial
    rows = []
    for claim in claims:
        keep, evaluated = _kept(claim), False
        datasets = sorted(per_trial["dataset"].unique(), key=str) if "dataset" in per_trial else []
        for dataset in datasets:
            for metric, mark in _variants(claim, data, str(dataset)):
                if metric not in per_trial:
                    continue
                measured = per_trial[(per_trial["dataset"] == dataset) & per_trial[metric].notna()]
                g, setting = data.pin(measured, keep)
                g, in_a, in_b = _groups(claim, g, metric)
                if not (in_a.any() and in_b.any()):
                    continue
                row = claim_stats(claim, metric, g, in_a, in_b)
                met, said = precondition(claim.needs, data, str(dataset))
                text, effect = paper_numbers(claim, metric, str(dataset), data.matches_paper_p(str(dataset)))
                rows.append({**_describe(claim, metric), "dataset": str(dataset),
                             "setting": ", ".join(filter(None, [str(dataset), setting, mark])),
                             "precondition": said, "reading aid": reading_aid(met, said), **row,
                             "CLS sinks (A; B)": _sinks(claim, data, per_trial[per_trial["dataset"] == dataset],
                                                        keep),
                             "paper A / B": text, "paper effect (A - B)": effect, "_family": metric != SINKS_KEPT})
                evaluated = True
        if not evaluated:
            empty = pd.DataFrame({claim.metric: [], "seed": []})
            none = pd.Series([], dtype=bool)
            rows.append({**_describe(claim, claim.metric), "dataset": None, "setting": None, "precondition": None,
                         "reading aid": "", **claim_stats(claim, claim.metric, empty, none, none),
                         "CLS sinks (A; B)": None, "paper A / B": "—", "paper effect (A - B)": math.nan,
                         "_family": True})
    return _decide(pd.DataFrame(rows), claims)


def _describe(claim: Claim, metric: str) -> dict:
    label = GRID_LABELS.get(metric) or SCALING_LABELS.get(metric) or METRIC_LABELS.get(metric, metric)
    if claim.order:
        return {"paper": claim.paper, "claim": claim.text, "metric": f"Spearman of {label} with the order, per seed",
                "A": " > ".join(group_label(g) for g in claim.order), "B": "— (a ranking, per seed)",
                "margin": claim.margin}
    return {"paper": claim.paper, "claim": claim.text, "metric": label, "A": group_label(claim.a),
            "B": "the same trials (within-trial statistic)" if claim.b is None else group_label(claim.b),
            "margin": claim.margin}


def _sinks(claim: Claim, data: StudyData, trials: pd.DataFrame, keep: set[str]) -> str | None:
    """A minimum-MAD claim's CLS sinks per group, over the trials that learned (the verdict's): the heads
    left out of its trials' minima, and the trials whose every head is a sink (no minimum: left out of
    the test, counted here); None elsewhere."""
    if claim.metric != "min_mad" or "cls_sink_heads" not in trials:
        return None
    g, _ = data.pin(trials[~trials["did_not_learn"].astype(bool)], keep)
    said = []
    for filters in (claim.a, claim.b):
        group = g[_matches(g, filters)]
        heads, whole = int(group["cls_sink_heads"].fillna(0).sum()), int(group["all_heads_cls_sinks"].sum())
        said.append(f"{heads} sink head(s)" + (f", {whole} trial(s) all sinks, left out" if whole else ""))
    return "; ".join(said)


def _decide(table: pd.DataFrame, claims: tuple[Claim, ...]) -> pd.DataFrame:
    """Holm-adjust the raw p values per paper and data set (the learned trials and all trials
    separately), then read each row's verdict, power at the alpha of its verdict, reading aid and
    agreement from them. A sensitivity row (CLS sinks kept) is outside the family: it is read at the
    Holm step of the row it repeats."""
    by_text = {c.text: c for c in claims}
    family = table["_family"].astype(bool)
    table[STEP_ALPHA], table[HOLM_FAMILY] = np.nan, 0
    for raw, adjusted in (("p (raw)", "p (Holm)"), ("_p all", "p (Holm, all trials)")):
        table[adjusted] = np.nan
        for _, rows in table[family].groupby(["paper", "dataset"], dropna=True):
            table.loc[rows.index, adjusted] = holm(rows[raw].to_numpy(float))
            if raw == "p (raw)":
                table.loc[rows.index, STEP_ALPHA] = holm_step_alpha(rows[raw].to_numpy(float))
                table.loc[rows.index, HOLM_FAMILY] = int(np.isfinite(rows[raw].to_numpy(float)).sum())
    for i in table.index[~family]:  # the step of the row it repeats, and its p times that step's factor
        same = table[family & (table["claim"] == table.at[i, "claim"]) & (table["dataset"] == table.at[i, "dataset"])]
        step = float(same[STEP_ALPHA].iloc[0]) if len(same) else ALPHA
        table.at[i, STEP_ALPHA] = step
        table.at[i, HOLM_FAMILY] = int(same[HOLM_FAMILY].iloc[0]) if len(same) else 0
        for raw, adjusted in (("p (raw)", "p (Holm)"), ("_p all", "p (Holm, all trials)")):
            table.at[i, adjusted] = np.minimum(1.0, table.at[i, raw] * ALPHA / step)  # NaN (no test) stays NaN
    table.loc[~np.isfinite(table["p (raw)"].to_numpy(float)), HOLM_FAMILY] = 0  # no test: in no family
    said, said_all, marks, power = [], [], [], []
    for i, row in zip(table.index, table.to_dict("records")):
        claim = by_text[row["claim"]]
        # A claim of no effect reads its 95% interval, not a Holm-adjusted p: its power is at ALPHA.
        step = ALPHA if is_null(claim) or not np.isfinite(row[STEP_ALPHA]) else row[STEP_ALPHA]
        table.at[i, STEP_ALPHA] = step if np.isfinite(row["p (raw)"]) else np.nan
        c = row["_c"]
        power.append(mde(c.se, c.df, c.alternative, alpha=step))
        said.append(verdict(claim, c, row["p (Holm)"], row["_separated"]))
        said_all.append(verdict(claim, row["_c all"], row["p (Holm, all trials)"], row["_separated all"]))
        marks.append(power_mark(claim, said[-1], power[-1], row["paper effect (A - B)"]))
    table[MDE], table["verdict"], table["verdict (all trials)"], table["power"] = power, said, said_all, marks
    table["survivors vs all"] = np.where(table["verdict"] == table["verdict (all trials)"], "agree", "DISAGREE")
    return table[COLUMNS]


COLUMNS = ["paper", "claim", "metric", "dataset", "setting", "A", "B", "margin", "precondition", "test", "n A",
           "n B", "n pairs", "did not learn A", "did not learn B", "CLS sinks (A; B)", "mean A", "mean B",
           "effect (A - B)", "95% CI of effect", "CI", TWO_SIDED, "p (raw)", "p (Holm)",
           HOLM_FAMILY, "p (sign-flip)", STEP_ALPHA, MDE, "power", "paper A / B", "paper effect (A - B)", "verdict",
           "reading aid",
           "effect (all trials)", "95% CI (all trials)", "p (Holm, all trials)", "verdict (all trials)",
           "survivors vs all"]


def undecided(data: StudyData, claims: tuple[Claim, ...] = CLAIMS) -> list[str]:
    """The claims that read "not enough seeds" on every data set of ``data`` whatever the values (a
    plan's trials will do: only the group sizes and seeds matter; ``claim_tests.decides``)."""
    per_trial, rng = data.per_trial, np.random.default_rng(0)
    out = []
    for claim in claims:
        can = []
        for _, trials in per_trial.groupby("dataset"):
            g, _ = data.pin(trials, _kept(claim))
            noise, in_a, in_b = _groups(claim, g.assign(**{claim.metric: rng.normal(size=len(g))}), claim.metric)
            if in_a.any() and in_b.any():
                can.append(decides(claim, claim_stats(claim, claim.metric, noise, in_a, in_b)["_c"]))
        if can and not any(can):
            out.append(claim.text)
    return out
