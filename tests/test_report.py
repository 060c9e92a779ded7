"""The report from synthetic Parquet tables with planted effects (CPU, ~15 s).

The synthetic study joins Study L's 8-protocol ablation (ape, fixed order) and Study P's five models
(baseline protocol) on one data set, written with the project's own Parquet writer. Planted:
CutMix gives early layers a very local head (low minimum MAD) and adds accuracy; AutoAugment adds
accuracy only; label smoothing does nothing; ape/sincos2d recover SSDC under RPI, none and RPT do
not; rope2d is the least fragile. The tests check that the report finds what was planted and
nothing that was not, with honest verdicts at small seed counts.
"""

from __future__ import annotations

import base64
import io
import itertools
import math
import re
import zlib
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy import stats

from analysis.reporting.figures import FIGURES
from analysis.reporting.report import build_report, main
from analysis.statistics import claim_tests, claims, paper_numbers, seedstats
from analysis.statistics.study_data import StudyData
from records import vocab
from records.tables import write_epochs, write_measurements, write_trial

LAYERS, HEADS = 6, 4
PROTOCOLS = ["+".join(c) or "baseline" for r in range(4) for c in itertools.combinations(vocab.SWITCHES, r)]
P_MODELS = [("none", False), ("ape", False), ("sincos2d", False), ("rope2d", False), ("ape", True)]
N_IMAGES = 2000
FS_JPEG = {"none": 0.65, "ape": 0.44, "sincos2d": 0.44, "rope2d": 0.30, "ape+RPT": 0.63}


def _conditions(protocols, models):
    conds = {("ape", False, p) for p in protocols} | {(pe, rpt, "baseline") for pe, rpt in models}
    return sorted(conds, key=str)


def _measure(pe: str, rpt: bool, protocol: str, rng, progress: float, full: bool) -> list[dict]:
    """Measurement rows of one checkpoint; progress in [0, 1] moves values from untrained to trained."""
    sw = vocab.protocol_switches(protocol)
    rows = []
    for layer, head in itertools.product(range(LAYERS), range(HEADS)):
        mad = 0.30 + 0.03 * layer + 0.04 * rng.random()
        if sw["cutmix"] and layer < 2:  # the planted CutMix effect: local heads in early layers
            mad = 0.45 * (1 - progress) + progress * (0.005 + 0.01 * rng.random())
        ent = min(1.0, 0.25 + 1.6 * mad + 0.02 * rng.random())
        sink = 0.9 if (layer, head) == (LAYERS - 1, 0) else 0.05  # one CLS-sink head per trial, in the last layer
        rows += [{"intervention": "clean", "level": None, "layer": layer, "head_index": head, "metric": "mad",
                  "value": mad},
                 {"intervention": "clean", "level": None, "layer": layer, "head_index": head, "metric": "entropy",
                  "value": ent},
                 {"intervention": "clean", "level": None, "layer": layer, "head_index": head, "metric": "cls_mass",
                  "value": sink}]
    anchored = pe in ("ape", "sincos2d") and not rpt
    rpi = []
    for layer in range(LAYERS):
        clean = 0.6 - 0.03 * layer + 0.02 * rng.standard_normal()
        if anchored:
            r = progress * (0.5 if layer in (1, 2) else 0.15) * (layer > 0)
        elif pe == "rope2d" and not rpt:
            r = progress * 0.06 * layer
        else:
            r = 0.0
        rpi.append(r + 0.01 * rng.standard_normal())
        rows += [{"intervention": "clean", "level": None, "layer": layer, "head_index": None, "metric": "ssdc",
                  "value": clean},
                 {"intervention": "rpi", "level": None, "layer": layer, "head_index": None, "metric": "ssdc",
                  "value": rpi[-1]}]
    rows.append({"intervention": "rpi", "level": None, "layer": None, "head_index": None, "metric": "dssdc",
                 "value": rpi[1] - rpi[0]})
    # The paper's estimator, on its own (smaller) scale: half the per-image recovery.
    rows += [{"intervention": "rpi", "level": None, "layer": layer, "head_index": None, "metric": "ssdc_per_batch",
              "value": 0.5 * r} for layer, r in enumerate(rpi)]
    rows.append({"intervention": "rpi", "level": None, "layer": None, "head_index": None, "metric": "dssdc_per_batch",
                 "value": 0.5 * (rpi[1] - rpi[0])})
    if not full:
        return rows
    base = FS_JPEG[pe + ("+RPT" if rpt else "")]
    for q in (5.0, 10.0, 30.0, 75.0):
        rows.append({"intervention": "jpeg", "level": q, "layer": None, "head_index": None, "metric": "fs",
                     "value": base * (1 - q / 100) ** 2 + 0.01 * rng.standard_normal()})
    for sigma in (0.5, 1.0, 2.5):
        rows.append({"intervention": "blur", "level": sigma, "layer": None, "head_index": None, "metric": "fs",
                     "value": 0.5 * base * sigma / 2.5 + 0.01 * rng.standard_normal()})
    scaling = "rope_scale" if pe.startswith("rope") else "pe_scale"  # as analysis.measuring.evaluate names them
    for alpha in np.round(np.arange(0, 1.01, 0.1), 1):
        scale = alpha if pe != "none" else 1.0
        for metric, v in (("dssdc", 0.47 * scale**3 * anchored), ("fs_jpeg", 0.65 - (0.65 - base) * scale),
                          ("fs_blur", 0.5 * (0.65 - (0.65 - base) * scale))):
            rows.append({"intervention": scaling, "level": float(alpha), "layer": None, "head_index": None,
                         "metric": metric, "value": v + 0.01 * rng.standard_normal()})
    rows.append({"intervention": "clean", "level": None, "layer": None, "head_index": None, "metric": "acc",
                 "value": 0.5})
    return [{**r, "n_images": N_IMAGES} for r in rows]


