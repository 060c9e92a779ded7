"""The statistics of one claim: its test on the trials that learned and on all trials, its verdict
(from a Holm-adjusted p, or for a claim of no effect its interval against the margin), its power mark,
its precondition as a reading aid beside the verdict, and the paper's numbers beside it.

``analysis.statistics.claims`` defines the claims and assembles the table; the tests are
``analysis.statistics.seedstats``'s.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from analysis.measuring.uniform_attention import uniform_mad
from analysis.statistics import seedstats
from analysis.statistics.labels import model_label
from analysis.statistics.paper_numbers import (PAPER_L_ACC_GAIN, PAPER_L_CUTMIX_MAX, PAPER_L_MIN_MAD,
                                               PAPER_L_NO_CUTMIX_MIN, PAPER_P_APE_SCALING, PAPER_P_MODELS)
from analysis.statistics.seedstats import ALPHA, Comparison, compare, one_sample
from records.vocab import canonical_protocol
from trainables.config.data_roots import DATASET_SPECS

if TYPE_CHECKING:
    from analysis.statistics.claims import Claim
    from analysis.statistics.study_data import StudyData

# A claim of no effect reads its 95% interval against +-margin; the words say which case it is.
CONSISTENT = "consistent with no effect (CI inside the margin)"
SMALL = "consistent with no effect: a small effect, inside the margin (CI excludes 0)"
DIFFERS = "differs (CI wholly outside the margin: contradicts the claim)"
INCONCLUSIVE = "inconclusive (CI crosses the margin)"
# A directional claim whose estimate runs against it: not "no effect", a reversal.
OPPOSITE = "not supported (opposite direction)"
STEP_ALPHA = f"alpha of the verdict (Holm step: {ALPHA} / (m - k + 1); {ALPHA} for a claim of no effect)"
MDE = "MDE (80% power, at the alpha of the verdict)"
TWO_SIDED = "95% CI of effect (two-sided)"
HOLM_FAMILY = "Holm family (m: tested rows of its paper and data set)"

# Preconditions are reading aids, this project's choices (not the papers'): a row keeps its test's
# verdict, and an unmet one adds a mark naming what was measured against what it needs. None is
# computed from the claim's own outcome: the dSSDC claims have none (an APE frame measured as dSSDC
# would gate them on their result).
APE_FRAME_MIN_DSSDC = 0.10  # "APE frame": on the paper's estimator, where the paper's APE falls to 0.098 at alpha 0.6
MAD_BELOW_UNIFORM = 0.05  # "local heads": baseline's minimum MAD this far below uniform attention's MAD


class Needs(enum.StrEnum):
    """A claim's precondition (``Claim.needs``); its value is the words the tables and pages print."""

    APE_FRAME = "APE frame"
    LOCAL_HEADS = "local heads"


PRECONDITIONS = {
    Needs.APE_FRAME: f"the trained APE (fixed order, reference protocol) has mean dSSDC under RPI on the paper's "
                     f"estimator (dssdc_per_batch) >= {APE_FRAME_MIN_DSSDC}",
    Needs.LOCAL_HEADS: f"the baseline's mean minimum MAD is at least {MAD_BELOW_UNIFORM} below uniform attention's MAD",
}
NOT_MET = "precondition not met"


