"""Verdicts a referee accepts: intervals that cover, tests that decide, Holm, power, preconditions, and
every claim of both papers on hand-made per-trial data (CPU, seconds; no figures, no Ray).

The hand-made studies are real ``StudyData`` built from trials and measurement rows as the analysis
writes them, so ``per_trial`` derives every claim's metric the way a sweep's report does.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.measuring.uniform_attention import uniform_mad
from analysis.statistics import claim_tests, claims, seedstats
from analysis.statistics.study_data import StudyData
from sweeps import run as launcher
from sweeps.launch import options

PAIRS = 5
MDE_COLUMN = claim_tests.MDE
APE, RPT, NONE = ("ape", False), ("ape", True), ("none", False)


def diffs(mean: float, sd: float, n: int = PAIRS) -> np.ndarray:
    """n per-seed differences with exactly this mean and sd (ddof 1)."""
    z = np.arange(n) - (n - 1) / 2
    return mean + sd * z / z.std(ddof=1)


def _measurements(trial_id: str, values: dict) -> list[dict]:
    """Measurement rows from which ``StudyData.per_trial`` gives back ``values`` (per-trial metrics)."""
    whole = {"trial_id": trial_id, "layer": None, "head_index": None, "n_images": 1000, "checkpoint_epoch": 10}
    rows = []

    def add(intervention, level, metric, value, **where):
        rows.append({**whole, "intervention": intervention, "level": level, "metric": metric, "value": value,
                     **where})

    for name, value in values.items():
        if name == "min_mad":  # a head of layer 2, so that the early layers' heads are their own
            add("clean", None, "mad", value, layer=2, head_index=0)
        elif name == "mad_early":
            add("clean", None, "mad", value, layer=0, head_index=0)
        elif name == "entropy_early":
            add("clean", None, "entropy", value, layer=0, head_index=0)
        elif name in ("dssdc", "dssdc_per_batch"):
            add("rpi", None, name, value)
        elif name in ("fs_jpeg", "fs_blur"):
            add(name[3:], 5.0 if name == "fs_jpeg" else 2.5, "fs", value)
        elif name == "fs_jpeg_grid":  # a second JPEG quality, so that the grid's mean is `value`
            add("jpeg", 50.0, "fs", 2 * value - values["fs_jpeg"])
        elif name == "fs_jpeg_pe_scale_rise":
            add("pe_scale", 0.4, "fs_jpeg", 0.4 + value)
            add("pe_scale", 1.0, "fs_jpeg", 0.4)
        elif name == "dssdc_pe_scale_drop":
            add("pe_scale", 1.0, "dssdc", 0.1 + value)
            add("pe_scale", 0.4, "dssdc", 0.1)
    if "pe_scale_link" in values:  # the levels between: dSSDC rising with alpha, FS JPEG falling (Spearman -1)
        rise, drop = values["fs_jpeg_pe_scale_rise"], values["dssdc_pe_scale_drop"]
        for alpha in (0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9):
            add("pe_scale", alpha, "dssdc", 0.1 + abs(drop) * (alpha - 0.4))
            add("pe_scale", alpha, "fs_jpeg", 0.4 + abs(rise) * (1.0 - alpha) / 0.6)
    return rows


def study(trials: list[dict], dataset: str = "cifar100", img_size: int = 32) -> StudyData:
    """trials: pe, rpt, protocol, seed (and optionally dataset, img_size) with per-trial values."""
    rows, measured = [], []
    for i, t in enumerate(trials):
        factors = {"dataset": dataset, "img_size": img_size, "pe": "ape", "rpt": False, "protocol": "baseline",
                   **{k: t[k] for k in ("dataset", "img_size", "pe", "rpt", "protocol", "seed") if k in t}}
        rows.append({"trial_id": f"t{i}", "status": "finished", **factors, "test_acc": t.get("test_acc", 0.5)})
        values = {k: v for k, v in t.items() if k not in factors and k != "test_acc"}
        measured += _measurements(f"t{i}", values)
    return StudyData.from_frames("hand", pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(measured))


def paired(a: dict, b: dict, metric: str, base: float, d: np.ndarray, common: dict | None = None, **kw) -> list[dict]:
    """Trials of groups a and b over len(d) seeds: b at ``base`` (plus a seed offset), a = b + d."""
    out = []
    for seed, step in enumerate(d):
        offset = 0.003 * seed  # a shared seed effect the pairing removes
        out.append({**a, "seed": seed, metric: base + offset + step, **(common or {}), **kw})
        out.append({**b, "seed": seed, metric: base + offset, **(common or {}), **kw})
    return out


def one(claim_text: str) -> claims.Claim:
    return next(c for c in claims.CLAIMS if c.text == claim_text)


def evaluate(data: StudyData, *texts: str, sensitivity: bool = False) -> pd.DataFrame:
    """The claims' rows; without the CLS-sink sensitivity rows unless asked for."""
    table = claims.evaluate_claims(data, tuple(one(t) for t in texts))
    return table if sensitivity else table[~table["setting"].str.endswith(claims.SINKS_KEPT_MARK, na=False)]