def write_study(results: str, study: str, *, seeds: int = 5, protocols=PROTOCOLS, models=P_MODELS,
                checkpoints=(0, 3, 10), tables=("trials", "epochs", "measurements"), dataset="cifar100",
                img_size=32) -> None:
    """Write a synthetic study with the real writer (records.tables); ``tables`` picks which to write."""
    for (pe, rpt, protocol), seed in itertools.product(_conditions(protocols, models), range(seeds)):
        rng = np.random.default_rng(zlib.crc32(f"{pe}{rpt}{protocol}{seed}".encode()))
        sw = vocab.protocol_switches(protocol)
        trial_id = f"{dataset}-{pe}{'-rpt' if rpt else ''}-{protocol}-s{seed}"
        acc = 0.50 + 0.06 * sw["cutmix"] + 0.06 * sw["autoaugment"] + 0.01 * rng.standard_normal()
        config = {"dataset": dataset, "pe": pe, "rpt": rpt, **sw, "protocol": protocol, "seed": seed,
                  "img_size": img_size, "patch_size": img_size // 8, "depth": LAYERS, "heads": HEADS, "lr": 1e-3,
                  "epochs": checkpoints[-1], "code_version": "abc1234"}
        if "trials" in tables:
            write_trial(results, study, config, {"trial_id": trial_id, "study": study, "status": "finished",
                                                 "test_acc": acc, "epochs_completed": checkpoints[-1]})
        if "epochs" in tables:
            write_epochs(results, study, trial_id, [
                {"epoch": e, "train_loss": 2.0 / e, "eval_acc": acc * (1 - np.exp(-e / 3)), "lr": 1e-3}
                for e in range(1, checkpoints[-1] + 1)])
        if "measurements" in tables:
            for epoch in checkpoints:
                progress = epoch / checkpoints[-1]
                write_measurements(results, study, trial_id, epoch,
                                   _measure(pe, rpt, protocol, rng, progress, full=epoch == checkpoints[-1]))
    if "trials" in tables:  # one failed trial: never counted
        write_trial(results, study, {"dataset": "cifar100", "pe": "ape", "rpt": False, "protocol": "baseline",
                                     "seed": 99}, {"trial_id": "failed-one", "study": study, "status": "failed"})


