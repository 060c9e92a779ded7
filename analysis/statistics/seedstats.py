"""Statistics across seeds: summaries, sampling errors and two-condition comparisons.

Every number is a statistic *across seeds*: one trial (one seed of one condition) is one unit, so ``n``
is always the number of trials behind a value. Every seed is measured on the same evaluation images, so
the seed spread holds no test-set sampling error: ``binomial_se`` and ``fragility_se`` give that error
from the image counts, shown beside the seed spread.

One condition: the mean over seeds with a t interval (``seed_summary``, ``INTERVAL``); tables and figures
both read it. At 3-5 seeds a percentile bootstrap covers 76-84% where it claims 95% (it is never wider
than the seed range); the t interval covers its level for normal data at any n >= 2.

Two conditions (``compare``): trials with the same seed share their initialisation, data order, crops,
CutMix boxes and RPT permutations, so where every seed appears at most once on each side the comparison
is *paired*: the per-seed differences d = A - B, tested by a paired t test whose p and interval come from
the same t statistic, with the exact sign-flip p of mean(d) (all 2^n sign patterns) beside it as a
distribution-free check. A within-trial difference (one value per trial, ``one_sample``) is tested the
same way. Where seeds do not pair (a group pooling several conditions) it is Welch's unpaired t test.
Each comparison carries its t test's standard error and df (from which ``mde`` gives the minimum
detectable effect at 80% power, at the alpha its verdict uses: ``holm_step_alpha``) and the smallest p its
distribution-free companion can reach at these sizes (``min_p``). ``holm`` adjusts a family of p values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

ALPHA = 0.05  # significance level of every claim test, applied to Holm-adjusted p values
LEVEL = 0.95  # every interval's confidence level
POWER = 0.80  # the power at which the minimum detectable effect is stated
INTERVAL = "95% t interval"  # what a seed summary's low / high are: every table and figure names it so
EXACT_SIGN_FLIPS = 16  # up to this many pairs the sign-flip test enumerates all 2^n patterns
SIGN_FLIP_RESAMPLES = 20_000
# Random signs drawn at once beyond EXACT_SIGN_FLIPS (8 MB as float64): all 20,001 x n at once took 1.2 GB at
# n = 2,500 pairs. The draws are the same stream in chunks, so the p does not depend on the chunk size.
SIGN_FLIP_CHUNK = 2**20


# -- one condition ----------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    """Mean over seeds with its spread: std (ddof 1) and the 95% t interval of the mean (``INTERVAL``)."""

    mean: float
    std: float
    low: float
    high: float
    n: int


def seed_summary(values: Any) -> Summary:
    """Summary of one value per trial (NaNs dropped): mean ± t_{0.975, n-1} std / sqrt(n). n = 1 has no
    spread; constant values a zero-width interval."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return Summary(math.nan, math.nan, math.nan, math.nan, 0)
    mean = float(v.mean())
    if v.size == 1:
        return Summary(mean, math.nan, math.nan, math.nan, 1)
    std = float(v.std(ddof=1))
    half = stats.t.ppf((1 + LEVEL) / 2, v.size - 1) * std / math.sqrt(v.size)
    return Summary(mean, std, mean - half, mean + half, int(v.size))