def model(pe_rpt: tuple) -> dict:
    return {"pe": pe_rpt[0], "rpt": pe_rpt[1]}


# -- intervals, tests, power ---------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 5])
def test_per_condition_t_intervals_cover_at_three_and_five_seeds(n):
    """The interval tables and figures draw (``seed_summary``): >= 93% coverage of normal means
    (a percentile bootstrap of the mean covers 76% at n = 3 and 84% at n = 5)."""
    rng = np.random.default_rng(7)
    covered = [(s.low <= 1.0 <= s.high) for s in map(seedstats.seed_summary, rng.normal(1.0, 0.3, (4000, n)))]
    assert np.mean(covered) >= 0.93
    assert seedstats.INTERVAL == "95% t interval"


@pytest.mark.parametrize("alternative", ["greater", "two-sided"])
def test_the_mde_is_detected_with_80_percent_power(alternative):
    """Simulated paired t tests at the MDE reject at unadjusted alpha about 80% of the time."""
    n, sd = 5, 0.02
    effect = seedstats.mde(sd / math.sqrt(n), n - 1, alternative)
    d = np.random.default_rng(3).normal(effect, sd, (4000, n))
    p = stats.ttest_1samp(d, 0.0, axis=1, alternative=alternative).pvalue
    assert np.mean(p < seedstats.ALPHA) == pytest.approx(0.80, abs=0.025)


def test_holm_by_hand():
    p = np.array([0.01, 0.04, 0.03, np.nan, 0.005])
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.02, 0.03, 0.06, 0.06
    assert seedstats.holm(p)[[4, 0, 2, 1]] == pytest.approx([0.02, 0.03, 0.06, 0.06])
    assert np.isnan(seedstats.holm(p)[3])


# -- claims of no effect ------------------------------------------------------------------------
@pytest.mark.parametrize("mean, sd, said", [
    (-0.20, 0.01, claim_tests.DIFFERS),  # the interval lies wholly outside +-0.02
    (-0.03, 0.005, claim_tests.DIFFERS),  # [-0.036, -0.024]: wholly below -0.02
    (0.000, 0.002, claim_tests.CONSISTENT),
    (0.005, 0.001, claim_tests.SMALL),  # inside the margin though it excludes 0: a small effect, said so
    (0.020, 0.005, claim_tests.INCONCLUSIVE),  # [0.014, 0.026] crosses the margin: excludes 0, yet no "differs"
    (0.010, 0.020, claim_tests.INCONCLUSIVE),  # crosses the margin and includes 0
])
def test_a_null_claim_can_come_out_either_way_at_five_seeds(mean, sd, said):
    text = "label smoothing alone leaves minimum MAD at baseline"
    data = study(paired({"protocol": "label_smoothing"}, {"protocol": "baseline"}, "min_mad", 0.2, diffs(mean, sd)))
    (row,) = evaluate(data, text).to_dict("records")
    assert row["verdict"] == said and row["margin"] == 0.02 and row["n pairs"] == PAIRS
    assert row["CI"] == "paired t, 95%" and row["95% CI of effect"].startswith("[")
    half = stats.t.ppf(0.975, PAIRS - 1) * sd / math.sqrt(PAIRS)
    assert row["95% CI of effect"] == f"[{mean - half:.3f}, {mean + half:.3f}]"