def primary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: without its severity-grid, per-batch dSSDC and CLS-sink sensitivity repeats."""
    repeat = table["setting"].str.endswith((claims.GRID_MARK, claims.PER_BATCH_MARK, claims.SINKS_KEPT_MARK), na=False)
    return table[~repeat]


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs)["src"])


def write_collapsed_trial(results: str, study: str) -> str:
    """A sixth baseline ape seed that stayed at chance, flagged did_not_learn, with a degenerate minimum
    MAD far below every CutMix run: counted in a claim, it would break the CutMix separation."""
    trial_id = "cifar100-ape-baseline-s5-collapsed"
    config = {"dataset": "cifar100", "pe": "ape", "rpt": False, **vocab.protocol_switches("baseline"),
              "protocol": "baseline", "seed": 5, "img_size": 32, "patch_size": 4, "depth": LAYERS, "heads": HEADS,
              "lr": 1e-3, "epochs": 10, "code_version": "abc1234"}
    write_trial(results, study, config, {"trial_id": trial_id, "study": study, "status": "finished",
                                         "test_acc": 0.011, "eval_acc": 0.011, "did_not_learn": True,
                                         "epochs_completed": 10})
    rows = _measure("ape", False, "baseline", np.random.default_rng(0), 1.0, full=True)
    write_measurements(results, study, trial_id, 10,
                       [{**r, "value": 0.001} if r["metric"] == "mad" else r for r in rows])
    return trial_id


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    results = str(tmp_path_factory.mktemp("results"))
    write_study(results, "joint")
    write_collapsed_trial(results, "joint")
    index = build_report(results, "joint")
    return results, index


def test_report_has_every_figure_as_png(full_report):
    results, index = full_report
    assert index.exists() and index.name == "index.html"
    page = index.read_text()
    for _, title, _ in FIGURES:
        assert title in page, title
    assert '<p class="omitted">' not in page.split("id='config'")[0], "a figure or table with data was omitted"
    assert "could not be drawn" not in page
    assert "Protocol ablation table (cifar100)" in page and "Conditions table" in page
    assert "code version: abc1234" in page and "1 failed trial" in page
    assert "did not learn: 1 trial(s)" in page and "cifar100-ape-baseline-s5-collapsed" in page
    assert "test accuracy: binomial SE" in page and "FS JPEG q5: delta-method SE" in page
    # The first screen: caption, tally and legend above the claims table, the method below it, no "None".
    claims_section = page.split("<h2 id='claims'>", 1)[1].split("<h2 ", 1)[0]
    assert claims_section.index("class='legend'") < claims_section.index("<table class='claims'>") < \
        claims_section.index("id='how-to-read'")
    assert "None" not in claims_section and "STUDIES.md" not in page and "arXiv 2606.00124" in page
    parser = _Images()
    parser.feed(page)
    assert len(parser.sources) >= len(FIGURES)
    for src in parser.sources:
        assert src.startswith("data:image/png;base64,")
        image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert image.format == "PNG" and min(image.size) > 200
    assert len(list(index.parent.glob("*.png"))) == len(parser.sources)


def test_claims_find_planted_effects_and_not_the_null(full_report):
    results, index = full_report
    every = pd.read_csv(index.parent / "claims.csv")
    grid = every["setting"].str.endswith(claims.GRID_MARK)
    table = primary(every).set_index("claim")  # at 32 px an FS claim has a headline row and a severity-grid row
    verdict = table["verdict"]
    assert verdict["CutMix alone lowers minimum MAD"] == "supported"
    assert verdict["every CutMix run has lower minimum MAD than every run without"] == "supported"
    assert verdict["modern lowers minimum MAD (0.316 -> 0.008)"] == "supported"
    assert verdict["label smoothing alone leaves minimum MAD at baseline"] == claim_tests.CONSISTENT
    assert verdict["CutMix adds accuracy"] == "supported"
    assert verdict["APE recovers SSDC under RPI more than none (dSSDC)"] == "supported"
    assert verdict["RPT collapses APE's SSDC recovery under RPI (dSSDC)"] == "supported"
    assert verdict["rope2d is less fragile to JPEG than ape"] == "supported"
    assert verdict["none is more fragile to JPEG than ape"] == "supported"
    assert verdict["ape + RPT is more fragile to JPEG than ape"] == "supported"
    # Planted 0.63 against 0.65: a small effect inside the 0.05 margin, said as such.
    assert verdict["ape + RPT is as fragile to JPEG as none"] == claim_tests.SMALL
    assert verdict["scaling the APE to 0.4 raises FS JPEG (FS at 0.4 - FS at 1.0 > 0)"] == "supported"
    assert verdict["scaling the APE to 0.4 collapses dSSDC (dSSDC at 1.0 - at 0.4 > 0)"] == "supported"
    assert set(table.index) >= {c.text for c in claims.CLAIMS if c.paper == "Study L"}  # the early-layer claims too
    for text in ("CutMix alone makes early layers more local (mean MAD of layers 0-1)",
                 "modern concentrates early-layer attention (mean entropy of layers 0-1)"):
        assert verdict[text] == "supported"
    # dSSDC on both scales, the paper's 0.473 only beside its own estimator.
    dssdc = every[every["claim"] == "APE recovers SSDC under RPI more than none (dSSDC)"].set_index("metric")
    assert dssdc["verdict"].tolist() == ["supported", "supported"]
    assert dssdc["paper A / B"].isna().all()  # 32 px: no paper number on either scale
    # Every minimum-MAD claim is repeated with the CLS-sink heads kept, read at its own row's Holm step.
    sinks = every[every["setting"].str.endswith(claims.SINKS_KEPT_MARK)]
    assert set(sinks["claim"]) == {c.text for c in claims.CLAIMS if c.metric == "min_mad"}
    cutmix = sinks.set_index("claim").loc["CutMix alone lowers minimum MAD"]
    assert cutmix["verdict"] == "supported" and cutmix["CLS sinks (A; B)"] == "5 sink head(s); 5 sink head(s)"
    assert cutmix[claim_tests.STEP_ALPHA] == table.loc["CutMix alone lowers minimum MAD", claim_tests.STEP_ALPHA]
    # Away from 224 px, each FS claim is also tested on the mean over the severity grid; the headline row says
    # its severity is the paper's.
    assert set(every.loc[grid, "claim"]) == {c.text for c in claims.CLAIMS if c.metric in claims.FS_GRID}
    assert (every.loc[grid, "verdict"] != "no data").all()
    assert table.loc["rope2d is less fragile to JPEG than ape", "setting"].endswith(claims.HEADLINE_MARK)
    row = table.loc["CutMix alone lowers minimum MAD"]
    assert (row["n A"], row["n B"], row["n pairs"]) == (5, 5, 5) and row["effect (A - B)"] < -0.2
    # Paired by seed: the paired t test decides; 5 pairs all one way give the exact sign flip's smallest p, 1 / 2^5.
    assert row["p (sign-flip)"] == pytest.approx(1 / 32) and "paired t test" in row["test"]
    assert "paired by seed (5 pairs)" in row["test"] and row["p (raw)"] < 1e-4
    assert row["p (raw)"] <= row["p (Holm)"] <= 1
    assert row["CI"] == "paired t, one-sided 95%" and row["margin"] == 0.02
    assert row["95% CI of effect"].startswith("(-∞, ")
    # Numbers stay numbers in the CSV: an absent value is empty, not a dash.
    for column in ("effect (A - B)", "p (raw)", "p (Holm)", "p (sign-flip)", claim_tests.MDE, claim_tests.STEP_ALPHA,
                   "paper effect (A - B)", "mean B", "margin", "p (Holm, all trials)"):
        assert pd.api.types.is_float_dtype(every[column]), column
    assert every[claim_tests.MDE].notna().all() and every["p (Holm)"].notna().all()
    # The collapsed baseline seed is left out of every claim it would be in, and counted.
    assert (row["did not learn A"], row["did not learn B"]) == (0, 1)
    assert table.loc["rope2d is less fragile to JPEG than ape", "did not learn B"] == 1
    assert table.loc["AutoAugment adds accuracy", "n B"] == 5
    # With it kept, its degenerate minimum MAD (0.001) breaks the CutMix separation: the row is flagged.
    separation = table.loc["every CutMix run has lower minimum MAD than every run without"]
    assert "Welch t test" in separation["test"] and "unpaired (seeds do not pair)" in separation["test"]
    assert (separation["verdict"], separation["verdict (all trials)"]) == ("supported", "not supported")
    assert separation["survivors vs all"] == "DISAGREE" and row["survivors vs all"] == "agree"
    assert "<td class='v-differs'>DISAGREE</td>" in index.read_text()
    assert "supported" in index.read_text()
    # A directional claim about the planted null (label smoothing) is not supported.
    data = StudyData.load(results, "joint")
    null = claims.Claim("test", "label smoothing lowers minimum MAD", "min_mad", {"protocol": "label_smoothing"},
                         {"protocol": "baseline"})
    said = primary(claims.evaluate_claims(data, (null,)))["verdict"].tolist()
    assert said in (["not supported"], [claim_tests.OPPOSITE])


def test_three_seeds_are_not_enough_and_cli_writes_report(tmp_path):
    """3 paired seeds: the exact sign-flip check cannot reach 0.05 (1/8), so no directional verdict. At 224 px
    the paper's numbers are drawn."""
    results = str(tmp_path / "results")
    write_study(results, "small", seeds=3, protocols=["baseline", "cutmix"], models=[("ape", True)],
                checkpoints=(4,), dataset="imagenet100", img_size=224)
    out = tmp_path / "out"
    assert main(["small", "--results", results, "--out", str(out)]) == 0
    table = primary(pd.read_csv(out / "claims.csv")).set_index("claim")
    assert table.loc["CutMix alone lowers minimum MAD", "verdict"] == "not enough seeds"
    assert table.loc["RPT collapses APE's SSDC recovery under RPI (dSSDC)", "verdict"] == "not enough seeds"
    assert table.loc["APE recovers SSDC under RPI more than none (dSSDC)", "verdict"] == "no data"
    # One scale per comparison: the paper's 0.473 beside its own estimator only, never the per-image dSSDC.
    rpt = pd.read_csv(out / "claims.csv").set_index("metric")
    rpt = rpt[rpt["claim"] == "RPT collapses APE's SSDC recovery under RPI (dSSDC)"]["paper A / B"]
    assert rpt.fillna("none").to_dict() == {"dSSDC under RPI": "none",
                                            "dSSDC under RPI, the paper's estimator": "— / 0.473"}
    page = (out / "index.html").read_text()
    assert "could not be drawn" not in page and "<h3>PE scaling" in page
    assert "Emergence over training (measured checkpoints): omitted" in page  # a single checkpoint per trial


