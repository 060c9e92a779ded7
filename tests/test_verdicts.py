"""Verdicts that read the evidence right (#40), by simulation: the error rate of every verdict at 3, 5
and 10 seeds, with per-seed differences drawn and run through ``seedstats.compare``, ``seedstats.holm``
and ``claim_tests.verdict`` as ``analysis.statistics.claims`` calls them (CPU, a few seconds; no figures, no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_claims import PAIRS, diffs, evaluate, paired, study

from analysis.statistics import claim_tests, claims, seedstats
from analysis.statistics.study_data import StudyData

REPLICATES = 1000  # per cell: a rate's binomial SE is at most 0.016
FAMILY = 12  # Study L's Holm family: the claim and 11 others, their p drawn uniform (true nulls)
NULL = claims.Claim("Study L", "simulated: A leaves the metric at B", "min_mad", {"protocol": "a"},
                    {"protocol": "b"}, "two-sided", margin=0.02)
LOWER = claims.Claim("Study L", "simulated: A lowers the metric", "min_mad", {"protocol": "a"}, {"protocol": "b"})


def rates(claim: claims.Claim, n: int, effect: float, sd: float, seed: int) -> dict[str, float]:
    """Share of each verdict over ``REPLICATES`` studies of n paired seeds whose true effect A - B is
    ``effect``, the per-seed differences N(effect, sd), B a seed effect the pairing removes."""
    rng = np.random.default_rng(seed)
    seeds = np.arange(n)
    said = []
    for _ in range(REPLICATES):
        b = 0.3 + rng.normal(0, 0.05, n)
        c = seedstats.compare(b + rng.normal(effect, sd, n), seeds, b, seeds, claim.alternative)
        p_holm = seedstats.holm(np.r_[c.p, rng.random(FAMILY - 1)])[0]
        said.append(claim_tests.verdict(claim, c, p_holm, separated=False))
    words, counts = np.unique(said, return_counts=True)
    return dict(zip(words.tolist(), (counts / REPLICATES).tolist()))


def differs(r: dict) -> float:
    return r.get(claim_tests.DIFFERS, 0.0)


def consistent(r: dict) -> float:
    return r.get(claim_tests.CONSISTENT, 0.0) + r.get(claim_tests.SMALL, 0.0)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_a_null_claim_reads_differs_only_for_an_effect_outside_its_margin(n):
    """A true effect inside the margin is what the claim says: it reads "differs" at most 5% of the time
    at any n (the old rule, "differs" whenever the interval excluded 0 at Holm p < 0.05 and was not
    wholly inside, gave 57-60% at 3/4 of the margin and 5 seeds). One at twice the margin reads
    "differs" at least 80% of the time at 5 seeds with sd = margin / 2."""
    m = NULL.margin
    sd = m / 2
    inside = {k: rates(NULL, n, k * m, sd, seed=100 * n + i) for i, k in enumerate((0.0, 0.5, 0.75))}
    outside = rates(NULL, n, 2 * m, sd, seed=100 * n + 9)
    assert all(differs(r) <= 0.05 for r in inside.values()), inside
    # Above the margin the interval can only be "wholly outside" on the effect's side, never below -margin.
    assert all(differs(r) + consistent(r) + r.get(claim_tests.INCONCLUSIVE, 0.0) == pytest.approx(1.0)
               for r in (*inside.values(), outside))
    if n == 5:
        assert differs(outside) >= 0.80, outside
    if n == 10:  # enough seeds to show no effect: the interval (half-width 0.36 margin) fits inside
        assert consistent(inside[0.0]) >= 0.90, inside[0.0]
    if n == 3:  # an expected half-width of about 1.2 margins: mostly too wide to say either
        assert inside[0.0][claim_tests.INCONCLUSIVE] >= 0.5, inside[0.0]


@pytest.mark.parametrize("n", [3, 5, 10])
def test_a_directional_claim_is_supported_at_most_alpha_without_an_effect_and_says_a_reversal(n):
    sd = 0.01
    none = rates(LOWER, n, 0.0, sd, seed=7 * n)
    reversed_ = rates(LOWER, n, +3 * sd, sd, seed=7 * n + 1)
    if n == 3:  # the sign-flip check cannot reach 0.05 (1/8): no directional verdict at all
        assert none == reversed_ == {"not enough seeds": 1.0}
        return
    assert none.get("supported", 0.0) <= seedstats.ALPHA
    # Without an effect about half the estimates fall on the wrong side: said as such, never "supported".
    assert none[claim_tests.OPPOSITE] == pytest.approx(0.5, abs=0.06)
    assert reversed_.get("supported", 0.0) == 0.0 and reversed_[claim_tests.OPPOSITE] >= 0.95


# -- the Holm step's alpha, and the MDE stated at it ---------------------------------------------------
def test_holm_step_alpha_by_hand_and_the_mde_at_it():
    p = np.array([0.04, np.nan, 0.001, 0.02])
    # ranked 0.001, 0.02, 0.04 of m = 3: alpha / 3, alpha / 2, alpha / 1
    assert seedstats.holm_step_alpha(p)[[2, 3, 0]] == pytest.approx([0.05 / 3, 0.05 / 2, 0.05])
    assert math.isnan(seedstats.holm_step_alpha(p)[1])
    # 5 pairs, 8 claims: the first step's one-sided MDE is 2.48 sd, not the 1.36 sd of unadjusted alpha.
    se = 1 / math.sqrt(PAIRS)
    assert seedstats.mde(se, PAIRS - 1, "less", alpha=0.05 / 8) == pytest.approx(2.48, abs=0.01)
    assert seedstats.mde(se, PAIRS - 1, "less") == pytest.approx(1.36, abs=0.01)


def test_the_mde_column_is_at_the_alpha_of_each_rows_verdict():
    sd = 0.01
    rows = []
    for seed, (gain_cm, gain_aa) in enumerate(zip(diffs(0.05, sd), diffs(0.01, sd))):
        rows += [{"protocol": "baseline", "seed": seed, "test_acc": 0.5},
                 {"protocol": "cutmix", "seed": seed, "test_acc": 0.5 + gain_cm},
                 {"protocol": "autoaugment", "seed": seed, "test_acc": 0.5 + gain_aa}]
    table = evaluate(study(rows), "CutMix adds accuracy", "AutoAugment adds accuracy").set_index("claim")
    # CutMix's p ranks first of two (alpha / 2), AutoAugment's second (alpha).
    assert table[claim_tests.STEP_ALPHA].tolist() == pytest.approx([0.025, 0.05])
    assert table[claim_tests.HOLM_FAMILY].tolist() == [2, 2]
    se = sd / math.sqrt(PAIRS)
    assert table[claim_tests.MDE].tolist() == pytest.approx(
        [seedstats.mde(se, PAIRS - 1, "greater", alpha=a) for a in (0.025, 0.05)])


# -- direction in words, two-sided intervals beside the one-sided test ----------------------------------
def test_an_estimate_against_the_claim_says_opposite_direction_with_its_two_sided_interval():
    rows = paired({"protocol": "cutmix"}, {"protocol": "baseline"}, "min_mad", 0.30, diffs(0.005, 0.002))
    (row,) = evaluate(study(rows), "CutMix alone lowers minimum MAD").to_dict("records")
    assert row["verdict"] == claim_tests.OPPOSITE
    assert row["95% CI of effect"].startswith("(-∞, ")  # the test's one-sided interval hides the estimate's side
    half = 2.776 * 0.002 / math.sqrt(PAIRS)
    assert row[claim_tests.TWO_SIDED] == f"[{0.005 - half:.3f}, {0.005 + half:.3f}]"


# -- Study L's early layers ---------------------------------------------------------------------------
def test_study_l_tests_early_layers_apart_from_the_network_minimum():
    """CutMix leaves the network-wide minimum MAD where it was and makes layers 0-1 local and
    concentrated: the minimum-MAD claim is not supported, the early-layer claims are."""
    rows = []
    for seed, (mad, ent) in enumerate(zip(diffs(-0.1, 0.01), diffs(-0.2, 0.02))):
        base = {"seed": seed, "min_mad": 0.2 + 0.001 * seed}
        rows += [{**base, "protocol": "baseline", "mad_early": 0.4, "entropy_early": 0.9},
                 {**base, "protocol": "cutmix", "mad_early": 0.4 + mad, "entropy_early": 0.9 + ent}]
    table = evaluate(study(rows), "CutMix alone lowers minimum MAD",
                     "CutMix alone makes early layers more local (mean MAD of layers 0-1)",
                     "CutMix alone concentrates early-layer attention (mean entropy of layers 0-1)").set_index("claim")
    assert table["verdict"].tolist() == ["not supported", "supported", "supported"]
    assert table["metric"].tolist()[1:] == ["mean MAD of layers 0-1", "mean attention entropy of layers 0-1"]
    family = [c for c in claims.CLAIMS if c.paper == "Study L"]
    assert len(family) == 12 and {c.metric for c in family} >= {"mad_early", "entropy_early"}


# -- CLS sinks -----------------------------------------------------------------------------------------
def test_an_all_sink_trial_is_counted_and_the_sensitivity_row_keeps_sinks_outside_the_family():
    import pandas as pd

    trials, measured = [], []
    for i, (protocol, seed) in enumerate((p, s) for s in range(PAIRS) for p in ("baseline", "cutmix")):
        tid = f"t{i}"
        trials.append({"trial_id": tid, "status": "finished", "dataset": "cifar100", "img_size": 32, "pe": "ape",
                       "rpt": False, "protocol": protocol, "seed": seed, "test_acc": 0.5})
        every_head_a_sink = (protocol, seed) == ("cutmix", 0)
        for head in range(2):
            mad = (0.1 if protocol == "cutmix" else 0.3) + 0.01 * seed + 0.1 * head
            mass = 0.9 if every_head_a_sink or head == 1 else 0.1
            for metric, value in (("mad", mad), ("cls_mass", mass)):
                measured.append({"trial_id": tid, "checkpoint_epoch": 4, "intervention": "clean", "level": None,
                                 "layer": 2, "head_index": head, "metric": metric, "value": value,
                                 "n_images": 100})
    data = StudyData.from_frames("sinks", pd.DataFrame(trials), pd.DataFrame(), pd.DataFrame(measured))
    assert data.per_trial["all_heads_cls_sinks"].sum() == 1
    table = evaluate(data, "CutMix alone lowers minimum MAD", sensitivity=True)
    main, kept = (table[table["setting"].str.endswith(claims.SINKS_KEPT_MARK) == k].iloc[0] for k in (False, True))
    assert main["n A"] == 4 and kept["n A"] == 5  # the all-sink trial drops out of the minimum, said so
    assert main["CLS sinks (A; B)"] == "6 sink head(s), 1 trial(s) all sinks, left out; 5 sink head(s)"
    # a family of one: the repeat is not in it
    assert kept[claim_tests.STEP_ALPHA] == main[claim_tests.STEP_ALPHA] == 0.05
    assert kept[claim_tests.HOLM_FAMILY] == main[claim_tests.HOLM_FAMILY] == 1  # read at its row's step, of its family
    assert kept["p (Holm)"] == pytest.approx(kept["p (raw)"])


def test_the_page_shows_an_unmet_preconditions_mark_under_the_verdict_it_leaves_in_place(tmp_path):
    from analysis.reporting import claims_page, report

    rows = paired({"protocol": "cutmix"}, {"protocol": "baseline"}, "min_mad", 0.40, diffs(-0.2, 0.01))
    table = evaluate(study(rows), "CutMix alone lowers minimum MAD")
    cell = claims_page.claims_section(table).split("<td class='v-supported'>", 1)[1].split("</td>", 1)[0]
    assert cell.startswith("supported<br><small class='aid'>precondition not met: local heads: baseline&#x27;s "
                           "minimum MAD 0.406, needs &lt;= 0.368, 0.038 too high")
    tex = report.write_claims_latex(tmp_path, table).read_text()  # the mark in claims.tex too, in its own column
    assert "& note \\\\" in tex and "needs <= 0.368, 0.038 too high" in tex


# -- the smaller items: the PE-scaling link across alpha, the clean-accuracy ordering -------------------
def _scaled(sign: float) -> StudyData:
    """Five APE trials measured at every PE scale: FS JPEG falls as dSSDC rises when ``sign`` is -1, a
    seed-dependent swap of two levels keeping the per-trial correlations apart."""
    import pandas as pd

    trials, measured = [], []
    for seed in range(PAIRS):
        tid = f"t{seed}"
        trials.append({"trial_id": tid, "status": "finished", "dataset": "imagenet100", "img_size": 224,
                       "pe": "ape", "rpt": False, "protocol": "baseline", "seed": seed, "test_acc": 0.6})
        alphas = [round(0.1 * k, 1) for k in range(11)]
        fs = [0.6 + sign * 0.02 * k for k in range(11)]
        fs[seed + 1], fs[seed + 2] = fs[seed + 2], fs[seed + 1]  # one swapped pair: Spearman -0.988, not -1
        for alpha, f in zip(alphas, fs):
            for metric, value in (("dssdc", 0.05 * alpha), ("fs_jpeg", f)):
                measured.append({"trial_id": tid, "checkpoint_epoch": 4, "intervention": "pe_scale", "level": alpha,
                                 "layer": None, "head_index": None, "metric": metric, "value": value,
                                 "n_images": 100})
        measured.append({"trial_id": tid, "checkpoint_epoch": 4, "intervention": "rpi", "level": None, "layer": None,
                         "head_index": None, "metric": "dssdc_per_batch", "value": 0.3, "n_images": 100})
    return StudyData.from_frames("scaled", pd.DataFrame(trials), pd.DataFrame(), pd.DataFrame(measured))


def test_the_pe_scaling_link_is_an_association_across_every_alpha():
    text = "scaling the APE links dSSDC and FS JPEG (per-trial Spearman over alpha 0.1-1.0 < 0)"
    linked, unlinked = _scaled(-1.0), _scaled(+1.0)
    # alpha 0 (a sanity point) is left out: 10 levels, one adjacent swap -> 1 - 6 * 2 / (10 * 99) short of 1
    assert linked.per_trial["pe_scale_link"].tolist() == pytest.approx([-1 + 12 / 990] * PAIRS)
    (row,) = evaluate(linked, text).to_dict("records")
    assert row["verdict"] == "supported" and "paired within each trial, then across seeds (5 trials)" in row["test"]
    assert row["paper effect (A - B)"] == pytest.approx(-1.0) and row["precondition"].endswith(": met")
    (row,) = evaluate(unlinked, text).to_dict("records")
    assert row["verdict"] == claim_tests.OPPOSITE


def test_the_clean_accuracy_ordering_is_one_claim_of_a_per_seed_spearman():
    text = "clean accuracy ranks rope2d > sincos2d > ape > none (per-seed Spearman > 0)"
    order = ("rope2d", "sincos2d", "ape", "none")
    for flip, said in ((False, "supported"), (True, claim_tests.OPPOSITE)):
        rows = []
        for seed in range(PAIRS):
            accs = [0.69, 0.66, 0.64, 0.57]
            if seed % 2:  # every other seed has sincos2d and ape the other way round: Spearman 0.8
                accs[1], accs[2] = accs[2], accs[1]
            for pe, acc in zip(order, accs[::-1] if flip else accs):
                rows.append({"pe": pe, "seed": seed, "test_acc": acc})
        rows += [{"pe": "ape", "rpt": True, "seed": s, "test_acc": 0.9} for s in range(PAIRS)]  # not in the order
        (row,) = evaluate(study(rows, dataset="imagenet100", img_size=224), text).to_dict("records")
        assert row["verdict"] == said and row["n A"] == PAIRS
        assert row["mean A"] == pytest.approx((3 * 1.0 + 2 * 0.8) / 5 * (-1 if flip else 1))
        assert "paired within each seed, then across seeds (5 seeds)" in row["test"]
        assert row["paper A / B"] == "rope2d 0.690 > sincos2d 0.657 > ape 0.641 > none 0.568: Spearman 1"


# -- the first screen: what a reader sees of a row (#43) -------------------------------------------------
def test_one_seed_reads_as_one_pair_with_blank_interval_cells_and_claims_tex_has_the_shown_columns(tmp_path):
    from analysis.reporting import claims_page, report

    rows = paired({"protocol": "cutmix"}, {"protocol": "baseline"}, "min_mad", 0.30, np.array([-0.2]))
    table = evaluate(study(rows), "CutMix alone lowers minimum MAD", sensitivity=True)  # the sinks-kept repeat too
    assert all("paired by seed (1 pair)" in t and "do not pair" not in t for t in table["test"])
    shown = claims_page.visible_claims(table)
    assert shown["n"].tolist() == ["1 / 1 (1 pair)"] * 2 and shown["effect (A - B)"].tolist() == ["-0.200"] * 2
    # No interval and no p at one seed: blank cells, on the repeated row too (its p is not a made-up 1).
    assert (shown[["95% CI (two-sided)", "p (adjusted)"]] == "").all().all() and table["p (Holm)"].isna().all()
    section = claims_page.claims_section(table)
    assert "None" not in section and "not enough seeds" in section and "How to read this table" in section
    assert "no claim can be decided" in section  # the tally says why every row is grey
    # claims.tex: the table as shown (no note column: no row has one); claims-full.tex: every column.
    tex = report.write_claims_latex(tmp_path, table).read_text()
    header = tex.split("\\midrule")[0].split("\\toprule")[1]
    assert [c.strip() for c in header.replace("\\\\", "").split("&")] == [
        "claim", "setting", "n", "effect (A - B)", "95\\% CI (two-sided)", "p (adjusted)", "verdict"]
    assert "None" not in tex and tex.count("not enough seeds") == 2
    report.write_tables(tmp_path, {"claims": table})
    full = (tmp_path / "claims-full.tex").read_text()
    assert "reading aid" in full and "p (sign-flip)" in full and (tmp_path / "claims.csv").exists()


def test_seeds_that_pair_once_are_said_so_and_a_category_dot_stays_off_the_axis_spine():
    from matplotlib.figure import Figure

    from analysis.reporting import plotting

    c = seedstats.compare([0.1, 0.2], [0, 1], [0.3, 0.4], [0, 2], "less")  # one seed in common: no pairing
    assert not c.paired and "unpaired (1 seed(s) in common, a paired test needs 2)" in c.test
    assert "unpaired (seeds do not pair)" in seedstats.compare([0.1, 0.2], [0, 0], [0.3], [0], "less").test
    ax = Figure().add_subplot()
    for x in range(2):
        plotting.points(ax, x, [0.4 + 0.1 * x], "C0", f"group {x}")
    low, high = ax.get_xlim()
    assert low <= -0.5 and high >= 1.5  # each category owns the unit around it: no dot on the frame