# -- Holm, power marks --------------------------------------------------------------------------
def test_verdicts_read_holm_adjusted_p_one_family_per_paper_and_data_set():
    t = stats.t.ppf(1 - np.array([0.03, 0.04]), PAIRS - 1)  # raw one-sided p 0.03 and 0.04
    gain_cm, gain_aa = (diffs(k * 0.01 / math.sqrt(PAIRS), 0.01) for k in t)
    trials = []
    for dataset in ("cifar10", "cifar100"):
        for seed in range(PAIRS):
            trials += [{"dataset": dataset, "protocol": "baseline", "seed": seed, "test_acc": 0.5},
                       {"dataset": dataset, "protocol": "cutmix", "seed": seed, "test_acc": 0.5 + gain_cm[seed]},
                       {"dataset": dataset, "protocol": "autoaugment", "seed": seed, "test_acc": 0.5 + gain_aa[seed]}]
    table = evaluate(study(trials), "CutMix adds accuracy", "AutoAugment adds accuracy")
    assert table["p (raw)"].to_numpy() == pytest.approx([0.03, 0.03, 0.04, 0.04])
    # Each data set is its own family of two: 0.03 x 2 = 0.06, then max(0.06, 0.04): both fail at 0.05.
    assert table["p (Holm)"].to_numpy() == pytest.approx([0.06] * 4)
    assert set(table["verdict"]) == {"not supported"}


def test_a_row_whose_mde_exceeds_the_papers_effect_is_underpowered():
    text = "modern lowers minimum MAD (0.316 -> 0.008)"  # the paper: 0.008 - 0.316 = -0.308 on CIFAR-100
    rows = []
    for dataset, mean, sd in (("cifar100", -0.05, 0.4), ("cifar10", -0.05, 0.4), ("tinyimagenet", 0.01, 0.05)):
        rows += paired({"protocol": "autoaugment+cutmix+label_smoothing"}, {"protocol": "baseline"}, "min_mad",
                       0.2, diffs(mean, sd), dataset=dataset)
    table = evaluate(study(rows), text).set_index("dataset")
    noisy = table.loc["cifar100"]
    assert noisy["verdict"] == "not supported" and noisy["paper effect (A - B)"] == pytest.approx(-0.308)
    assert noisy[MDE_COLUMN] == pytest.approx(seedstats.mde(0.4 / math.sqrt(PAIRS), PAIRS - 1, "less"))
    assert noisy[MDE_COLUMN] > 0.308 and noisy["power"] == "underpowered"
    # No paper number for this data set: the MDE is shown, nothing is marked.
    assert table.loc["cifar10", "power"] == "" and table.loc["cifar10", MDE_COLUMN] > 0.308
    # Well powered (MDE 0.068): a "not supported" that stands, said as the reversal it is (+0.01).
    tiny = table.loc["tinyimagenet"]
    assert tiny["verdict"] == claim_tests.OPPOSITE and tiny[MDE_COLUMN] < 0.1
    every = claims.evaluate_claims(study(rows))
    assert every.loc[every["verdict"] != "no data", ["p (raw)", "p (Holm)", MDE_COLUMN]].notna().all(axis=None)


# -- the claims added for both papers -----------------------------------------------------------
FRAME = {"dssdc_per_batch": 0.4}  # the trained APE anchors on the paper's estimator (precondition met)


@pytest.mark.parametrize("text, a, b, metric, holds, fails, paper", [
    ("ape + RPT is more fragile to JPEG than ape", RPT, APE, "fs_jpeg", 0.2, -0.05, "0.630 / 0.435"),
    ("ape + RPT is more fragile to blur than ape", RPT, APE, "fs_blur", 0.06, -0.02, "0.243 / 0.184"),
    ("ape + RPT is as fragile to JPEG as none", RPT, NONE, "fs_jpeg", 0.005, 0.2, "0.630 / 0.646"),
])
def test_study_p_rpt_fragility_claims(text, a, b, metric, holds, fails, paper):
    said = {}
    for name, mean in (("holds", holds), ("fails", fails)):
        rows = paired(model(a), model(b), metric, 0.43, diffs(mean, 0.01), common=FRAME, dataset="imagenet100",
                      img_size=224)
        if APE not in (a, b):  # the precondition reads the trained APE's dSSDC
            rows += [{**model(APE), "seed": s, **FRAME, "dataset": "imagenet100", "img_size": 224} for s in range(5)]
        (row,) = evaluate(study(rows), text).to_dict("records")
        said[name] = row["verdict"]
        assert row["paper A / B"] == paper and row["precondition"].endswith(": met")
        assert row["setting"].endswith(claims.HEADLINE_MARK)
    null = one(text).alternative == "two-sided"
    assert said == ({"holds": claim_tests.CONSISTENT, "fails": claim_tests.DIFFERS} if null else
                    {"holds": "supported", "fails": claim_tests.OPPOSITE})
    assert one(text).margin == (claims.RPT_AS_NONE_MARGIN if null else 0.02)