@pytest.mark.parametrize("tables", [("trials",), ("measurements",), ()])
def test_missing_tables_give_notes_not_errors(tmp_path, tables):
    results = str(tmp_path)
    write_study(results, "partial", seeds=2, protocols=["baseline", "cutmix"], models=[("none", False)],
                checkpoints=(2,), tables=tables)
    (tmp_path / "partial").mkdir(exist_ok=True)
    page = build_report(results, "partial").read_text()
    assert "could not be drawn" not in page
    for _, title, _ in FIGURES:
        assert f"{title}: omitted" in page or f"<h3>{title}" in page
    assert "SSDC vs depth (clean): omitted" in page  # no trial/measurement pair to join in any case
    notes = {n.split(": omitted (")[0]: n for n in re.findall(r'<p class="omitted">([^<]*)</p>', page)}
    omitted_figures = [notes[title] for _, title, _ in FIGURES if title in notes]
    assert omitted_figures and all("`vitsweep " in n for n in omitted_figures)  # each names what fills it
    assert ("<h2 id='notes'>" in page) == bool(StudyData.load(results, "partial").notes)  # no empty Notes section
    assert "is missing or empty" in page
    if "trials" in tables:  # test accuracy lives in the trials table: that figure needs nothing else
        assert page.count("<img") == 2
        assert "<h3>Minimum MAD and accuracy per protocol" in page and "<h3>Clean accuracy and fragility" in page
    else:
        assert "<img" not in page