# -- the test of one claim ---------------------------------------------------------------------
def claim_stats(claim: Claim, metric: str, g: pd.DataFrame, in_a: pd.Series, in_b: pd.Series) -> dict:
    """The test of one claim row on the trials that learned and on all trials: the table's statistics
    columns, and (keys starting ``_``) what the verdict needs once the family's p values are adjusted."""
    flagged = g["did_not_learn"].astype(bool) if "did_not_learn" in g else pd.Series(False, index=g.index)
    tested = {}
    for population, mask in (("learned", ~flagged), ("all", pd.Series(True, index=g.index))):
        a, b = g[in_a & mask], g[in_b & mask]
        va, vb = a[metric].to_numpy(float), b[metric].to_numpy(float)
        if claim.b is None:
            c = one_sample(va, claim.alternative, "seed" if claim.order else "trial")
        else:
            c = compare(va, a["seed"].to_numpy(), vb, b["seed"].to_numpy(), claim.alternative)
        tested[population] = (va, vb, c, bool(va.size and vb.size and va.max() < vb.min()))
    a, b, c, separated = tested["learned"]
    *_, every, separated_all = tested["all"]
    return {
        "test": "separation: max(A) < min(B) over runs, and " + c.test if claim.separation else c.test,
        "n A": c.n_a,
        "n B": c.n_b,
        "n pairs": c.n_pairs,
        "did not learn A": int((in_a & flagged).sum()),
        "did not learn B": int((in_b & flagged).sum()),
        "mean A": float(a.mean()) if a.size else math.nan,
        "mean B": float(b.mean()) if b.size and claim.b is not None else math.nan,
        "effect (A - B)": c.effect,
        "95% CI of effect": interval_text(c),
        "CI": c.interval,
        TWO_SIDED: interval_text(c, two_sided=True),
        "p (raw)": c.p,
        "p (sign-flip)": c.sign_flip_p,
        "effect (all trials)": every.effect,
        "95% CI (all trials)": interval_text(every),
        "_p all": every.p, "_c": c, "_c all": every, "_separated": separated, "_separated all": separated_all,
    }


def interval_text(c: Comparison, two_sided: bool = False) -> str | None:
    """``[0.012, 0.034]``, or a one-sided ``(-∞, -0.190]`` / ``[0.190, ∞)``; None without one.
    two_sided: the two-sided 95% interval from the same t statistic, whatever the test's side."""
    lo, hi = seedstats.two_sided(c) if two_sided else (c.low, c.high)
    if math.isnan(lo) and math.isnan(hi):
        return None
    low = "(-∞" if lo == -math.inf else f"[{lo:.3f}"
    high = "∞)" if hi == math.inf else f"{hi:.3f}]"
    return f"{low}, {high}"


def decides(claim: Claim, c: Comparison) -> bool:
    """Whether the claim can reach a verdict at these sizes: a claim of no effect needs its interval (2
    pairs, or 2 trials per group); a directional claim also needs sizes at which its distribution-free
    companion (the exact sign flip, or the exact rank test unpaired) can reach p < ALPHA, so that no
    verdict rests on the t test's normality alone: 5 pairs one-sided."""
    if is_null(claim):
        return math.isfinite(c.low)
    return math.isfinite(c.p) and c.min_p < ALPHA


def verdict(claim: Claim, c: Comparison, p_holm: float, separated: bool) -> str:
    """The verdict words of one claim row from its comparison and Holm-adjusted p (a precondition never
    takes its place: ``reading_aid``).

    A directional claim: "supported" when the Holm-adjusted p < ALPHA (and, for a separation claim,
    every trial of A lies below every trial of B); else "not supported", said as "opposite direction"
    where the estimate runs against the claim. A claim of no effect reads its 95% interval against
    ±margin (not the p of A = B, which only says whether 0 is excluded): consistent with no effect
    when the interval lies inside (a small effect when it also excludes 0); differs only when it lies
    wholly outside, on either side; else inconclusive. An interval that crosses the margin is
    inconclusive even where it excludes 0: a true effect inside the margin is what the claim says."""
    if c.n_a == 0 or c.n_b == 0:
        return "no data"
    if not decides(claim, c):
        return "not enough seeds"
    if is_null(claim):
        m = claim.margin
        if -m <= c.low and c.high <= m:
            return SMALL if c.low > 0 or c.high < 0 else CONSISTENT
        if c.low > m or c.high < -m:
            return DIFFERS
        return INCONCLUSIVE
    held = separated if claim.separation else True
    if held and p_holm < ALPHA:
        return "supported"
    against = c.effect > 0 if claim.alternative == "less" else c.effect < 0
    return OPPOSITE if against else "not supported"