@pytest.mark.parametrize("text, metric, paper, effect", [
    ("scaling the APE to 0.4 raises FS JPEG (FS at 0.4 - FS at 1.0 > 0)", "fs_jpeg_pe_scale_rise",
     "FS JPEG 0.627-0.652 at 0.4 / 0.434 at 1.0", 0.193),  # the paper's alpha <= 0.4 is one range
    # Measured per image under PE scaling: the paper's per-batch 0.473 -> 0 is on another scale.
    ("scaling the APE to 0.4 collapses dSSDC (dSSDC at 1.0 - at 0.4 > 0)", "dssdc_pe_scale_drop", "—", math.nan),
])
def test_study_p_pe_scaling_claims_pair_within_each_trial(text, metric, paper, effect):
    for mean, said in ((0.2, "supported"), (-0.01, claim_tests.OPPOSITE)):
        rows = [{"seed": s, metric: v, **FRAME} for s, v in enumerate(diffs(mean, 0.02))]
        (row,) = evaluate(study(rows, dataset="imagenet100", img_size=224), text).to_dict("records")
        assert row["verdict"] == said and row["effect (A - B)"] == pytest.approx(mean)
        assert "paired within each trial, then across seeds (5 trials)" in row["test"]
        assert row["paper A / B"] == paper and row["paper effect (A - B)"] == pytest.approx(effect, nan_ok=True)


def test_study_l_autoaugment_and_cutmix_add_comparable_accuracy():
    text = "AutoAugment and CutMix add comparable accuracy (~6-7 points each)"
    for mean, sd, said in ((0.002, 0.003, claim_tests.CONSISTENT), (0.05, 0.005, claim_tests.DIFFERS)):
        rows = paired({"protocol": "autoaugment"}, {"protocol": "cutmix"}, "test_acc", 0.56, diffs(mean, sd))
        rows += [{"protocol": "baseline", "seed": s, "test_acc": 0.5} for s in range(PAIRS)]
        (row,) = evaluate(study(rows), text).to_dict("records")
        assert row["verdict"] == said and row["paper A / B"] == "gain 0.06-0.07 / gain 0.06-0.07"
        assert row["paper effect (A - B)"] == 0.0


def test_fs_claims_away_from_224_px_test_the_mean_over_the_severity_grid():
    text = "rope2d is less fragile to JPEG than ape"
    rows = []
    for seed, step in enumerate(diffs(-0.1, 0.01)):
        rows += [{"pe": "rope2d", "seed": seed, "fs_jpeg": 0.9 + step, "fs_jpeg_grid": 0.4 + 0.002 * seed},
                 {"pe": "ape", "seed": seed, "fs_jpeg": 0.9, "fs_jpeg_grid": 0.3 + 0.01 * seed}]
    small = evaluate(study(rows), text)  # rope2d: less fragile at the headline quality only
    assert small["setting"].tolist() == ["cifar100, " + claims.HEADLINE_MARK, "cifar100, " + claims.GRID_MARK]
    assert small["verdict"].tolist() == ["supported", claim_tests.OPPOSITE]
    assert small["metric"].tolist() == ["FS JPEG q5", "FS JPEG, mean over the quality grid"]
    assert small["paper A / B"].tolist() == ["—", "—"]  # 32 px: the paper's numbers are at 224 px
    big = evaluate(study([{**r, "dataset": "imagenet100", "img_size": 224} for r in rows]), text)
    assert len(big) == 1 and big["paper A / B"].item() == "0.299 / 0.435"


# -- preconditions ------------------------------------------------------------------------------
def test_uniform_attention_mad_matches_the_metric():
    import torch
    from test_metrics import mean_attention_distance

    for grid, expected in ((8, 0.418), (14, 0.396)):
        tokens = 1 + grid * grid
        uniform = torch.full((1, 1, tokens, tokens), 1.0 / tokens)
        assert uniform_mad(grid) == pytest.approx(float(mean_attention_distance(uniform, grid)[0]))
        assert uniform_mad(grid) == pytest.approx(expected, abs=5e-4)


