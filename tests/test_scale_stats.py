"""Seed statistics at a large sweep's sizes: thousands of pairs, pooled groups of hundreds (CPU, seconds).

A p floor that overflowed (``2.0 / 2**n`` from n = 1,024, ``1 / C(n_a + n_b, n_a)`` from about 515 + 515)
crashed a dry run's seeds notice, a report and a compare; the sign-flip resampling drew all of its
20,001 x n signs at once (1.2 GB at n = 2,500).
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from analysis.statistics import seedstats
from sweeps import cli


def test_a_paired_comparison_of_2000_seeds_has_a_p_floor_and_resamples_in_little_memory():
    rng = np.random.default_rng(3)
    a = rng.normal(0.2, 1.0, 2000)
    seeds = np.arange(2000)
    tracemalloc.start()
    try:
        c = seedstats.compare(a, seeds, np.zeros(2000), seeds, "greater")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert c.paired and c.n_pairs == 2000
    assert c.min_p == 0.0  # 2^-2000 is below every float
    assert c.p < 1e-10 and 0 <= c.sign_flip_p < 1e-3  # an effect of 0.2 sd over 2,000 pairs is plain
    assert peak < 100e6, f"sign flips held {peak / 1e6:.0f} MB at once"


def test_a_pooled_comparison_of_600_and_600_trials_has_a_p_floor():
    rng = np.random.default_rng(4)
    # Seeds repeat within each side (pooled conditions), so the comparison is Welch's.
    c = seedstats.compare(rng.normal(1, 1, 600), np.arange(600) % 60, rng.normal(0, 1, 600), np.arange(600) % 60,
                          "two-sided")
    assert not c.paired and (c.n_a, c.n_b) == (600, 600)
    assert 0.0 <= c.min_p < 1e-300 and c.p < 1e-10


@pytest.mark.parametrize("n", [1, 2, 5, 16, 17, 60, 1022, 1023, 1024, 1100, 5000])
def test_the_sign_flip_floor_is_two_to_the_minus_n(n):
    assert seedstats.min_sign_flip_p(n, "less") == (2.0**-n if n < 1075 else 0.0)
    assert seedstats.min_sign_flip_p(n, "two-sided") == min(1.0, 2.0**(1 - n) if n < 1076 else 0.0)


@pytest.mark.parametrize("n_a, n_b", [(3, 3), (30, 40), (514, 515), (515, 515), (600, 600), (2000, 10)])
def test_the_rank_floor_is_one_over_the_ways_to_split(n_a, n_b):
    ways = math.comb(n_a + n_b, n_a)
    assert seedstats.min_achievable_p(n_a, n_b, "less") == pytest.approx(1 / ways, rel=1e-12, abs=0)
    assert seedstats.min_achievable_p(n_a, n_b, "two-sided") == pytest.approx(min(1.0, 2 / ways), rel=1e-12, abs=0)


def test_the_resampled_sign_flip_p_does_not_depend_on_the_chunk(monkeypatch):
    d = np.random.default_rng(5).normal(0.05, 1.0, 301)
    whole = {alt: seedstats.sign_flip_p(d, alt) for alt in ("less", "greater", "two-sided")}
    monkeypatch.setattr(seedstats, "SIGN_FLIP_CHUNK", 7 * d.size + 5)  # chunks of 7 rows, the last one short
    assert {alt: seedstats.sign_flip_p(d, alt) for alt in whole} == whole


def test_a_dry_run_of_200_seeds_plans_every_trial(capsys):
    assert cli.main(["sweep", "factorial", "--seeds", "200", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "56 conditions x 200 seeds = 11200 trials" in out