def is_null(claim: Claim) -> bool:
    """A claim of no effect (A = B against a margin)."""
    return claim.alternative == "two-sided" and not claim.separation


def power_mark(claim: Claim, said: str, mde: float, paper_effect: float) -> str:
    """"underpowered" where a row that did not find the effect could not have: its MDE (at the alpha of
    its verdict) exceeds the effect to detect, the paper's |A - B| (for a claim of no effect, its
    margin); "" otherwise, and where the paper gives no number."""
    target = claim.margin if is_null(claim) else abs(paper_effect)
    return "underpowered" if said in ("not supported", OPPOSITE, INCONCLUSIVE) and mde > target else ""


def reading_aid(met: bool | None, measured: str | None) -> str:
    """The mark an unmet precondition adds beside the verdict: which one, what was measured against what
    it needs, and by how much it misses."""
    return f"{NOT_MET}: {measured.removesuffix(': not met')}" if met is False and measured else ""


# -- preconditions ------------------------------------------------------------------------------
def precondition(needs: Needs | str | None, data: StudyData, dataset: str) -> tuple[bool | None, str | None]:
    """(met, what was measured against what it needs) of a claim's precondition (``PRECONDITIONS``) on
    one data set, from the trials that learned, other factors pinned to the reference; met None where
    it was not measured."""
    if needs is None:
        return None, None
    if needs not in PRECONDITIONS:  # a typo is never read as the other one
        raise ValueError(f"unknown precondition {needs!r}; valid preconditions: {list(map(str, Needs))}")
    t = data.per_trial
    t = t[(t["dataset"] == dataset) & ~t["did_not_learn"].astype(bool)]
    if needs == Needs.APE_FRAME:
        rows, _ = data.pin(t[(t["pe"] == "ape") & ~t["rpt"].astype(bool) & t["dssdc_per_batch"].notna()], set())
        if rows.empty:
            return None, f"{needs}: the APE's dSSDC under RPI (paper's estimator) is not measured"
        v = float(rows["dssdc_per_batch"].mean())
        met = v >= APE_FRAME_MIN_DSSDC
        return met, (f"{needs}: trained APE's dSSDC under RPI (paper's estimator, per 1,000 images) {v:.3f}, "
                     f"needs >= {APE_FRAME_MIN_DSSDC:.2f}{'' if met else f', {APE_FRAME_MIN_DSSDC - v:.3f} short'}: "
                     f"{'met' if met else 'not met'}")
    rows, _ = data.pin(t[(t["protocol"] == "baseline") & t["min_mad"].notna()], set())
    grid = grid_size(data, dataset)
    if rows.empty or grid is None:
        return None, f"{needs}: the baseline's minimum MAD or the patch grid is not known"
    v, uniform = float(rows["min_mad"].mean()), uniform_mad(grid)
    need = uniform - MAD_BELOW_UNIFORM
    met = v <= need
    return met, (f"{needs}: baseline's minimum MAD {v:.3f}, needs <= {need:.3f}"
                 f"{'' if met else f', {v - need:.3f} too high'} (uniform attention {uniform:.3f} on {grid} x {grid}, "
                 f"less {MAD_BELOW_UNIFORM}): {'met' if met else 'not met'}")


def grid_size(data: StudyData, dataset: str) -> int | None:
    """G of the data set's trials: img_size // patch_size from the trials table where it has them, else
    the data set's own sizes (``trainables.config.data_roots.DATASET_SPECS``); None where neither says."""
    t, size = data.trials[data.trials["dataset"] == dataset], DATASET_SPECS.get(dataset)

    def first(column: str):
        stored = t[column].dropna() if column in t else pd.Series(dtype=float)
        return int(stored.iloc[0]) if len(stored) else getattr(size, column, None)

    img, patch = first("img_size"), first("patch_size")
    return img // patch if img and patch else None