def test_an_unmet_precondition_marks_the_row_and_keeps_its_tests_verdict():
    # Study L: a baseline whose minimum MAD is still near uniform (0.418 on 8 x 8): the row says what its
    # test says and marks what the precondition measured against what it needs.
    text = "CutMix alone lowers minimum MAD"
    for base, aid in ((0.40, "precondition not met: local heads: baseline's minimum MAD 0.406, needs <= 0.368"),
                      (0.30, "")):
        rows = paired({"protocol": "cutmix"}, {"protocol": "baseline"}, "min_mad", base, diffs(-0.2, 0.01))
        (row,) = evaluate(study(rows), text).to_dict("records")
        assert row["verdict"] == "supported" and row["p (Holm)"] < 0.05
        assert row["reading aid"].startswith(aid) and "uniform attention 0.418 on 8 x 8" in row["precondition"]
    # The same for a row whose test runs against the claim: the mark never takes the verdict's place.
    rows = paired({"protocol": "cutmix"}, {"protocol": "baseline"}, "min_mad", 0.40, diffs(0.005, 0.002))
    (row,) = evaluate(study(rows), text).to_dict("records")
    assert row["verdict"] == claim_tests.OPPOSITE and row["reading aid"].startswith(
        "precondition not met: local heads: baseline's minimum MAD 0.406, needs <= 0.368, 0.038 too high")


def test_an_unknown_precondition_is_refused_naming_it_and_the_valid_ones():
    # (was: any key but "APE frame" read as "local heads", silently)
    assert {claim.needs for claim in claims.CLAIMS} - {None} == set(claim_tests.Needs)
    rows = paired({"protocol": "cutmix"}, {"protocol": "baseline"}, "min_mad", 0.30, diffs(-0.2, 0.01))
    with pytest.raises(ValueError, match=r"unknown precondition 'local head'; valid preconditions: "
                                         r"\['APE frame', 'local heads'\]"):
        claim_tests.precondition("local head", study(rows), "cifar100")


def test_no_precondition_is_computed_from_the_claims_own_outcome():
    # The dSSDC claims' result is dSSDC: they carry no precondition (an APE frame gate read on dSSDC
    # would turn a failure to replicate into "untestable"). The APE frame of the fragility claims is
    # read on the paper's estimator, not on their FS.
    for claim in claims.CLAIMS:
        if claim.metric.startswith("dssdc"):
            assert claim.needs is None, claim.text
    rows = paired(model(RPT), model(APE), "dssdc", 0.03, diffs(-0.02, 0.001), dataset="imagenet100", img_size=224)
    table = evaluate(study(rows), "RPT collapses APE's SSDC recovery under RPI (dSSDC)")
    assert table["verdict"].tolist() == ["supported"] and table["reading aid"].tolist() == [""]
    frame = [{**model(APE), "seed": s, "dssdc_per_batch": 0.05, "fs_jpeg": 0.4} for s in range(PAIRS)]
    frame += [{**model(RPT), "seed": s, "fs_jpeg": 0.6 + 0.01 * s} for s in range(PAIRS)]
    (row,) = evaluate(study(frame, dataset="imagenet100", img_size=224),
                      "ape + RPT is more fragile to JPEG than ape").to_dict("records")
    assert row["verdict"] == "supported"
    assert row["reading aid"] == ("precondition not met: APE frame: trained APE's dSSDC under RPI (paper's "
                                  "estimator, per 1,000 images) 0.050, needs >= 0.10, 0.050 short")


# -- seeds that can decide ------------------------------------------------------------------------
def _planned(*argv) -> list:
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    return options.build_trials(parser.parse_args([*argv, "--dry-run"]))


