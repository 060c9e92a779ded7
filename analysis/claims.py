"""The two papers' claims, tested on a study's seeds, and the tables of numbers beside them.

References (numbers copied from the shared spec STUDIES.md):
    Study P: "Positional Encodings Anchor Spatial Structure in Vision Transformers" (arXiv 2606.00124).
    Study L: "Inducing Spatial Locality in Vision Transformers through the Training Protocol" (arXiv 2605.16390).

This module is the numeric layer of the report: vocabulary (model and protocol
labels and orders), the papers' reported numbers, the claims and the ablation /
condition tables; the statistics across seeds live in ``analysis.seedstats``.
It knows no plotting and no storage; it reads a ``StudyData``
(``analysis.report``) through its ``per_trial`` table and its ``pin`` method.

A claim compares two groups of trials, paired by seed where seeds pair
(``seedstats.compare``). A claim of *no* effect is "consistent with no effect"
only when the 95% CI of the effect lies inside the margin stored with the claim,
else "inconclusive". Trials flagged ``did_not_learn`` (final accuracy within 2
points of chance) are counted per group, and every claim is computed twice: on
the trials that learned (the verdict) and with the non-learners kept, their
measurements as they are (``verdict (all trials)``); a row whose two verdicts
differ is flagged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.seedstats import (  # noqa: F401 - seed statistics re-exported for figures and plotting
    ALPHA,
    Comparison,
    Summary,
    binomial_se,
    compare,
    fragility_se,
    fragility_se_without_counts,
    mean_ci,
    mean_std,
    min_achievable_p,
    seed_summary,
    summarise,
)
from records.names import PES

if TYPE_CHECKING:
    from analysis.report import StudyData

# -- vocabulary ---------------------------------------------------------------
FACTORS = ("dataset", "pe", "rpt", "protocol")  # what a condition is; `seed` makes it a trial
SWITCHES = ("autoaugment", "cutmix", "label_smoothing")  # Study L's protocol switches, in name order
MODERN = "+".join(SWITCHES)  # Protocol.name of "modern" (all three switches on)
REFERENCE = {"pe": "ape", "rpt": False, "protocol": "baseline"}  # the setting a factor is pinned to
_SHORT = {"autoaugment": "AA", "cutmix": "CutMix", "label_smoothing": "LS"}


def canonical_protocol(name: str) -> str:
    """Protocol name as trials store it (``Protocol.name``); the alias ``modern`` maps to its switches."""
    return MODERN if name == "modern" else name


def protocol_switches(name: str) -> dict[str, bool]:
    """{'autoaugment': bool, 'cutmix': bool, 'label_smoothing': bool} from a protocol name."""
    parts = set() if name == "baseline" else set(canonical_protocol(name).split("+"))
    return {s: s in parts for s in SWITCHES}


def protocol_label(name: str) -> str:
    """Short display name: ``autoaugment+cutmix`` -> ``AA+CutMix``; all three -> ``modern``."""
    name = canonical_protocol(name)
    if name in ("baseline", MODERN):
        return "modern" if name == MODERN else name
    return "+".join(_SHORT.get(p, p) for p in name.split("+"))


def protocol_key(name: str) -> tuple:
    """Sort key: baseline, single switches, pairs, modern (the ablation's reading order)."""
    parts = [] if name == "baseline" else canonical_protocol(name).split("+")
    return (len(parts), [SWITCHES.index(p) if p in SWITCHES else len(SWITCHES) for p in parts], name)


def model_label(pe: str, rpt: bool) -> str:
    """Study P's model names: ``ape``, ``ape + RPT``."""
    return f"{pe} + RPT" if rpt else str(pe)


def model_key(pe: str, rpt: bool) -> tuple:
    """Sort key: the PE registry's order (``records.names.PES``), a PE it does not name last, by name."""
    return (PES.index(pe) if pe in PES else len(PES), str(pe), bool(rpt))


# -- the papers' reported numbers ---------------------------------------------
# Study P, "Reported results (4 seeds, mean)": ImageNet-100 at 224 px; FS at JPEG q5 and blur k5 s2.5.
PAPER_P_SETTING = "paper (224 px)"
PAPER_P_MODELS = {
    "ape": {"test_acc": 0.641, "fs_jpeg": 0.435, "fs_blur": 0.184},
    "sincos2d": {"test_acc": 0.657, "fs_jpeg": 0.435, "fs_blur": 0.208},
    "rope2d": {"test_acc": 0.690, "fs_jpeg": 0.299, "fs_blur": 0.147},
    "none": {"test_acc": 0.568, "fs_jpeg": 0.646, "fs_blur": 0.298},
    "ape + RPT": {"test_acc": 0.560, "fs_jpeg": 0.630, "fs_blur": 0.243},
}
# Study P, APE scaling (4 seeds): alpha -> (dSSDC, FS JPEG low, FS JPEG high). For alpha <= 0.4 the
# paper gives one range, .627-.652, for FS JPEG: kept as a range, not a made-up point. The paper's
# table covers 0.1-1.0: alpha 0 (measured here as a sanity point, equal to `none`) has no reference.
PAPER_P_APE_SCALING = {
    1.0: (0.473, 0.434, 0.434),
    0.9: (0.385, 0.452, 0.452),
    0.8: (0.313, 0.478, 0.478),
    0.7: (0.185, 0.515, 0.515),
    0.6: (0.098, 0.560, 0.560),
    0.5: (0.048, 0.598, 0.598),
    **{a: (0.0, 0.627, 0.652) for a in (0.4, 0.3, 0.2, 0.1)},
}
# Study L, CIFAR-100, one seed; its MAD normalisation is not published, so compare shapes, not digits.
PAPER_L_SETTING = "paper (CIFAR-100, 1 seed)"
PAPER_L_MIN_MAD = {"baseline": 0.316, MODERN: 0.008}
PAPER_L_CUTMIX_MAX, PAPER_L_NO_CUTMIX_MIN = 0.024, 0.210


def paper_reference_table() -> pd.DataFrame:
    """The papers' numbers in one table, for reading beside ours when no setting matches."""
    rows = [
        {"paper": "Study P", "setting": "ImageNet-100, 224 px, 4 seeds", "condition": m, "quantity": q, "value": v}
        for m, d in PAPER_P_MODELS.items()
        for q, v in (("clean acc", d["test_acc"]), ("FS JPEG q5", d["fs_jpeg"]), ("FS blur s2.5", d["fs_blur"]))
    ]
    for alpha, (d, lo, hi) in sorted(PAPER_P_APE_SCALING.items(), reverse=True):
        setting = "ImageNet-100, 224 px, 4 seeds"
        rows.append({"paper": "Study P", "setting": setting, "condition": f"ape, alpha {alpha:.1f}",
                     "quantity": "dSSDC (RPI)", "value": f"{d:.3f}"})
        fs = f"{lo:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}"
        rows.append({"paper": "Study P", "setting": setting, "condition": f"ape, alpha {alpha:.1f}",
                     "quantity": "FS JPEG q5", "value": fs})
    for proto, v in PAPER_L_MIN_MAD.items():
        rows.append({"paper": "Study L", "setting": "CIFAR-100, 1 seed", "condition": protocol_label(proto),
                     "quantity": "min MAD", "value": v})
    rows.append({"paper": "Study L", "setting": "CIFAR-100, 1 seed", "condition": "every CutMix condition",
                 "quantity": "min MAD", "value": f"<= {PAPER_L_CUTMIX_MAX}"})
    rows.append({"paper": "Study L", "setting": "CIFAR-100, 1 seed", "condition": "every non-CutMix condition",
                 "quantity": "min MAD", "value": f">= {PAPER_L_NO_CUTMIX_MIN}"})
    return pd.DataFrame(rows).astype({"value": str})


# -- claims -----------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """A claim as a comparison of two groups of trials on one per-trial metric.

    a, b: factor filters (``{"protocol": "cutmix"}``, ``{"pe": "ape", "rpt": True}``, ``{"cutmix": True}``).
    alternative: scipy's: "less" claims A < B, "greater" A > B, "two-sided" claims A = B (a null claim).
    margin: the largest |A - B| that counts as no effect, in the metric's units: a null claim is
    "consistent with no effect" only when the effect's 95% CI lies inside [-margin, margin].
    separation: the claim is that *every* trial of A lies below every trial of B (no p-value).
    Factors named in neither filter are pinned to ``REFERENCE`` where they vary; each dataset is its own row.
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

METRIC_LABELS = {
    "min_mad": "minimum MAD",
    "test_acc": "test accuracy",
    "dssdc": "dSSDC under RPI",
    "fs_jpeg": "FS JPEG q5",
    "fs_blur": "FS blur s2.5",
}
CONSISTENT, INCONCLUSIVE = "consistent with no effect (CI inside the margin)", "inconclusive (CI exceeds the margin)"
VERDICTS = ("supported", "not supported", CONSISTENT, INCONCLUSIVE, "differs (contradicts the claim)",
            "not enough seeds", "no data")


def group_label(filters: dict) -> str:
    """Readable name of a group filter: ``ape + RPT``, ``CutMix``, ``with CutMix``."""
    parts = []
    if "pe" in filters:
        parts.append(model_label(filters["pe"], filters.get("rpt", False)))
    elif "rpt" in filters:
        parts.append("RPT" if filters["rpt"] else "fixed order")
    if "protocol" in filters:
        parts.append(protocol_label(filters["protocol"]))
    for s in SWITCHES:
        if s in filters:
            parts.append(f"{'with' if filters[s] else 'without'} {_SHORT[s]}")
    return ", ".join(parts) or "all"


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


# -- tables -------------------------------------------------------------------------
def ablation_tables(data: StudyData) -> list[tuple[str, pd.DataFrame, str]]:
    """Study L's protocol ablation per dataset: (dataset, table, separation note).

    Rows: protocols (all present, in ablation order); minimum MAD (smallest per-head MAD in the network)
    and test accuracy as mean ± std over seeds, with n. The note marks the paper's binary CutMix
    separation: the largest condition-mean minimum MAD among CutMix conditions against the smallest
    among the others."""
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
                         **{_SHORT[s]: "✓" if sw[s] else "" for s in SWITCHES},
                         "min MAD": mean_std(t["min_mad"]), "test acc [95% CI]": mean_ci(t["test_acc"]),
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


CONDITION_METRICS = ("test_acc", "min_mad", "dssdc", "fs_jpeg", "fs_blur")
SAMPLING_SE = {"test_acc": "test_acc_se", "fs_jpeg": "fs_jpeg_se", "fs_blur": "fs_blur_se"}  # per_trial columns


def _paper_numbers(data: StudyData, dataset: str, model: str, protocol: str) -> str:
    """The paper's numbers for one condition where the setting matches (Study P: ImageNet-100 or 224 px,
    its models at the baseline protocol; Study L: CIFAR-100), else a dash."""
    said = []
    if protocol == "baseline" and model in PAPER_P_MODELS and data.matches_paper_p(dataset):
        p = PAPER_P_MODELS[model]
        said.append(f"acc {p['test_acc']:.3f}, FS JPEG {p['fs_jpeg']:.3f}, FS blur {p['fs_blur']:.3f}")
    if dataset == "cifar100" and model == "ape" and protocol in PAPER_L_MIN_MAD:
        said.append(f"min MAD {PAPER_L_MIN_MAD[protocol]:.3f}")
    return "; ".join(said) or "—"


def conditions_table(data: StudyData) -> pd.DataFrame:
    """Every condition (dataset x pe x token order x protocol x each ``data.condition_fields``) with n
    and each metric as mean ± std, test accuracy also with its 95% bootstrap CI over seeds.

    Beside accuracy and fragility: their standard error from ``n images`` (binomial for accuracy, the
    delta method over the paired counts for FS; mean over the condition's trials), the test-set
    sampling error the seed spread does not contain; and how many of the n trials ``did not learn``."""
    pt = data.per_trial
    if pt.empty:
        return pd.DataFrame()
    metrics = [m for m in CONDITION_METRICS if m in pt and pt[m].notna().any()]
    extra = [c for c in data.condition_fields if c in pt]  # fields beyond the factors that split a cell
    rows = []
    for key, g in pt.groupby([*FACTORS, *extra], sort=False):
        dataset, pe, rpt, proto = key[:4]
        row = {"dataset": dataset, "model": model_label(pe, rpt), "protocol": protocol_label(proto),
               **dict(zip(extra, key[4:])), "n": len(g),
               "did not learn": int(g["did_not_learn"].sum()) if "did_not_learn" in g else 0}
        if "n_images" in g and g["n_images"].notna().any():
            row["n images"] = "/".join(str(int(v)) for v in sorted(g["n_images"].dropna().unique()))
        for m in metrics:
            row[METRIC_LABELS[m]] = mean_std(g[m])
            if m == "test_acc":
                row["test accuracy [95% CI]"] = mean_ci(g[m])
            se = SAMPLING_SE.get(m)
            if se in g and g[se].notna().any():
                kind = "binomial" if m == "test_acc" else "delta-method"  # FS: from its paired counts
                row[f"{METRIC_LABELS[m]}: {kind} SE"] = f"{g[se].mean():.3f}"
        row["paper"] = _paper_numbers(data, str(dataset), model_label(pe, rpt), proto)
        rows.append({**row, "_key": (str(dataset), model_key(pe, rpt), protocol_key(proto), *map(str, key[4:]))})
    return pd.DataFrame(rows).sort_values("_key").drop(columns="_key").reset_index(drop=True)
