"""Statistics across seeds: summaries, sampling errors and two-condition comparisons.

Every number is a statistic *across seeds*: one trial (one seed of one condition) is one unit, so
``n`` is always the number of trials behind a value. Every seed is measured on the same evaluation
images, so the seed spread holds no test-set sampling error: ``binomial_se`` and ``fragility_se``
give that error from the image counts, shown beside the seed spread.

Two conditions are compared by ``compare``. Trials with the same seed share their initialisation,
data order, crops, CutMix boxes and RPT permutations, so where every seed appears at most once on
each side the comparison is *paired*: the per-seed differences d = A - B, their mean with a 95%
t interval (n - 1 degrees of freedom), and an exact sign-flip test of mean(d) (every one of the 2^n
sign patterns; a seeded Monte Carlo of them beyond ``EXACT_SIGN_FLIPS`` pairs). Only where seeds do
not pair (a group that pools several conditions, fewer than two common seeds) is it unpaired: a
Mann-Whitney U test and a percentile-bootstrap CI of the difference of the means.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

ALPHA = 0.05  # significance level of every claim test (no multiple-comparison correction: say so)
BOOTSTRAP_RESAMPLES = 2000
EXACT_SIGN_FLIPS = 16  # up to this many pairs the sign-flip test enumerates all 2^n patterns
SIGN_FLIP_RESAMPLES = 20_000


# -- one condition ----------------------------------------------------------------
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


# -- test-set sampling error of one trial ---------------------------------------------
def binomial_se(p: Any, n: Any) -> Any:
    """Binomial standard error sqrt(p (1 - p) / n) of an accuracy p over n images (NaN where n is unknown)."""
    p, n = np.asarray(p, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(np.clip(p * (1 - p), 0, None) / np.where(n > 0, n, np.nan))


def fragility_se(right_both: Any, right_clean_only: Any, right_shift_only: Any, n: Any) -> Any:
    """Delta-method standard error of FS = 1 - acc_shift / acc_clean from its paired counts.

    Over n images, a = right clean and shifted, b = right clean only, c = right shifted only
    (``analysis.metrics.paired_counts``); the cells are multinomial. With X = acc_shift = (a + c) / n,
    Y = acc_clean = (a + b) / n and R = X / Y (FS = 1 - R):

        Var(R) ~ [X (1 - X) - 2 R (a / n - X Y) + R^2 Y (1 - Y)] / (n Y^2)

    (Var X, Var Y binomial; Cov(X, Y) = (P(both right) - X Y) / n). Without images right only under
    the shift (c = 0) it is the binomial SE of the share of clean-right images that survive,
    sqrt(R (1 - R) / (n Y)); images right only under the shift widen it, most near chance.
    NaN where no image is right clean or n is unknown."""
    a, b, c, n = (np.asarray(v, dtype=float) for v in (right_both, right_clean_only, right_shift_only, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.where(n > 0, n, np.nan)
        x, y, both = (a + c) / n, (a + b) / n, a / n
        r = x / y
        var = (x * (1 - x) - 2 * r * (both - x * y) + r**2 * y * (1 - y)) / (n * y**2)
        return np.where(y > 0, np.sqrt(np.clip(var, 0, None)), np.nan)


def fragility_se_without_counts(fs: Any, acc_clean: Any, n: Any) -> Any:
    """FS's SE for measurements stored before the paired counts: the binomial SE of the share
    r = 1 - FS of the n * acc_clean clean-right images that survive, sqrt(r (1 - r) / (n acc_clean)).
    It leaves out images right only under the shift, so it is too small near chance."""
    r = 1.0 - np.asarray(fs, dtype=float)
    return binomial_se(np.clip(r, 0, 1), np.asarray(n, dtype=float) * np.asarray(acc_clean, dtype=float))


# -- two conditions ---------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """A against B on one metric. paired: per-seed differences (n_pairs of them); else two samples.
    effect: mean(d) when paired, mean(A) - mean(B) when not; low, high: its 95% CI; p: the test's p;
    min_p: the smallest p the test can give at these sizes (>= ALPHA: too few seeds to decide)."""

    paired: bool
    n_a: int
    n_b: int
    n_pairs: int
    effect: float
    low: float
    high: float
    p: float
    min_p: float
    test: str
    interval: str


_SIDES = {"less": "A < B", "greater": "A > B", "two-sided": "A = B"}


def compare(a: Any, a_seeds: Any, b: Any, b_seeds: Any, alternative: str) -> Comparison:
    """Compare per-trial values ``a`` (seeds ``a_seeds``) with ``b``; alternative as scipy's
    ("less": A < B). Paired by seed where each side has every seed at most once and at least two
    seeds are common (the pairs: those seeds); otherwise unpaired."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a_seeds, b_seeds = np.asarray(a_seeds), np.asarray(b_seeds)
    sided = "two-sided" if alternative == "two-sided" else f"one-sided ({_SIDES[alternative]})"
    common = np.intersect1d(a_seeds, b_seeds)
    unique = np.unique(a_seeds).size == a_seeds.size and np.unique(b_seeds).size == b_seeds.size
    if unique and common.size >= 2:
        by_a, by_b = dict(zip(a_seeds.tolist(), a)), dict(zip(b_seeds.tolist(), b))
        d = np.array([by_a[s] - by_b[s] for s in common.tolist()])
        low, high = t_interval(d)
        return Comparison(True, a.size, b.size, d.size, float(d.mean()), low, high, sign_flip_p(d, alternative),
                          min_sign_flip_p(d.size, alternative), f"exact sign-flip test of mean(A - B), {sided}, "
                          f"paired by seed ({d.size} pairs)", "paired t, n - 1 df")
    effect = float(a.mean() - b.mean()) if a.size and b.size else math.nan
    low, high = difference_ci(a, b)
    p = mann_whitney(a, b, alternative) if a.size and b.size else math.nan
    why = "seeds do not pair" if a.size and b.size else "a group is empty"
    return Comparison(False, a.size, b.size, 0, effect, low, high, p, min_achievable_p(a.size, b.size, alternative),
                      f"Mann-Whitney U, {sided}, unpaired ({why})", "bootstrap percentile, unpaired")


