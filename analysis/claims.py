"""The two papers' claims, tested on a study's seeds.

A claim compares two groups of trials, paired by seed where seeds pair
(``seedstats.compare``). A claim of *no* effect is "consistent with no effect"
only when the 95% CI of the effect lies inside the margin stored with the claim,
else "inconclusive". Trials flagged ``did_not_learn`` (final accuracy within 2
points of chance) are counted per group, and every claim is computed twice: on
the trials that learned (the verdict) and with the non-learners kept, their
measurements as they are (``verdict (all trials)``); a row whose two verdicts
differ is flagged.

It knows no plotting and no storage; it reads a ``StudyData`` (``analysis.study_data``)
through its ``per_trial`` table and its ``pin`` method. Labels come from ``analysis.labels``,
the statistics from ``analysis.seedstats``, the papers' numbers from ``analysis.paper_numbers``;
the ablation and conditions tables are ``analysis.condition_tables``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.labels import METRIC_LABELS, MODERN, SWITCHES, canonical_protocol, group_label, model_label
from analysis.paper_numbers import PAPER_L_MIN_MAD, PAPER_P_APE_SCALING, PAPER_P_MODELS
from analysis.seedstats import ALPHA, Comparison, compare

if TYPE_CHECKING:
    from analysis.study_data import StudyData


@dataclass(frozen=True)
class Claim:
    """A claim as a comparison of two groups of trials on one per-trial metric.

    a, b: factor filters (``{"protocol": "cutmix"}``, ``{"pe": "ape", "rpt": True}``, ``{"cutmix": True}``).
    alternative: scipy's: "less" claims A < B, "greater" A > B, "two-sided" claims A = B (a null claim).
    margin: the largest |A - B| that counts as no effect, in the metric's units: a null claim is
    "consistent with no effect" only when the effect's 95% CI lies inside [-margin, margin].
    separation: the claim is that *every* trial of A lies below every trial of B (no p-value).
    Factors named in neither filter are pinned to ``labels.REFERENCE`` where they vary; each dataset is its own row.
    """

    paper: str
    text: str
    metric: str
    a: dict = field(default_factory=dict)
    b: dict = field(default_factory=dict)
    alternative: str = "less"
    separation: bool = False
    margin: float = math.nan


# No-effect margins per metric: 1 accuracy point; 0.02 of normalised MAD (Study L's CutMix runs sit
# <= 0.024, the others >= 0.210); 0.05 of dSSDC (the paper's APE scaling steps are >= 0.05); 0.02 of FS
# (the paper's seed spread, and one binomial SE at 1,000 images).
MARGINS = {"test_acc": 0.01, "min_mad": 0.02, "dssdc": 0.05, "fs_jpeg": 0.02, "fs_blur": 0.02}


def _claim(paper: str, text: str, metric: str, a: dict, b: dict, alternative: str = "less", **kw) -> Claim:
    return Claim(paper, text, metric, a, b, alternative, margin=MARGINS[metric], **kw)


CLAIMS = (
    _claim("Study L", "CutMix alone lowers minimum MAD", "min_mad", {"protocol": "cutmix"}, {"protocol": "baseline"}),
    _claim("Study L", "modern lowers minimum MAD (0.316 -> 0.008)", "min_mad", {"protocol": MODERN},
           {"protocol": "baseline"}),
    _claim("Study L", "every CutMix run has lower minimum MAD than every run without", "min_mad",
           {"cutmix": True}, {"cutmix": False}, separation=True),
    _claim("Study L", "AutoAugment alone leaves minimum MAD at baseline", "min_mad", {"protocol": "autoaugment"},
           {"protocol": "baseline"}, "two-sided"),
    _claim("Study L", "label smoothing alone leaves minimum MAD at baseline", "min_mad",
           {"protocol": "label_smoothing"}, {"protocol": "baseline"}, "two-sided"),
    _claim("Study L", "CutMix adds accuracy", "test_acc", {"protocol": "cutmix"}, {"protocol": "baseline"}, "greater"),
    _claim("Study L", "AutoAugment adds accuracy", "test_acc", {"protocol": "autoaugment"}, {"protocol": "baseline"},
           "greater"),
    _claim("Study P", "APE recovers SSDC under RPI more than none (dSSDC)", "dssdc", {"pe": "ape", "rpt": False},
           {"pe": "none", "rpt": False}, "greater"),
    _claim("Study P", "RPT collapses APE's SSDC recovery under RPI (dSSDC)", "dssdc", {"pe": "ape", "rpt": True},
           {"pe": "ape", "rpt": False}),
    _claim("Study P", "rope2d is less fragile to JPEG than ape", "fs_jpeg", {"pe": "rope2d", "rpt": False},
           {"pe": "ape", "rpt": False}),
    _claim("Study P", "rope2d is less fragile to JPEG than sincos2d", "fs_jpeg", {"pe": "rope2d", "rpt": False},
           {"pe": "sincos2d", "rpt": False}),
    _claim("Study P", "rope2d is less fragile to blur than ape", "fs_blur", {"pe": "rope2d", "rpt": False},
           {"pe": "ape", "rpt": False}),
    _claim("Study P", "none is more fragile to JPEG than ape", "fs_jpeg", {"pe": "none", "rpt": False},
           {"pe": "ape", "rpt": False}, "greater"),
)

CONSISTENT, INCONCLUSIVE = "consistent with no effect (CI inside the margin)", "inconclusive (CI exceeds the margin)"
VERDICTS = ("supported", "not supported", CONSISTENT, INCONCLUSIVE, "differs (contradicts the claim)",
            "not enough seeds", "no data")


def verdict(claim: Claim, a: np.ndarray, b: np.ndarray, c: Comparison) -> str:
    """The verdict words of one claim row (see ``VERDICTS``) from its groups and their comparison."""
    if a.size == 0 or b.size == 0:
        return "no data"
    if claim.separation:
        return "supported" if a.max() < b.min() else "not supported"
    if claim.alternative == "two-sided":
        # A null claim is never "supported" by a test that failed to reject: the CI must lie inside the margin.
        if c.p < ALPHA:
            return "differs (contradicts the claim)"
        if not np.isfinite(c.low):
            return "not enough seeds"
        return CONSISTENT if -claim.margin <= c.low and c.high <= claim.margin else INCONCLUSIVE
    if c.min_p >= ALPHA:
        return "not enough seeds"
    return "supported" if c.p < ALPHA else "not supported"


def paper_value(claim: Claim, group: dict, dataset: str, matches_p: bool) -> float | None:
    """The paper's number for one group of a claim where this data set's setting matches the
    paper's (Study P: ImageNet-100 / 224 px; Study L: CIFAR-100), else None."""
    if claim.paper == "Study P" and matches_p and "pe" in group:
        label = model_label(group["pe"], group.get("rpt", False))
        if claim.metric == "dssdc":
            return PAPER_P_APE_SCALING[1.0][0] if label == "ape" else None
        return PAPER_P_MODELS.get(label, {}).get(claim.metric)
    if claim.paper == "Study L" and dataset == "cifar100" and claim.metric == "min_mad":
        return PAPER_L_MIN_MAD.get(canonical_protocol(group.get("protocol", "")))
    return None