# Per metric, each condition's rank k: a trial's value is base + k * unit * (3 + z_seed), z standardised
# over seeds, so any two conditions' per-seed differences have a mean of exactly 3 times their sd, in the
# direction of their ranks; CutMix conditions rank far below the others (the separation holds).
RANKS = {
    "min_mad": (0.05, 0.01, lambda c: {"cutmix": 0, "cutmix+label_smoothing": 0.1, "autoaugment+cutmix": 0.2,
                                       claims.MODERN: 0.3, "baseline": 2, "autoaugment": 3, "label_smoothing": 4,
                                       "autoaugment+label_smoothing": 5}[c.protocol.name]),
    # Above every minimum MAD, so the early layers' head never is the network's minimum.
    "mad_early": (1.0, 0.01, lambda c: {"cutmix": 0, claims.MODERN: 0}.get(c.protocol.name, 1)),
    "entropy_early": (0.5, 0.01, lambda c: {"cutmix": 0, claims.MODERN: 0}.get(c.protocol.name, 1)),
    "test_acc": (0.5, 0.01, lambda c: {"baseline": 0, "cutmix": 1, "autoaugment": 2}.get(c.protocol.name, 0)
                 + {"rope2d": 0.3, "sincos2d": 0.2, "ape": 0.1}.get(c.pe, 0)),
    "dssdc": (0.1, 0.05, lambda c: {NONE: 0, RPT: 1, APE: 2}.get((c.pe, c.rpt), 0.5)),
    "dssdc_per_batch": (0.1, 0.05, lambda c: {NONE: 0, RPT: 1, APE: 2}.get((c.pe, c.rpt), 0.5)),
    "fs_jpeg": (0.3, 0.01, lambda c: {("rope2d", False): 0, APE: 1, ("sincos2d", False): 2, NONE: 3, RPT: 4}
                .get((c.pe, c.rpt), 5)),
    "fs_blur": (0.1, 0.01, lambda c: {("rope2d", False): 0, APE: 1, RPT: 2}.get((c.pe, c.rpt), 3)),
    "fs_jpeg_pe_scale_rise": (0.0, 0.01, lambda c: 1),
    "dssdc_pe_scale_drop": (0.0, 0.05, lambda c: 1),
    "pe_scale_link": (0.0, 0.0, lambda c: 0),  # its levels follow the two above (``_measurements``)
}


@pytest.mark.parametrize("name", ["study_l", "study_p"])
def test_at_the_default_seeds_every_claim_can_reach_holm_p_below_alpha(name):
    configs = _planned(name)
    seeds = sorted({c.seed for c in configs})
    assert len(seeds) >= 5
    z = (np.array(seeds) - np.mean(seeds)) / np.std(seeds, ddof=1)
    rows = []
    for c in configs:
        values = {m: base + rank(c) * unit * (3 + z[c.seed]) for m, (base, unit, rank) in RANKS.items()}
        rows.append({"dataset": c.dataset, "img_size": c.model.img_size, "pe": c.pe, "rpt": c.rpt,
                     "protocol": c.protocol.name, "seed": c.seed, **values})
    table = claims.evaluate_claims(study(rows))
    tested = table[table["verdict"] != "no data"]
    paper = "Study L" if name == "study_l" else "Study P"
    assert set(tested["claim"]) >= {c.text for c in claims.CLAIMS if c.paper == paper}
    assert (tested["p (Holm)"] < seedstats.ALPHA).all(), tested[["claim", "dataset", "p (Holm)"]]
    assert not tested["verdict"].isin(["not enough seeds"]).any() and (tested["reading aid"] == "").all()
    separation = tested[tested["claim"].str.startswith("every CutMix run")]
    # One row per data set, and its CLS-sink sensitivity repeat.
    assert len(separation) == (6 if name == "study_l" else 0) and (separation["verdict"] == "supported").all()


def test_seeds_flag_names_the_claims_that_cannot_decide(capsys):
    assert launcher.main(["study_p", "--dry-run", "--seeds", "4"]) == 0
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("--seeds")]
    directional = [c.text for c in claims.CLAIMS if c.paper == "Study P" and c.alternative != "two-sided"]
    assert line.startswith(f"--seeds 4: {len(directional)} claim(s) cannot reach a verdict")
    assert all(text in line for text in directional) and "as fragile to JPEG as none" not in line
    for argv in (["study_p", "--dry-run"], ["study_p", "--dry-run", "--seeds", "5"]):
        assert launcher.main(argv) == 0
        assert "--seeds" not in capsys.readouterr().err


def test_no_grid_row_where_only_the_headline_severity_was_measured():
    rows = [{"pe": pe, "seed": seed, "fs_jpeg": 0.5 + 0.01 * seed - 0.1 * (pe == "rope2d")}
            for seed in range(PAIRS) for pe in ("rope2d", "ape")]
    table = evaluate(study(rows), "rope2d is less fragile to JPEG than ape")
    assert table["setting"].tolist() == ["cifar100, " + claims.HEADLINE_MARK]


def test_the_seeds_notice_reads_each_data_set_whose_plan_differs():
    four = _planned("study_p", "--datasets", "cifar10,cifar100", "--seeds", "4")
    alone = options.seeds_notice(4, [c for c in four if c.dataset == "cifar10"])
    assert alone and options.seeds_notice(4, four) == alone  # the same plan twice: the same claims
    five = _planned("study_p", "--datasets", "cifar100", "--seeds", "5")
    assert options.seeds_notice(4, [c for c in four if c.dataset == "cifar10"] + five) is None  # cifar100 decides