def test_rope_scale_rows_stay_off_the_pe_scaling_axes_and_claims():
    """RoPE angle scaling is position interpolation: its own figure, never Study P's PE scaling."""
    from analysis.reporting import figures, plotting

    trials = pd.DataFrame({"trial_id": ["r0", "r1"], "dataset": "cifar10", "pe": "rope2d", "rpt": False,
                           "protocol": "baseline", "seed": [0, 1], "status": "finished", "test_acc": 0.5})
    rows = [{"trial_id": t, **r} for t in ("r0", "r1") for r in _measure("rope2d", False, "baseline",
                                                                         np.random.default_rng(0), 1.0, True)]
    data = StudyData.from_frames("s", trials, pd.DataFrame(), pd.DataFrame(rows).assign(checkpoint_epoch=4))
    assert set(data.measurements["intervention"]) >= {"rope_scale"} and data.select("pe_scale", "dssdc").empty
    with pytest.raises(plotting.NoData, match="no pe_scale rows"):
        figures.pe_scaling(data)
    (plot,) = figures.rope_scaling(data)
    assert "position interpolation" in plot.title and "rope2d" in plot.figure.axes[0].get_legend_handles_labels()[1][0]
    # alpha 0 has no paper reference (the paper's table covers 0.1-1.0)
    assert min(paper_numbers.PAPER_P_APE_SCALING) == 0.1


def test_binomial_standard_errors():
    assert seedstats.binomial_se(0.5, 100) == pytest.approx(0.05)
    assert np.isnan(seedstats.binomial_se(0.5, np.nan))
    # FS 0.435 at clean accuracy 0.64 over 1,000 images: the surviving share 0.565 of 640 clean-correct images
    assert seedstats.fragility_se_without_counts(0.435, 0.64, 1000) == pytest.approx(math.sqrt(0.565 * 0.435 / 640))
    # Without images right only under the shift, the delta method is that same binomial SE.
    assert seedstats.fragility_se(362, 278, 0, 1000) == pytest.approx(math.sqrt((362 / 640) * (278 / 640) / 640))