def summarise(df: pd.DataFrame, by: list[str], value: str = "value") -> pd.DataFrame:
    """One row per group of ``by``: mean, std, low, high (``INTERVAL``), n over the trials in the group.

    Rows are first reduced to one value per trial (mean), so n counts trials (seeds), never rows."""
    cols = [*by, "mean", "std", "low", "high", "n"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    per_trial = df.groupby([*by, "trial_id"], dropna=False, observed=True)[value].mean().reset_index()
    rows = [{**dict(zip(by, key if isinstance(key, tuple) else (key,))), **seed_summary(g[value]).__dict__}
            for key, g in per_trial.groupby(by, dropna=False, observed=True)]
    return pd.DataFrame(rows, columns=cols)


def mean_std(values: Any, digits: int = 3) -> str:
    """``0.316 ± 0.012`` (std over seeds); a single seed shows no ±; no seeds show a dash."""
    s = seed_summary(values)
    if s.n == 0:
        return "—"
    return f"{s.mean:.{digits}f}" if s.n == 1 else f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"


def mean_ci(values: Any, digits: int = 3) -> str:
    """``0.481 [0.470, 0.492]``: mean over seeds with its ``INTERVAL``; one seed has none."""
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
    (``analysis.measuring.metrics.paired_counts``); the cells are multinomial. With X = acc_shift = (a + c) / n,
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
    """A against B on one metric. paired: per-seed (or within-trial) differences, n_pairs of them; else two
    samples (Welch). effect: mean(d) when paired, mean(A) - mean(B) when not; low, high: its interval from
    the deciding t test (two-sided for a two-sided test, else one-sided with an infinite end), named by
    ``interval``; p: that test's p, unadjusted; sign_flip_p: the exact sign-flip p of the same differences
    (NaN unpaired); min_p: the smallest p the distribution-free companion (sign flip, or the exact rank
    test unpaired) can reach at these sizes; se, df: the t test's standard error of the effect and its
    degrees of freedom (NaN without a spread), from which ``two_sided`` and ``mde`` follow."""

    paired: bool
    n_a: int
    n_b: int
    n_pairs: int
    effect: float
    low: float
    high: float
    p: float
    sign_flip_p: float
    min_p: float
    se: float
    df: float
    test: str
    interval: str
    alternative: str


_SIDES = {"less": "A < B", "greater": "A > B", "two-sided": "A = B"}


def compare(a: Any, a_seeds: Any, b: Any, b_seeds: Any, alternative: str) -> Comparison:
    """Compare per-trial values ``a`` (seeds ``a_seeds``) with ``b``; alternative as scipy's
    ("less": A < B). Paired by seed where each side has every seed at most once and at least two
    seeds are common (the pairs: those seeds), or both sides are the same single seed (one pair, no
    test); otherwise Welch's unpaired t test, its label saying why."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a_seeds, b_seeds = np.asarray(a_seeds), np.asarray(b_seeds)
    common = np.intersect1d(a_seeds, b_seeds)
    unique = np.unique(a_seeds).size == a_seeds.size and np.unique(b_seeds).size == b_seeds.size
    # One seed on each side, the same: one pair (no test at n = 1, but the pairing is what it is).
    if unique and (common.size >= 2 or common.size == a.size == b.size == 1):
        by_a, by_b = dict(zip(a_seeds.tolist(), a)), dict(zip(b_seeds.tolist(), b))
        d = np.array([by_a[s] - by_b[s] for s in common.tolist()])
        return _paired(d, alternative, a.size, b.size, f"paired by seed ({d.size} pair{'s' * (d.size > 1)})")
    why = ("a group is empty" if not (a.size and b.size) else "seeds do not pair" if not unique
           else f"{common.size} seed(s) in common, a paired test needs 2")
    return welch(a, b, alternative, why)


def one_sample(d: Any, alternative: str, unit: str = "trial") -> Comparison:
    """A within-unit statistic d (one per trial: a within-trial difference or correlation; or one per
    seed across its trials, ``unit="seed"``) tested against 0 across seeds, as a paired comparison."""
    d = np.asarray(d, dtype=float)
    return _paired(d, alternative, d.size, d.size, f"paired within each {unit}, then across seeds ({d.size} {unit}s)")


def _sided(alternative: str) -> str:
    return "two-sided" if alternative == "two-sided" else f"one-sided ({_SIDES[alternative]})"


def _interval_name(kind: str, alternative: str) -> str:
    return f"{kind}, {'' if alternative == 'two-sided' else 'one-sided '}{LEVEL:.0%}"


def _paired(d: np.ndarray, alternative: str, n_a: int, n_b: int, pairs: str) -> Comparison:
    n = d.size
    effect = float(d.mean()) if n else math.nan
    se = float(d.std(ddof=1)) / math.sqrt(n) if n >= 2 else math.nan
    p, low, high = t_test(effect, se, n - 1, alternative)
    return Comparison(True, n_a, n_b, n, effect, low, high, p, sign_flip_p(d, alternative),
                      min_sign_flip_p(n, alternative), se, n - 1 if n >= 2 else math.nan,
                      f"paired t test of mean(A - B), {_sided(alternative)}, {pairs}",
                      _interval_name("paired t", alternative), alternative)


def welch(a: np.ndarray, b: np.ndarray, alternative: str, why: str = "seeds do not pair") -> Comparison:
    """Welch's t test of mean(A) - mean(B): se^2 = s_A^2 / n_A + s_B^2 / n_B, Welch-Satterthwaite df."""
    effect = float(a.mean() - b.mean()) if a.size and b.size else math.nan
    se, df = math.nan, math.nan
    if a.size >= 2 and b.size >= 2:
        va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)) if va + vb > 0 else a.size + b.size - 2
    p, low, high = t_test(effect, se, df, alternative)
    min_p = min_achievable_p(a.size, b.size, alternative) if a.size and b.size else 1.0
    return Comparison(False, a.size, b.size, 0, effect, low, high, p, math.nan, min_p, se, df,
                      f"Welch t test, {_sided(alternative)}, unpaired ({why})", _interval_name("Welch t", alternative),
                      alternative)


def t_test(effect: float, se: float, df: float, alternative: str) -> tuple[float, float, float]:
    """(p, low, high) of a t test of ``effect`` = 0 with standard error ``se`` on ``df`` degrees of
    freedom: the p and the interval at ``LEVEL`` from the same t statistic (one-sided alternatives get
    a one-sided interval, so p < 1 - LEVEL exactly when it excludes 0). NaN without a spread (df < 1);
    a zero spread is an infinite t."""
    if not (df >= 1 and math.isfinite(se)):
        return math.nan, math.nan, math.nan
    if alternative == "two-sided":
        half = stats.t.ppf((1 + LEVEL) / 2, df) * se
        low, high = effect - half, effect + half
    else:
        bound = stats.t.ppf(LEVEL, df) * se
        low, high = (-math.inf, effect + bound) if alternative == "less" else (effect - bound, math.inf)
    if se == 0:
        hit = {"less": effect < 0, "greater": effect > 0, "two-sided": effect != 0}[alternative]
        return (0.0 if hit else 1.0), low, high
    t = effect / se
    p = {"less": stats.t.cdf(t, df), "greater": stats.t.sf(t, df), "two-sided": 2 * stats.t.sf(abs(t), df)}
    return float(p[alternative]), float(low), float(high)


