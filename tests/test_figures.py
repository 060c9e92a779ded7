"""Figures a paper can use (#25): one colour per condition in every figure, text that renders at one size
on the page, axes fitted to the data, panel titles and letters, captions that say what is drawn, SVG with
editable text and a PDF, and the accuracy's binomial SE over the images it was measured on. Synthetic
studies from tests/test_report.py (no Ray)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import matplotlib
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_hex
from PIL import Image
from test_report import LAYERS, N_IMAGES, write_study

from analysis.measuring import canvas
from analysis.measuring.uniform_attention import uniform_mad
from analysis.reporting import figures, page
from analysis.reporting import plotting as pl
from analysis.statistics import labels, seedstats
from analysis.statistics.conditions import TRIAL_KEYS
from analysis.statistics.study_data import StudyData
from records import vocab

PROTOCOLS = ["baseline", "autoaugment", "cutmix", "label_smoothing"]  # in protocol_key order
MODELS = [("none", False), ("ape", False), ("ape", True)]


def _study(tmp_path_factory, name: str, seeds: int, datasets=("cifar100",)) -> StudyData:
    results = str(tmp_path_factory.mktemp(name))
    for ds in datasets:
        write_study(results, name, seeds=seeds, protocols=PROTOCOLS, models=MODELS, checkpoints=(0, 4), dataset=ds)
    return StudyData.load(results, name)


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory):
    return _study(tmp_path_factory, "one", seeds=1)


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    return _study(tmp_path_factory, "two", seeds=2, datasets=("cifar100", "cifar10"))


def _line_colour(fig, label: str) -> str:
    found = {to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()
             if line.get_label().split(" (n=")[0] == label}
    assert len(found) == 1, (label, found, [ln.get_label() for ax in fig.axes for ln in ax.get_lines()])
    return found.pop()


def _panel(fig, protocol: str):
    return next(ax for ax in fig.axes if ax.get_visible() and labels.protocol_label(protocol) in ax.get_title())


def test_every_registry_name_has_its_own_colour_and_new_names_a_stable_one():
    from trainables.data.protocols import PROTOCOLS as REGISTRY
    from trainables.model.pos_embed import POS_EMBEDS

    pes = {pe: pl.named_colour(pe) for pe in POS_EMBEDS}
    protocols = {vocab.canonical_protocol(p): pl.named_colour(p) for p in REGISTRY}
    assert set(POS_EMBEDS) <= set(pl.COLOURS) and set(protocols) <= set(pl.COLOURS)  # none falls to the default
    assert len(set(pes.values())) == len(pes)
    assert len(set(protocols.values())) == len(protocols)
    # PE and protocol series meet only at the reference condition (ape, baseline): one colour in both.
    assert set(pes.values()) & set(protocols.values()) == {pes["ape"]} == {protocols["baseline"]}
    assert pl.colour("ape", True) not in (pes["ape"], *pes.values(), *protocols.values())  # RPT: its own shade
    assert pl.colour("ape", False, "modern") == protocols[vocab.MODERN]
    # A name the map has not seen: the same default in another process (no salted hash()).
    here = pl.named_colour("my_new_pe")
    code = "from analysis.reporting import plotting; print(plotting.named_colour('my_new_pe'))"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "7"}).stdout.strip()
    assert there == here and here not in pl.COLOURS.values()


def test_a_condition_has_the_same_colour_in_every_figure(one_seed):
    data = one_seed
    (ssdc,) = figures.ssdc_clean(data)
    (curves,) = figures.training_curves(data)
    (emergence,) = figures.emergence(data)
    (mad,) = figures.mad_per_layer(data)
    (summary,) = figures.protocol_summary(data)
    (accuracy,) = figures.accuracy_fragility(data)
    # Study P's series (models at baseline) against the training curves' conditions.
    for pe, rpt in MODELS:
        model = labels.model_label(pe, rpt)
        assert _line_colour(ssdc.figure, model) == _line_colour(curves.figure, f"{model} / baseline") == \
            pl.colour(pe, rpt, "baseline"), model
    assert _line_colour(ssdc.figure, "none") == _line_colour(emergence.figure, "none")
    # Study L's series (protocols at ape) in four figures; ape baseline is ape's colour from Study P.
    for protocol in PROTOCOLS:
        label = labels.protocol_label(protocol)
        per_layer = {to_hex(line.get_color()) for line in _panel(mad.figure, protocol).get_lines()
                     if not line.get_label().startswith("uniform attention")}  # the grey reference level
        assert per_layer == {_line_colour(emergence.figure, label)} == {_line_colour(curves.figure, f"ape / {label}")}
    dots = _mean_markers(summary.figure.axes[0])  # one per protocol
    assert dots == [pl.colour("ape", False, p) for p in PROTOCOLS]
    assert dots[0] == _line_colour(ssdc.figure, "ape") == _mean_markers(accuracy.figure.axes[0])[1]  # ape's marker


def _mean_markers(ax) -> list[str]:
    return [to_hex(c.lines[0].get_color()) for c in ax.containers if c.lines[0] is not None]  # not the SE bars


def test_captions_say_what_is_drawn(one_seed, two_seeds):
    for draw in (figures.ssdc_clean, figures.accuracy_fragility, figures.protocol_summary, figures.mad_entropy,
                 figures.training_curves):
        (single,) = draw(one_seed)
        assert not re.search(r"\bCI\b", single.caption) and "n = 1 seed per condition" in single.caption, single.caption
        assert not any(isinstance(c, PolyCollection) for ax in single.figure.axes for c in ax.collections)
        (double,) = draw(two_seeds)
        assert ("95% t interval of the mean" in double.caption
                and "n = 2 seeds per condition" in double.caption), double.caption
    (accuracy,) = figures.accuracy_fragility(one_seed)
    assert "sampling SE" in accuracy.caption  # the grey SE bars are drawn from n images even for one seed


def test_text_renders_at_one_size_whatever_the_panel_count(one_seed):
    data = one_seed
    sizes, panel_counts = set(), set()
    for draw in (figures.ssdc_clean, figures.fragility_severity, figures.pe_scaling, figures.mad_per_layer,
                 figures.mad_entropy):
        fig = draw(data)[0].figure
        panels = [ax for ax in fig.axes if ax.get_visible()]
        panel_counts.add(len(panels))
        asked = canvas.display_px(fig)  # the <img> width the report gives it
        with Image.open(io.BytesIO(canvas.render_png(fig))) as png:
            assert png.size[0] * canvas.PX_PER_IN / canvas.DPI == pytest.approx(asked, abs=1)
        shown = min(asked, canvas.PAGE_IN * canvas.PX_PER_IN)  # a wider one is shrunk to the page, text with it
        for ax in panels:
            for tick in ax.get_xticklabels() + ax.get_yticklabels():
                sizes.add(round(tick.get_fontsize() / 72 * shown / fig.get_figwidth(), 2))  # CSS px on the page
    assert panel_counts == {1, 2, 3, 4} and sizes == {12.5}


def test_mad_entropy_axes_fit_every_point(one_seed):
    (plot,) = figures.mad_entropy(one_seed)
    for ax in (a for a in plot.figure.axes if a.get_visible()):
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        pts = [c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)][0]
        for low, high, v in ((x0, x1, pts[:, 0]), (y0, y1, pts[:, 1])):
            span = high - low
            assert low + 0.03 * span <= v.min() and v.max() <= high - 0.03 * span  # no point on an edge


def test_panel_titles_name_their_factors_and_panels_are_lettered(one_seed, two_seeds):
    (fragility,) = figures.fragility_severity(two_seeds)
    panels = fragility.figure.axes
    assert [ax.get_title() for ax in panels] == ["cifar10, baseline, jpeg", "cifar10, baseline, blur",
                                                 "cifar100, baseline, jpeg", "cifar100, baseline, blur"]
    assert [_letters(ax) for ax in panels] == [["a"], ["b"], ["c"], ["d"]]
    (mad,) = figures.mad_per_layer(one_seed)[:1]
    assert _panel(mad.figure, "cutmix").get_title() == "cifar100, ape, CutMix, n=1"
    (single,) = figures.ssdc_clean(one_seed)
    assert single.figure.axes[0].get_title() == "cifar100, baseline" and _letters(single.figure.axes[0]) == []


def _letters(ax) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_label() == pl.LETTER]


def test_svg_text_is_editable_and_every_figure_has_a_pdf(one_seed):
    (plot,) = figures.ssdc_clean(one_seed)
    before = matplotlib.rcParams["svg.fonttype"]
    svg = canvas.render_svg(plot.figure).decode()
    assert "<text" in svg and "layer l (input of block l)" in svg  # text, not glyph outlines
    pdf = canvas.render_pdf(plot.figure)
    assert pdf.startswith(b"%PDF") and b"/FontFile2" in pdf  # embedded TrueType: text stays text
    assert matplotlib.rcParams["svg.fonttype"] == before  # scoped to the rendering
    assert canvas.render_png(plot.figure).startswith(b"\x89PNG")  # back on the raster canvas


def test_accuracy_se_is_over_the_test_split_and_the_page_says_which(tmp_path):
    from trainables.data.datasets import load_dataset
    from trainables.config.data_roots import DATASET_SPECS

    sizes = {name: s.test_images for name, s in DATASET_SPECS.items() if s.test_images}
    assert sizes["shapes"] == len(load_dataset("shapes").test)
    results = str(tmp_path)
    write_study(results, "se", seeds=1, protocols=["baseline"], models=[("none", False)], checkpoints=(4,),
                tables=("trials", "measurements"))
    write_study(results, "se", seeds=1, protocols=["baseline"], models=[], checkpoints=(4,), dataset="folder",
                tables=("trials", "measurements"))
    pt = StudyData.load(results, "se").per_trial.set_index("dataset")
    cifar, folder = pt.loc[pt.index == "cifar100"].iloc[0], pt.loc["folder"]
    assert cifar["n_images"] == N_IMAGES and cifar["test_images"] == 10_000  # a 2,000-image analysis set
    assert cifar["test_acc_se"] == pytest.approx(seedstats.binomial_se(cifar["test_acc"], 10_000))
    assert cifar["fs_jpeg_se"] == pytest.approx(
        seedstats.fragility_se_without_counts(cifar["fs_jpeg"], cifar["acc_clean"], N_IMAGES))  # the analysis set's
    assert folder["test_acc_se_on_subset"] and not cifar["test_acc_se_on_subset"]
    assert folder["test_acc_se"] == pytest.approx(seedstats.binomial_se(folder["test_acc"], N_IMAGES))
    note = page._se_note(StudyData.load(results, "se").per_trial)
    assert "test split's images (cifar100 10,000)" in note
    assert "For folder the test accuracy SE is over the analysis set's" in note


def test_minimum_mad_leaves_cls_sink_heads_out_and_counts_them(tmp_path):
    """A head whose queries give CLS 0.9 may score any renormalised MAD (here 0.001, "local"): minimum MAD
    leaves it out and says so; the mean MAD of layers 0-1 stands beside it; every MAD figure draws the
    uniform-attention level of the study's grid (8 x 8 here: 0.418)."""
    results = str(tmp_path)
    write_study(results, "sink", seeds=2, protocols=["baseline", "cutmix"], models=[], checkpoints=(4,))
    read = {name: pd.read_parquet(tmp_path / "sink" / name) for name in ("trials", "epochs", "measurements")}
    m = read["measurements"]
    m = m[m["metric"] != "cls_mass"]  # the synthetic study's own sink heads out: this test plants one
    heads = m[m["metric"] == "mad"]
    sink_trial = heads["trial_id"].iloc[0]
    before = StudyData.from_frames("sink", read["trials"], read["epochs"], m).per_trial.set_index("trial_id")
    cls = heads[heads["trial_id"] == sink_trial].assign(metric="cls_mass", value=0.1)
    sink = (cls["layer"] == LAYERS - 1) & (cls["head_index"] == 0)
    cls.loc[sink, "value"] = 0.9
    m = m.copy()
    m.loc[(m["trial_id"] == sink_trial) & (m["metric"] == "mad") & (m["layer"] == LAYERS - 1)
          & (m["head_index"] == 0), "value"] = 0.001
    data = StudyData.from_frames("sink", read["trials"], read["epochs"], pd.concat([m, cls], ignore_index=True))
    pt = data.per_trial.set_index("trial_id")
    assert pt.loc[sink_trial, "min_mad"] == pytest.approx(before.loc[sink_trial, "min_mad"])  # not 0.001
    assert pt["cls_sink_heads"].to_dict() == {t: (1 if t == sink_trial else 0) for t in pt.index}
    assert pt.loc[sink_trial, "min_mad_all_heads"] == pytest.approx(0.001)  # the sensitivity check keeps it
    assert not pt["all_heads_cls_sinks"].any()
    early = m[(m["trial_id"] == sink_trial) & (m["metric"] == "mad") & m["layer"].isin([0, 1])]["value"].mean()
    assert pt.loc[sink_trial, "mad_early"] == pytest.approx(early)

    assert uniform_mad(8) == pytest.approx(0.418, abs=5e-4)
    assert uniform_mad(14) == pytest.approx(0.396, abs=5e-4)
    for make in (figures.mad_per_layer, figures.mad_entropy, figures.protocol_summary):
        for plot in make(data):
            lines = [line for ax in plot.figure.axes for line in ax.get_lines()
                     if line.get_label().startswith("uniform attention (8 x 8)")]
            # axhline: y constant; axvline (MAD on x): x constant
            levels = {round(float(ln.get_ydata()[0] if ln.get_ydata()[0] == ln.get_ydata()[1] else ln.get_xdata()[0]),
                            3) for ln in lines}
            assert levels == {0.418}, plot.title
            assert pl.UNIFORM_TEXT in plot.caption