def test_fragility_se_from_paired_counts_by_hand_and_by_bootstrap():
    # 1,000 images near chance: 40 right both ways, 60 right clean only, 50 right shifted only.
    a, b, c, n = 40, 60, 50, 1000
    x, y, r = (a + c) / n, (a + b) / n, (a + c) / (a + b)  # acc_shift 0.09, acc_clean 0.10, FS = 1 - r = 0.1
    by_hand = math.sqrt((x * (1 - x) - 2 * r * (a / n - x * y) + r**2 * y * (1 - y)) / (n * y**2))
    se = float(seedstats.fragility_se(a, b, c, n))
    assert se == pytest.approx(by_hand)
    # The old approximation ignores the 50 images right only under the shift: far too small here.
    assert float(seedstats.fragility_se_without_counts(1 - r, y, n)) < 0.5 * se
    # Bootstrap over images: resample the n (clean right, shift right) pairs, recompute FS.
    rng = np.random.default_rng(0)
    cells = rng.multinomial(n, np.array([a, b, c, n - a - b - c]) / n, size=20_000)
    fs = 1 - (cells[:, 0] + cells[:, 2]) / (cells[:, 0] + cells[:, 1])
    assert se == pytest.approx(fs.std(), rel=0.05)
    assert np.isnan(seedstats.fragility_se(0, 0, 5, 100))  # nothing right clean: FS undefined


def test_paired_comparison_uses_each_seed_once_and_states_its_interval():
    from analysis.statistics import seedstats

    a, b = np.array([0.51, 0.62, 0.55, 0.58]), np.array([0.50, 0.60, 0.52, 0.57])  # seeds 0-3, shared offsets
    c = seedstats.compare(a, [0, 1, 2, 3], b, [3, 2, 1, 0][::-1], "greater")
    d = a - b
    assert c.paired and c.n_pairs == 4 and c.effect == pytest.approx(d.mean())
    two = seedstats.compare(a, [0, 1, 2, 3], b, [0, 1, 2, 3], "two-sided")
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert (two.low, two.high) == pytest.approx((d.mean() - half, d.mean() + half)) and two.interval == "paired t, 95%"
    # The paired t test decides, its p and interval from one t statistic; the exact sign flip stands beside it.
    assert c.p == pytest.approx(stats.ttest_rel(a, b, alternative="greater").pvalue)
    assert c.sign_flip_p == pytest.approx(1 / 16) and c.min_p == pytest.approx(1 / 16)  # 4 pairs: never below 0.05
    one_sided = seedstats.compare(a, [0, 1, 2, 3], b, [0, 1, 2, 3], "greater")
    assert one_sided.low == pytest.approx(d.mean() - stats.t.ppf(0.95, 3) * d.std(ddof=1) / 2)
    assert one_sided.high == math.inf and one_sided.interval == "paired t, one-sided 95%"
    # The unpaired test on the same numbers throws the pairing away: the seed offsets swamp the effect.
    assert stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue > 0.3
    # Exact sign flip against scipy's permutation test on the differences (all 2^n sign patterns).
    d5 = np.array([0.3, -0.1, 0.2, 0.25, 0.05])
    ref = stats.permutation_test((d5,), np.mean, permutation_type="samples", alternative="greater").pvalue
    assert seedstats.sign_flip_p(d5, "greater") == pytest.approx(ref)
    # A group with a seed twice (two pooled conditions) does not pair: Welch's t test, as scipy's.
    unpaired = seedstats.compare(a, [0, 0, 1, 1], b, [0, 1, 2, 3], "greater")
    assert not unpaired.paired and "Welch" in unpaired.test and unpaired.interval == "Welch t, one-sided 95%"
    assert unpaired.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
    assert math.isnan(unpaired.sign_flip_p)


def test_a_null_claim_is_consistent_only_inside_its_margin(tmp_path):
    results = str(tmp_path)
    write_study(results, "null", seeds=5, protocols=["baseline", "label_smoothing"], models=[], checkpoints=(4,))
    data = StudyData.load(results, "null")
    wide = claims.Claim("t", "LS leaves min MAD (tight margin)", "min_mad", {"protocol": "label_smoothing"},
                         {"protocol": "baseline"}, "two-sided", margin=1e-4)
    loose = claims.Claim("t", "LS leaves min MAD (loose margin)", "min_mad", {"protocol": "label_smoothing"},
                          {"protocol": "baseline"}, "two-sided", margin=0.05)
    table = primary(claims.evaluate_claims(data, (wide, loose))).set_index("claim")
    assert table["verdict"].tolist() == [claim_tests.INCONCLUSIVE, claim_tests.CONSISTENT]
    assert table["margin"].tolist() == [1e-4, 0.05]
    assert {c.margin for c in claims.CLAIMS} <= {*claims.MARGINS.values(), claims.RPT_AS_NONE_MARGIN}
    assert not any(math.isnan(c.margin) for c in claims.CLAIMS)