def _matches(df: pd.DataFrame, filters: dict) -> pd.Series:
    mask = pd.Series(True, index=df.index)
    for key, value in filters.items():
        mask &= df[key] == value
    return mask


def evaluate_claims(data: StudyData, claims: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
    """One row per claim and dataset that has both groups; a single "no data" row for a claim that has none.

    The verdict is computed on the trials that learned; ``did not learn A`` / ``B`` count the flagged
    trials of each group, and the ``(all trials)`` columns repeat the claim with them kept, so a
    selection on the outcome shows: ``survivors vs all`` says whether the two verdicts agree."""
    per_trial = data.per_trial
    rows = []
    for claim in claims:
        keep = set(claim.a) | set(claim.b)
        if keep & set(SWITCHES):
            keep.add("protocol")
        evaluated = False
        if claim.metric in per_trial and not per_trial.empty:
            pinned, setting = data.pin(per_trial[per_trial[claim.metric].notna()], keep)
            for dataset, g in pinned.groupby("dataset", sort=True):
                in_a, in_b = _matches(g, claim.a), _matches(g, claim.b)
                if not (in_a.any() and in_b.any()):
                    continue
                row = _claim_row(claim, g, in_a, in_b, ", ".join(filter(None, [str(dataset), setting])))
                papers = [paper_value(claim, grp, str(dataset), data.matches_paper_p(str(dataset)))
                          for grp in (claim.a, claim.b)]
                row["paper A / B"] = ("—" if all(v is None for v in papers) else
                                      " / ".join("—" if v is None else f"{v:.3f}" for v in papers))
                rows.append(row)
                evaluated = True
        if not evaluated:
            empty = pd.DataFrame({claim.metric: [], "seed": []})
            none = pd.Series([], dtype=bool)
            rows.append({**_claim_row(claim, empty, none, none, "—"), "paper A / B": "—"})
    return pd.DataFrame(rows)


def _ci(c: Comparison) -> str:
    return "—" if math.isnan(c.low) else f"[{c.low:.3f}, {c.high:.3f}]"


def _claim_row(claim: Claim, g: pd.DataFrame, in_a: pd.Series, in_b: pd.Series, setting: str) -> dict:
    flagged = g["did_not_learn"].astype(bool) if "did_not_learn" in g else pd.Series(False, index=g.index)
    groups = {}
    for population, mask in (("learned", ~flagged), ("all", pd.Series(True, index=g.index))):
        a, b = g[in_a & mask], g[in_b & mask]
        va, vb = a[claim.metric].to_numpy(float), b[claim.metric].to_numpy(float)
        c = compare(va, a["seed"].to_numpy(), vb, b["seed"].to_numpy(), claim.alternative)
        groups[population] = (va, vb, c, verdict(claim, va, vb, c))
    a, b, c, said = groups["learned"]
    *_, every, said_all = groups["all"]
    test = "separation: max(A) < min(B) over runs; " + c.test if claim.separation else c.test
    return {
        "paper": claim.paper,
        "claim": claim.text,
        "metric": METRIC_LABELS.get(claim.metric, claim.metric),
        "setting": setting,
        "A": group_label(claim.a),
        "B": group_label(claim.b),
        "margin": claim.margin,
        "test": test,
        "n A": int(a.size),
        "n B": int(b.size),
        "n pairs": c.n_pairs,
        "did not learn A": int((in_a & flagged).sum()),
        "did not learn B": int((in_b & flagged).sum()),
        "mean A": float(a.mean()) if a.size else math.nan,
        "mean B": float(b.mean()) if b.size else math.nan,
        "effect (A - B)": c.effect,
        "95% CI of effect": _ci(c),
        "CI": c.interval,
        "p": c.p,
        "verdict": said,
        "effect (all trials)": every.effect,
        "95% CI (all trials)": _ci(every),
        "p (all trials)": every.p,
        "verdict (all trials)": said_all,
        "survivors vs all": "agree" if said == said_all else "DISAGREE",
    }