# -- the paper's numbers ------------------------------------------------------------------------
def paper_numbers(claim: Claim, metric: str, dataset: str, matches_p: bool) -> tuple[str, float]:
    """(``paper A / B`` text, the paper's effect A - B) where this data set's setting matches the
    paper's (Study P: ImageNet-100 / 224 px; Study L: CIFAR-100) and ``metric`` is on the paper's
    scale; ("—", NaN) elsewhere. One scale per comparison: the paper's dSSDC (0.473, its scaling table)
    was measured with one permutation per batch, so it stands only beside ``dssdc_per_batch``, never
    beside the per-image ``dssdc`` nor the PE-scaling drop (measured per image); the severity-grid
    rows have none either (the paper measured its headline severity only)."""
    if claim.paper == "Study P" and matches_p:
        if metric == "fs_jpeg_pe_scale_rise":  # the paper's FS JPEG at alpha 0.4 is one range, 0.627-0.652
            (_, low, high), (_, at_one, _) = PAPER_P_APE_SCALING[0.4], PAPER_P_APE_SCALING[1.0]
            return f"FS JPEG {low:.3f}-{high:.3f} at 0.4 / {at_one:.3f} at 1.0", low - at_one
        if metric == "pe_scale_link":  # ranks only: the paper's per-batch dSSDC scale does not enter
            dssdc, low, high = np.array([PAPER_P_APE_SCALING[a] for a in sorted(PAPER_P_APE_SCALING)]).T
            rho = float(stats.spearmanr(dssdc, (low + high) / 2).statistic)
            return f"Spearman {rho:.3f} over the paper's table (its FS at alpha <= 0.4 one range: tied)", rho
        if claim.order:
            accs = [PAPER_P_MODELS[model_label(g["pe"], g.get("rpt", False))][metric] for g in claim.order]
            rho = float(stats.spearmanr(accs, range(len(accs), 0, -1)).statistic)
            return " > ".join(f"{g['pe']} {a:.3f}" for g, a in zip(claim.order, accs)) + f": Spearman {rho:.0f}", rho
        pairs = [_paper_p(metric, group) for group in (claim.a, claim.b)]
    elif claim.paper == "Study L" and dataset == "cifar100" and metric == claim.metric:
        if claim.separation:
            return f"<= {PAPER_L_CUTMIX_MAX} / >= {PAPER_L_NO_CUTMIX_MIN}", math.nan
        pairs = [_paper_l(claim.metric, group) for group in (claim.a, claim.b)]
    else:
        return "—", math.nan
    if all(text is None for text, _ in pairs):
        return "—", math.nan
    (_, a), (_, b) = pairs
    return " / ".join(text or "—" for text, _ in pairs), (a - b) if a is not None and b is not None else math.nan


def _number(v: float | None) -> tuple[str | None, float | None]:
    return (None, None) if v is None else (f"{v:.3f}", v)


def _paper_p(metric: str, group: dict | None) -> tuple[str | None, float | None]:
    if not group or "pe" not in group:
        return None, None
    label = model_label(group["pe"], group.get("rpt", False))
    if metric == "dssdc_per_batch":  # the paper's estimator: its trained APE's 0.473
        return _number(PAPER_P_APE_SCALING[1.0][0] if label == "ape" else None)
    return _number(PAPER_P_MODELS.get(label, {}).get(metric))


def _paper_l(metric: str, group: dict | None) -> tuple[str | None, float | None]:
    """Minimum MAD per protocol; accuracy as the gain over baseline (the paper gives no level): 0 for
    baseline, the low end of "about 6-7 points" for CutMix and AutoAugment."""
    protocol = canonical_protocol(group.get("protocol", "")) if group else ""
    if metric == "min_mad":
        return _number(PAPER_L_MIN_MAD.get(protocol))
    if metric == "test_acc" and protocol == "baseline":
        return "baseline", 0.0
    if metric == "test_acc" and protocol in PAPER_L_ACC_GAIN:
        low, high = PAPER_L_ACC_GAIN[protocol]
        return f"gain {low:.2f}-{high:.2f}", low
    return None, None