def test_unknown_study_names_the_ones_there(tmp_path):
    (tmp_path / "study_l" / "trials").mkdir(parents=True)
    (tmp_path / "storage" / "study_l").mkdir(parents=True)  # checkpoints, not a study
    with pytest.raises(ValueError, match=r"studies there: \['study_l'\]$"):
        build_report(str(tmp_path), "study_x")


def test_tuning_trials_show_no_test_accuracy(tmp_path):
    """A holdout-scored (hparam) trial's test accuracy stays empty, though the analysis measured the test split."""
    results = str(tmp_path)
    write_study(results, "hp", seeds=2, protocols=["baseline"], models=[], checkpoints=(4,))
    config = {"dataset": "cifar100", "pe": "ape", "rpt": False, **vocab.protocol_switches("baseline"),
              "protocol": "baseline", "seed": 7, "img_size": 32, "depth": LAYERS, "heads": HEADS, "lr": 1e-3,
              "epochs": 4, "eval_split": "holdout", "code_version": "abc1234"}
    write_trial(results, "hp", config, {"trial_id": "hp-tuning", "study": "hp", "status": "finished",
                                        "eval_acc": 0.4321, "epochs_completed": 4})
    rows = _measure("ape", False, "baseline", np.random.default_rng(0), 1.0, full=True)
    write_measurements(results, "hp", "hp-tuning", 4, [{**r, "value": 0.8777} if r["metric"] == "acc" else r
                                                        for r in rows])
    data = StudyData.load(results, "hp")
    tuning = data.per_trial.set_index("trial_id").loc["hp-tuning"]
    assert np.isnan(tuning["test_acc"]) and np.isnan(tuning["acc_clean"]) and tuning["eval_acc"] == 0.4321
    page = build_report(results, "hp").read_text()
    assert "0.878" not in page and "0.432" in page  # the test-split number nowhere; the holdout score shown


def test_seed_summary_against_numpy():
    rng = np.random.default_rng(1)
    for n in (2, 3, 5, 9):
        v = rng.normal(size=n)
        s = seedstats.seed_summary(np.append(v, np.nan))
        assert s.n == n and np.isclose(s.mean, v.mean()) and np.isclose(s.std, v.std(ddof=1))
        half = stats.t.ppf(0.975, n - 1) * v.std(ddof=1) / math.sqrt(n)
        assert (s.low, s.high) == pytest.approx((v.mean() - half, v.mean() + half))
    assert seedstats.seed_summary([0.3]).n == 1 and np.isnan(seedstats.seed_summary([0.3]).std)
    assert seedstats.seed_summary([]).n == 0


@pytest.mark.parametrize("n_a,n_b", [(2, 2), (3, 3), (3, 4), (4, 4), (5, 5)])
def test_min_achievable_p_is_the_exact_p_of_complete_separation(n_a, n_b):
    a, b = np.arange(n_a), np.arange(n_a, n_a + n_b)
    for alternative in ("less", "two-sided"):
        exact = stats.mannwhitneyu(a, b, alternative=alternative, method="exact").pvalue
        assert np.isclose(seedstats.min_achievable_p(n_a, n_b, alternative), exact)
    assert (seedstats.min_achievable_p(n_a, n_b, "less") >= seedstats.ALPHA) == ((n_a, n_b) in [(2, 2), (3, 3)])


def test_pin_holds_unshown_factors_at_the_reference():
    trials = pd.DataFrame({"trial_id": [f"t{i}" for i in range(4)], "dataset": "cifar10",
                           "pe": ["ape", "rope2d", "ape", "rope2d"], "rpt": False,
                           "protocol": ["baseline", "baseline", "cutmix", "cutmix"], "seed": 0, "status": "finished"})
    data = StudyData.from_frames("s", trials, pd.DataFrame(), pd.DataFrame())
    pinned, said = data.pin(data.trials, {"protocol"})
    assert set(pinned["pe"]) == {"ape"} and said == "pe = ape"
    pinned, said = data.pin(data.trials, {"pe", "protocol"})
    assert len(pinned) == 4 and said == ""