def t_interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """t interval of mean(d): mean ± t_{(1+level)/2, n-1} sd / sqrt(n); NaN below two values."""
    if d.size < 2:
        return math.nan, math.nan
    half = stats.t.ppf((1 + level) / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


def sign_flip_p(d: np.ndarray, alternative: str) -> float:
    """p of the sign-flip (paired permutation) test of mean(d) = 0: under the null each difference
    is as likely negative as positive. Exact over all 2^n flips up to ``EXACT_SIGN_FLIPS`` pairs."""
    d = np.asarray(d, dtype=float)
    if d.size == 0:
        return math.nan
    if d.size <= EXACT_SIGN_FLIPS:
        signs = ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1) * 2 - 1
    else:
        rng = np.random.default_rng(0)
        signs = np.vstack([np.ones(d.size), rng.choice([-1.0, 1.0], size=(SIGN_FLIP_RESAMPLES, d.size))])
    means, observed = (signs * d).mean(axis=1), d.mean()
    tol = 1e-12 * max(1.0, abs(observed))  # the observed pattern must count itself despite rounding
    if alternative == "less":
        return float((means <= observed + tol).mean())
    if alternative == "greater":
        return float((means >= observed - tol).mean())
    return float((np.abs(means) >= abs(observed) - tol).mean())


def min_sign_flip_p(n: int, alternative: str) -> float:
    """Smallest p the exact sign-flip test can give with n pairs (every difference one sign)."""
    if n == 0:
        return 1.0
    return min(1.0, (2.0 if alternative == "two-sided" else 1.0) / 2**n)


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


def difference_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
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
