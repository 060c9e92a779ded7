"""The two papers' claims, tested on a study's seeds, and the tables of numbers beside them.

References (numbers copied from the shared spec STUDIES.md):
    Study P: "Positional Encodings Anchor Spatial Structure in Vision Transformers" (arXiv 2606.00124).
    Study L: "Inducing Spatial Locality in Vision Transformers through the Training Protocol" (arXiv 2605.16390).

This module is the numeric layer of the report: vocabulary (model and protocol
labels and orders), seed statistics, the papers' reported numbers, the claims
and the ablation / condition tables. It knows no plotting and no storage; it
reads a ``StudyData`` (``analysis.report``) through its ``per_trial`` table and
its ``pin`` method.

Every number is a statistic *across seeds*: one trial (one seed of one
condition) is one unit, so ``n`` is always the number of trials behind a value.
Every seed is measured on the same evaluation images, so the seed spread holds
no test-set sampling error: ``binomial_se`` and ``fragility_se`` give that
error from ``n_images``, shown beside the seed spread. Trials flagged
``did_not_learn`` (final accuracy within 2 points of chance) are left out of
every claim and counted.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from scipy import stats

if TYPE_CHECKING:
    from analysis.report import StudyData

ALPHA = 0.05  # significance level of every claim test (no multiple-comparison correction: say so)
BOOTSTRAP_RESAMPLES = 2000

# -- vocabulary ---------------------------------------------------------------
FACTORS = ("dataset", "pe", "rpt", "protocol")  # what a condition is; `seed` makes it a trial
SWITCHES = ("autoaugment", "cutmix", "label_smoothing")  # Study L's protocol switches, in name order
MODERN = "+".join(SWITCHES)  # Protocol.name of "modern" (all three switches on)
REFERENCE = {"pe": "ape", "rpt": False, "protocol": "baseline"}  # the setting a factor is pinned to
PE_ORDER = ("none", "ape", "sincos2d", "rope2d", "rope2d_mixed")
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
    return (PE_ORDER.index(pe) if pe in PE_ORDER else len(PE_ORDER), str(pe), bool(rpt))


# -- seed statistics ------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    """Mean over seeds with its spread: std (ddof 1) and a 95% percentile-bootstrap CI of the mean."""

    mean: float
    std: float
    low: float
    high: float
    n: int


def seed_summary(values: Any) -> Summary:
    """Summary of one value per trial (NaNs dropped). n = 1 has no spread; constant values a zero-width CI."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return Summary(math.nan, math.nan, math.nan, math.nan, 0)
    mean = float(v.mean())
    if v.size == 1:
        return Summary(mean, math.nan, math.nan, math.nan, 1)
    std = float(v.std(ddof=1))
    if std == 0.0:
        return Summary(mean, 0.0, mean, mean, int(v.size))
    # Percentile, not BCa: BCa's jackknife degenerates at the 3-5 seeds a sweep has.
    ci = stats.bootstrap(
        (v,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    return Summary(mean, std, float(ci.low), float(ci.high), int(v.size))


def summarise(df: pd.DataFrame, by: list[str], value: str = "value") -> pd.DataFrame:
    """One row per group of ``by``: mean, std, low, high (95% CI), n over the trials in the group.

    Rows are first reduced to one value per trial (mean), so n counts trials (seeds), never rows."""
    cols = [*by, "mean", "std", "low", "high", "n"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    per_trial = df.groupby([*by, "trial_id"], dropna=False, observed=True)[value].mean().reset_index()
    rows = [
        {**dict(zip(by, key if isinstance(key, tuple) else (key,))), **seed_summary(g[value]).__dict__}
        for key, g in per_trial.groupby(by, dropna=False, observed=True)
    ]
    return pd.DataFrame(rows, columns=cols)


def mean_std(values: Any, digits: int = 3) -> str:
    """``0.316 ± 0.012`` (std over seeds); a single seed shows no ±; no seeds show a dash."""
    s = seed_summary(values)
    if s.n == 0:
        return "—"
    return f"{s.mean:.{digits}f}" if s.n == 1 else f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"


def mean_ci(values: Any, digits: int = 3) -> str:
    """``0.481 [0.470, 0.492]``: mean over seeds with its 95% bootstrap CI; one seed has no CI."""
    s = seed_summary(values)
    if s.n == 0:
        return "—"
    if s.n == 1 or not np.isfinite(s.low):
        return f"{s.mean:.{digits}f}"
    return f"{s.mean:.{digits}f} [{s.low:.{digits}f}, {s.high:.{digits}f}]"


def binomial_se(p: Any, n: Any) -> Any:
    """Binomial standard error sqrt(p (1 - p) / n) of an accuracy p over n images (NaN where n is unknown)."""
    p, n = np.asarray(p, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(np.clip(p * (1 - p), 0, None) / np.where(n > 0, n, np.nan))


def fragility_se(fs: Any, acc_clean: Any, n: Any) -> Any:
    """Binomial standard error of FS = 1 - acc_shift / acc_clean over n images.

    FS's complement r = acc_shift / acc_clean is taken as the share of the n * acc_clean
    clean-correct images that stay correct under the shift: SE = sqrt(r (1 - r) / (n acc_clean)).
    Exact when no image is right only under the shift (nearly so for harsh shifts); the paired
    counts that would make it exact are not stored. At n = 1,000, acc 0.64, FS 0.435: 0.020."""
    r = 1.0 - np.asarray(fs, dtype=float)
    return binomial_se(np.clip(r, 0, 1), np.asarray(n, dtype=float) * np.asarray(acc_clean, dtype=float))


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


CLAIMS = (
    Claim("Study L", "CutMix alone lowers minimum MAD", "min_mad", {"protocol": "cutmix"}, {"protocol": "baseline"}),
    Claim("Study L", "modern lowers minimum MAD (0.316 -> 0.008)", "min_mad", {"protocol": MODERN},
          {"protocol": "baseline"}),
    Claim("Study L", "every CutMix run has lower minimum MAD than every run without", "min_mad",
          {"cutmix": True}, {"cutmix": False}, separation=True),
    Claim("Study L", "AutoAugment alone leaves minimum MAD at baseline", "min_mad", {"protocol": "autoaugment"},
          {"protocol": "baseline"}, "two-sided"),
    Claim("Study L", "label smoothing alone leaves minimum MAD at baseline", "min_mad",
          {"protocol": "label_smoothing"}, {"protocol": "baseline"}, "two-sided"),
    Claim("Study L", "CutMix adds accuracy", "test_acc", {"protocol": "cutmix"}, {"protocol": "baseline"}, "greater"),
    Claim("Study L", "AutoAugment adds accuracy", "test_acc", {"protocol": "autoaugment"}, {"protocol": "baseline"},
          "greater"),
    Claim("Study P", "APE recovers SSDC under RPI more than none (dSSDC)", "dssdc", {"pe": "ape", "rpt": False},
          {"pe": "none", "rpt": False}, "greater"),
    Claim("Study P", "RPT collapses APE's SSDC recovery under RPI (dSSDC)", "dssdc", {"pe": "ape", "rpt": True},
          {"pe": "ape", "rpt": False}),
    Claim("Study P", "rope2d is less fragile to JPEG than ape", "fs_jpeg", {"pe": "rope2d", "rpt": False},
          {"pe": "ape", "rpt": False}),
    Claim("Study P", "rope2d is less fragile to JPEG than sincos2d", "fs_jpeg", {"pe": "rope2d", "rpt": False},
          {"pe": "sincos2d", "rpt": False}),
    Claim("Study P", "rope2d is less fragile to blur than ape", "fs_blur", {"pe": "rope2d", "rpt": False},
          {"pe": "ape", "rpt": False}),
    Claim("Study P", "none is more fragile to JPEG than ape", "fs_jpeg", {"pe": "none", "rpt": False},
          {"pe": "ape", "rpt": False}, "greater"),
)

METRIC_LABELS = {
    "min_mad": "minimum MAD",
    "test_acc": "test accuracy",
    "dssdc": "dSSDC under RPI",
    "fs_jpeg": "FS JPEG q5",
    "fs_blur": "FS blur s2.5",
}
VERDICTS = ("supported", "not supported", "no significant difference (consistent with the claim)",
            "differs (contradicts the claim)", "not enough seeds", "no data")


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


def min_achievable_p(n_a: int, n_b: int, alternative: str) -> float:
    """Smallest p an exact Mann-Whitney U test can return with these group sizes (complete separation)."""
    p = 1.0 / math.comb(n_a + n_b, n_a)
    return min(1.0, 2 * p) if alternative == "two-sided" else p


def mann_whitney(a: np.ndarray, b: np.ndarray, alternative: str) -> float:
    """p of Mann-Whitney U; exact (a permutation test when values tie) at seed-sized samples.
    NaN with fewer than two runs in a group: no test applies (the verdict is "not enough seeds")."""
    if min(a.size, b.size) < 2:
        return math.nan
    if math.comb(a.size + b.size, a.size) <= 20_000:
        tied = np.unique(np.concatenate([a, b])).size < a.size + b.size
        method = stats.PermutationMethod(n_resamples=20_000, rng=np.random.default_rng(0)) if tied else "exact"
    else:
        method = "asymptotic"
    return float(stats.mannwhitneyu(a, b, alternative=alternative, method=method).pvalue)


def _difference_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """95% percentile-bootstrap CI of mean(a) - mean(b), resampling each group on its own."""
    if a.size < 2 or b.size < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return math.nan, math.nan

    def diff(x, y, axis):
        return x.mean(axis=axis) - y.mean(axis=axis)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples at 2-3 seeds
        ci = stats.bootstrap((a, b), diff, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                             rng=np.random.default_rng(0)).confidence_interval
    return float(ci.low), float(ci.high)


def verdict(claim: Claim, a: np.ndarray, b: np.ndarray, p: float) -> str:
    """The verdict words of one claim row (see ``VERDICTS``)."""
    if a.size == 0 or b.size == 0:
        return "no data"
    if claim.separation:
        return "supported" if a.max() < b.min() else "not supported"
    if min_achievable_p(a.size, b.size, claim.alternative) >= ALPHA:
        return "not enough seeds"
    if claim.alternative == "two-sided":
        # A null claim is never "supported" by a test that failed to reject: report it as consistent.
        return "differs (contradicts the claim)" if p < ALPHA else VERDICTS[2]
    return "supported" if p < ALPHA else "not supported"


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

    Trials flagged ``did_not_learn`` are left out of both groups; ``did not learn (excluded)`` counts
    those that would have been in A or B, so a collapsed model is never tested as if it were a result."""
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
                flagged = g["did_not_learn"].astype(bool) if "did_not_learn" in g else pd.Series(False, index=g.index)
                in_a, in_b = _matches(g, claim.a), _matches(g, claim.b)
                a = g.loc[in_a & ~flagged, claim.metric].to_numpy(float)
                b = g.loc[in_b & ~flagged, claim.metric].to_numpy(float)
                excluded = int(((in_a | in_b) & flagged).sum())
                if (in_a.any() and in_b.any()) and (a.size and b.size or excluded):
                    row = _claim_row(claim, a, b, ", ".join(filter(None, [str(dataset), setting])), excluded)
                    papers = [paper_value(claim, grp, str(dataset), data.matches_paper_p(str(dataset)))
                              for grp in (claim.a, claim.b)]
                    row["paper A / B"] = ("—" if all(v is None for v in papers) else
                                          " / ".join("—" if v is None else f"{v:.3f}" for v in papers))
                    rows.append(row)
                    evaluated = True
        if not evaluated:
            rows.append({**_claim_row(claim, np.array([]), np.array([]), "—"), "paper A / B": "—"})
    return pd.DataFrame(rows)


def _claim_row(claim: Claim, a: np.ndarray, b: np.ndarray, setting: str, excluded: int = 0) -> dict:
    direction = {"less": "A < B", "greater": "A > B", "two-sided": "A = B"}[claim.alternative]
    if claim.separation:
        test, p = "separation: max(A) < min(B) over runs", math.nan
    else:
        sided = "two-sided" if claim.alternative == "two-sided" else "one-sided"
        test = f"Mann-Whitney U, {sided} ({direction}), seeds as units"
        p = mann_whitney(a, b, claim.alternative) if a.size and b.size else math.nan
    low, high = _difference_ci(a, b)
    effect = float(a.mean() - b.mean()) if a.size and b.size else math.nan
    return {
        "paper": claim.paper,
        "claim": claim.text,
        "metric": METRIC_LABELS.get(claim.metric, claim.metric),
        "setting": setting,
        "A": group_label(claim.a),
        "B": group_label(claim.b),
        "test": test,
        "n A": int(a.size),
        "n B": int(b.size),
        "did not learn (excluded)": int(excluded),
        "mean A": float(a.mean()) if a.size else math.nan,
        "mean B": float(b.mean()) if b.size else math.nan,
        "effect (A - B)": effect,
        "95% CI of effect": "—" if math.isnan(low) else f"[{low:.3f}, {high:.3f}]",
        "p": p,
        "verdict": verdict(claim, a, b, p),
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

    Beside accuracy and fragility: their binomial standard error from ``n images`` (mean over the
    condition's trials), the test-set sampling error the seed spread does not contain; and how many
    trials ``did not learn``."""
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
                row[f"{METRIC_LABELS[m]}: binomial SE"] = f"{g[se].mean():.3f}"
        row["paper"] = _paper_numbers(data, str(dataset), model_label(pe, rpt), proto)
        rows.append({**row, "_key": (str(dataset), model_key(pe, rpt), protocol_key(proto), *map(str, key[4:]))})
    return pd.DataFrame(rows).sort_values("_key").drop(columns="_key").reset_index(drop=True)