def test_per_trial_fs_se_comes_from_the_paired_counts_where_stored():
    trials = pd.DataFrame({"trial_id": ["new", "old"], "dataset": "cifar10", "pe": "ape", "rpt": False,
                           "protocol": "baseline", "seed": [0, 1], "status": "finished", "test_acc": 0.1})
    whole = {"layer": None, "head_index": None, "n_images": 1000, "checkpoint_epoch": 4}
    rows = []
    for tid in ("new", "old"):
        rows += [{"trial_id": tid, "intervention": "clean", "level": None, "metric": "acc", "value": 0.1, **whole},
                 {"trial_id": tid, "intervention": "jpeg", "level": 5.0, "metric": "fs", "value": 0.1, **whole}]
    rows += [{"trial_id": "new", "intervention": "jpeg", "level": 5.0, "metric": m, "value": v, **whole}
             for m, v in zip(("right_both", "right_clean_only", "right_shift_only"), (40, 60, 50))]
    se = StudyData.from_frames("s", trials, pd.DataFrame(), pd.DataFrame(rows)).per_trial.set_index("trial_id")
    assert se.loc["new", "fs_jpeg_se"] == pytest.approx(float(seedstats.fragility_se(40, 60, 50, 1000)))
    assert se.loc["old", "fs_jpeg_se"] == pytest.approx(float(seedstats.fragility_se_without_counts(0.1, 0.1, 1000)))


class _ClaimsTable(HTMLParser):
    """The claims table's header cells and its verdict cells' classes."""

    def __init__(self):
        super().__init__()
        self.inside, self.head, self.header, self.classes = False, False, [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("class") == "claims":
            self.inside = True
        elif self.inside and tag == "thead":
            self.head = True
        elif self.inside and tag == "td" and str(attrs.get("class", "")).startswith("v-"):
            self.classes.append(attrs["class"])

    def handle_endtag(self, tag):
        if tag == "thead":
            self.head = False
        elif tag == "table" and self.head is False and self.inside and self.header:
            self.inside = False

    def handle_data(self, data):
        if self.head and data.strip():
            self.header.append(data.strip())


def test_the_claims_table_shows_at_most_eight_columns_and_the_rest_in_details(full_report):
    _, index = full_report
    page = index.read_text()
    table = _ClaimsTable()
    table.feed(page.split("<h2 id='claims'>", 1)[1].split("<h2 ", 1)[0])
    assert table.header == ["claim", "setting", "n", "effect (A - B)", "95% CI (two-sided)", "p (adjusted)", "verdict"]
    # Study L's per-layer table, and each trial's CLS-sink count (one planted sink head per trial).
    layers = page.split("<h3>MAD and entropy per layer (cifar100)</h3>", 1)[1].split("</table>", 1)[0]
    assert "<th>MAD [95% t interval]</th>" in layers and "<th>entropy [95% t interval]</th>" in layers
    assert layers.count("<tr>") == len(PROTOCOLS) * LAYERS  # one body row per protocol and layer
    assert "<th>CLS sink heads</th>" in page
    assert "v-supported" in table.classes and "<summary>details</summary>" in page
    assert "<th>p (raw)</th>" in page and "<th>test</th>" in page  # moved to the details row


def test_not_enough_seeds_is_drawn_neutral(tmp_path):
    results = str(tmp_path / "results")
    write_study(results, "small", seeds=3, protocols=["baseline", "cutmix"], models=[("ape", False)], checkpoints=(4,))
    page = build_report(results, "small", out_dir=tmp_path / "out").read_text()
    assert "<td class='v-neutral'>not enough seeds</td>" in page
    assert "v-not-supported'>not enough seeds" not in page


def test_the_report_writes_its_tables_as_numeric_csv_and_latex(full_report):
    _, index = full_report
    conditions = pd.read_csv(index.parent / "conditions.csv")
    assert {"test_acc mean", "test_acc std", "test_acc CI low", "min_mad mean", "n"} <= set(conditions.columns)
    for column in ("test_acc mean", "test_acc CI high", "min_mad mean", "dssdc mean", "dssdc_per_batch mean",
                   "mad_early mean", "n", "did not learn"):
        assert pd.api.types.is_numeric_dtype(conditions[column]), column
    assert conditions["n"].max() == 6 and conditions["test_acc mean"].between(0, 1).all()
    ablation = pd.read_csv(index.parent / "ablation.csv")
    assert set(ablation["protocol"]) >= {"baseline", "cutmix"} and ablation["cutmix"].dtype == bool
    assert pd.api.types.is_numeric_dtype(ablation["min_mad mean"])
    claims_csv = pd.read_csv(index.parent / "claims.csv")
    for column in ("effect (A - B)", "n A", "n B", "p (raw)", "p (Holm)", claim_tests.MDE):
        assert pd.api.types.is_numeric_dtype(claims_csv[column]), column
    assert not (claims_csv.astype(str) == "—").any().any()  # no dash for a missing value
    for name in ("claims", "conditions", "ablation"):
        tex = (index.parent / f"{name}.tex").read_text()
        assert tex.startswith("\\begin{tabular}") and "\\bottomrule" in tex, name