def test_the_measurements_are_held_lean_and_select_gives_the_stored_rows_with_their_factors(tmp_path):
    """At 10,000 trials the measurements are 11.75 million rows (#41): held categorical, without the factor
    columns, and every selection is the stored rows joined to their trial's factors, as a plain merge gives them."""
    results = str(tmp_path)
    write_study(results, "lean", seeds=2, protocols=["baseline", "cutmix"], models=MODELS, checkpoints=(0, 4))
    data = StudyData.load(results, "lean")
    m = data.measurements
    assert all(isinstance(m[c].dtype, pd.CategoricalDtype) for c in m.columns if c != "value")
    assert not set(TRIAL_KEYS[1:]) & set(m.columns)
    plain = pd.read_parquet(tmp_path / "lean" / "measurements").drop(columns="study").merge(
        data.trials[list(TRIAL_KEYS)], on="trial_id")
    plain[["level", "layer", "head_index"]] = plain[["level", "layer", "head_index"]].astype(float)
    order = ["trial_id", "checkpoint_epoch", "intervention", "metric", "level", "layer", "head_index"]
    for (intervention, metric), kw in ((("clean", "mad"), {"per_layer": True, "per_head": True}),
                                       (("jpeg", "fs"), {"level": float(vocab.JPEG_HEADLINE)}),
                                       (("clean", "acc"), {"final": False})):
        want = plain[(plain["intervention"] == intervention) & (plain["metric"] == metric)]
        want = want if kw.get("final", True) is False else want[want["checkpoint_epoch"] == 4]
        if "level" in kw:
            want = want[want["level"] == kw["level"]]
        got = data.select(intervention, metric, **kw)
        assert len(got) and list(got.columns) == list(want.columns)
        pd.testing.assert_frame_equal(got.sort_values(order, ignore_index=True),
                                      want.sort_values(order, ignore_index=True))