def two_sided(c: Comparison) -> tuple[float, float]:
    """The two-sided 95% interval of a comparison's effect from the same t statistic, shown beside a
    one-sided test's interval so that an estimate in the wrong direction is seen; NaN without a spread."""
    _, low, high = t_test(c.effect, c.se, c.df, "two-sided")
    return low, high


def mde(se: float, df: float, alternative: str, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable effect: the |effect| the t test (``se``, ``df``, its rejection region at
    ``alpha``: a claim's Holm step, ``holm_step_alpha``) rejects with probability ``power``, from the
    noncentral t distribution.
    One-sided: P(T' > t_{1-alpha}) = power; two-sided: P(|T'| > t_{1-alpha/2}) = power. NaN without a spread."""
    if not (df >= 1 and math.isfinite(se)):
        return math.nan
    if se == 0:
        return 0.0
    two = alternative == "two-sided"
    crit = stats.t.ppf(1 - alpha / (2 if two else 1), df)

    def missing(ncp):
        # scipy's nct is NaN far out in a tail: there the upper tail is 1 and the lower one 0.
        upper = np.nan_to_num(stats.nct.sf(crit, df, ncp), nan=1.0)
        lower = np.nan_to_num(stats.nct.cdf(-crit, df, ncp), nan=0.0) if two else 0.0
        return upper + lower - power
    high = 1.0
    while missing(high) < 0:  # bracket the root
        high *= 2
    return float(optimize.brentq(missing, 0.0, high) * se)


def holm(p: Any) -> np.ndarray:
    """Holm's step-down adjustment of a family of p values (NaN: not in the family): the i-th smallest
    of m is multiplied by m - i + 1, made monotone, capped at 1. Rejecting adjusted p < alpha holds
    the family-wise error rate at alpha."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m = order.size
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    return out


def holm_step_alpha(p: Any, alpha: float = ALPHA) -> np.ndarray:
    """The alpha each raw p of a family is compared with in Holm's step-down: alpha / (m - k + 1) for
    the one ranked k of m by raw p (ties in the order ``holm`` takes them); NaN outside the family.
    A row's power is stated at this alpha, the one its verdict effectively uses (at 5 pairs and 8
    claims the first step's MDE is 2.48 sd one-sided, not the 1.36 sd of unadjusted alpha)."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    out[order] = alpha / (order.size - np.arange(order.size))
    return out


def sign_flip_p(d: np.ndarray, alternative: str) -> float:
    """p of the sign-flip (paired permutation) test of mean(d) = 0: under the null each difference
    is as likely negative as positive. Exact over all 2^n flips up to ``EXACT_SIGN_FLIPS`` pairs."""
    d = np.asarray(d, dtype=float)
    if d.size == 0:
        return math.nan
    if d.size <= EXACT_SIGN_FLIPS:
        signs = ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1) * 2 - 1
        means = (signs * d).mean(axis=1)
    else:
        rng, rows = np.random.default_rng(0), max(1, SIGN_FLIP_CHUNK // d.size)
        means = np.concatenate([(np.ones((1, d.size)) * d).mean(axis=1), *(
            (rng.choice([-1.0, 1.0], size=(min(rows, SIGN_FLIP_RESAMPLES - start), d.size)) * d).mean(axis=1)
            for start in range(0, SIGN_FLIP_RESAMPLES, rows))])
    observed = d.mean()
    tol = 1e-12 * max(1.0, abs(observed))  # the observed pattern must count itself despite rounding
    if alternative == "less":
        return float((means <= observed + tol).mean())
    if alternative == "greater":
        return float((means >= observed - tol).mean())
    return float((np.abs(means) >= abs(observed) - tol).mean())


def min_sign_flip_p(n: int, alternative: str) -> float:
    """Smallest p the exact sign-flip test can give with n pairs (every difference one sign): 2^-n
    one-sided, by its exponent (``2.0 / 2**n`` overflows from n = 1,024 on); 0.0 once below a float."""
    if n == 0:
        return 1.0
    return min(1.0, math.ldexp(2.0 if alternative == "two-sided" else 1.0, -n))


def min_achievable_p(n_a: int, n_b: int, alternative: str) -> float:
    """Smallest p an exact rank (Mann-Whitney) test can return with these group sizes: complete
    separation, 1 / C(n_a + n_b, n_a) one-sided. Past 2^1023 (from about 515 + 515) C does not convert to
    a float: the int quotient then, a subnormal or 0.0."""
    ways = math.comb(n_a + n_b, n_a)
    p = 1.0 / ways if ways.bit_length() <= 1023 else 1 / ways
    return min(1.0, 2 * p) if alternative == "two-sided" else p
