"""analysis.measuring.evaluate on tiny random-weight ViTs: the STUDIES.md properties and the measurement vocabulary."""

from __future__ import annotations

import math
from collections import Counter

import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F
from test_metrics import attention_entropy, cls_attention_mass, mean_attention_distance

from analysis.measuring import metrics
from analysis.measuring.evaluate import ALPHA_SCALES, alpha_scale, evaluate_checkpoint, evaluation_subset
from analysis.measuring.interventions import BLUR_LEVELS, JPEG_LEVELS, rpi_permutation
from records.schema import MEASUREMENTS, PAIRED_COUNTS
from trainables.data.datasets import capped_subset
from trainables.data.images import TensorImages, normalize
from trainables.model.pos_embed import POS_EMBEDS
from trainables.model.vit import ViT
from trainables.config.architecture import ViTConfig

GRID = 8
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)



def pes_scaled_by(scaling: str) -> tuple[str, ...]:
    """The registered PEs whose alpha rows are ``scaling`` ("pe_scale" or "rope_scale"), in registry order."""
    return tuple(pe for pe, cls in POS_EMBEDS.items() if cls.alpha_scaling == scaling)

def _smooth_images(n: int = 64, seed: int = 0) -> torch.Tensor:
    """uint8 (n, 3, 32, 32) smooth colour fields: neighbouring patches look alike, so SSDC is clearly > 0."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 4, 4, generator=generator)
    return (F.interpolate(coarse, size=32, mode="bicubic").clamp(0, 1) * 255).round().to(torch.uint8)


def _model(pe: str, seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    return ViT(ViTConfig.preset("tiny", pe=pe)).eval()


def _labels(n: int = 64) -> torch.Tensor:
    return torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(1))


# Only the image shifts a test is about: each level is one more forward pass per batch.
NO_SHIFTS = dict(jpeg_levels=(), blur_levels=())


def _values(rows, intervention, metric, level=None):
    """{(layer, head): value} of the rows matching (intervention, metric[, level])."""
    return {
        (r["layer"], r["head_index"]): r["value"]
        for r in rows
        if r["intervention"] == intervention and r["metric"] == metric and (level is None or r["level"] == level)
    }


def _layers(rows, intervention, metric, level=None) -> list[float]:
    values = _values(rows, intervention, metric, level)
    return [values[(layer, None)] for layer in range(len(values))]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU the thread barriers cost ~7x."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def images():
    return _smooth_images()


@pytest.fixture(scope="module")
def ape_rows(images):
    """Every default level: 52 passes, so one batch of 32 images."""
    return evaluate_checkpoint(_model("ape"), images[:32], _labels(32), mean=MEAN, std=STD, grid=GRID, batch_size=32)


def _tokens(model, images, perm=None, **kwargs):
    with torch.no_grad():
        return model(normalize(images, MEAN, STD), perm=perm, return_tokens=True, **kwargs).tokens


# --------------------------------------------------------------------------- STUDIES.md properties


def test_none_model_rpi_content_ssdc_equals_unpermuted_and_index_ssdc_collapses(images):
    model = _model("none")
    clean = [metrics.SSDCAccumulator(GRID) for _ in range(model.config.depth)]
    content = [metrics.SSDCAccumulator(GRID) for _ in range(model.config.depth)]
    index = [metrics.SSDCAccumulator(GRID) for _ in range(model.config.depth)]
    for batch_index, batch in enumerate(images.split(16)):
        perm = rpi_permutation(0, batch_index, GRID * GRID)
        for layer, tokens in enumerate(_tokens(model, batch)):
            clean[layer].update(tokens[:, 1:])
        for layer, tokens in enumerate(_tokens(model, batch, perm=perm)):
            content[layer].update(tokens[:, 1:], perm=perm)
            index[layer].update(tokens[:, 1:])
    for layer in range(model.config.depth):
        assert clean[layer].ssdc() > 0.3  # the smooth images give real content structure
        assert content[layer].ssdc() == pytest.approx(clean[layer].ssdc(), abs=1e-4)
        assert abs(index[layer].ssdc()) < 0.15


def test_none_model_rows_rpi_content_equals_clean(images):
    rows = evaluate_checkpoint(
        _model("none"), images, _labels(), mean=MEAN, std=STD, grid=GRID, batch_size=32, **NO_SHIFTS
    )
    clean = _layers(rows, "clean", "ssdc")
    content, index = _layers(rows, "rpi", "ssdc_content"), _layers(rows, "rpi", "ssdc")
    assert content == pytest.approx(clean, abs=1e-4)
    assert all(abs(v) < 0.15 for v in index) and all(v > 0.3 for v in clean)
    # The CLS output of a PE-free model does not see the token order: RPI leaves accuracy unchanged.
    assert _values(rows, "rpi", "acc") == pytest.approx(_values(rows, "clean", "acc"))
    assert not any(r["intervention"] == "pe_scale" for r in rows)  # nothing to scale


@pytest.mark.parametrize("pe", ["ape", "sincos2d"])
def test_additive_pe_at_alpha_0_equals_none_model(pe, images):
    model = _model(pe)
    none = ViT(ViTConfig.preset("tiny", pe="none")).eval()
    missing, unexpected = none.load_state_dict(model.state_dict(), strict=False)
    assert not missing and set(unexpected) <= {"pe.table"}
    perm = rpi_permutation(0, 0, GRID * GRID)
    for a, b in zip(_tokens(model, images[:8], perm=perm, pe_scale=0.0), _tokens(none, images[:8], perm=perm)):
        torch.testing.assert_close(a, b)

    kwargs = dict(mean=MEAN, std=STD, grid=GRID, batch_size=32, **NO_SHIFTS)
    rows = evaluate_checkpoint(model, images, _labels(), alphas=(0.0,), **kwargs)
    none_rows = evaluate_checkpoint(none, images, _labels(), **kwargs)
    assert _values(rows, "pe_scale", "acc", 0.0) == _values(none_rows, "clean", "acc")
    assert _layers(rows, "pe_scale", "ssdc", 0.0) == pytest.approx(_layers(none_rows, "rpi", "ssdc"), abs=1e-4)


# --------------------------------------------------------------------------- vocabulary and ranges


def test_rows_have_the_full_vocabulary(ape_rows):
    config = ViTConfig.preset("tiny")
    L, H = config.depth, config.heads
    counts = Counter((r["intervention"], r["metric"]) for r in ape_rows)
    expected = {
        ("clean", "acc"): 1, ("clean", "ssdc"): L,
        ("clean", "mad"): L * H, ("clean", "mad_raw"): L * H, ("clean", "mad_no_renorm"): L * H,
        ("clean", "entropy"): L * H, ("clean", "cls_mass"): L * H, ("clean", "ape_norm_ratio"): 1,
        ("jpeg", "acc"): len(JPEG_LEVELS), ("jpeg", "fs"): len(JPEG_LEVELS),
        ("blur", "acc"): len(BLUR_LEVELS), ("blur", "fs"): len(BLUR_LEVELS),
        ("rpi", "acc"): 1, ("rpi", "ssdc"): L, ("rpi", "ssdc_content"): L, ("rpi", "dssdc"): 1,
        ("rpi", "ssdc_per_batch"): L, ("rpi", "dssdc_per_batch"): 1,
        ("pe_scale", "acc"): 11, ("pe_scale", "fs_jpeg"): 11, ("pe_scale", "fs_blur"): 11,
        ("pe_scale", "ssdc"): 11 * L, ("pe_scale", "dssdc"): 11,
        **{("jpeg", c): len(JPEG_LEVELS) for c in PAIRED_COUNTS},
        **{("blur", c): len(BLUR_LEVELS) for c in PAIRED_COUNTS},
        **{("pe_scale", f"{fs}_{c}"): 11 for fs in ("fs_jpeg", "fs_blur") for c in PAIRED_COUNTS},
    }  # fmt: skip
    assert dict(counts) == expected
    assert all(r["n_images"] == 32 for r in ape_rows)  # every row names the images behind it
    assert {r["level"] for r in ape_rows if r["intervention"] == "jpeg"} == {float(q) for q in JPEG_LEVELS}
    assert {r["level"] for r in ape_rows if r["intervention"] == "blur"} == set(BLUR_LEVELS)
    assert all(r["level"] is None for r in ape_rows if r["intervention"] in ("clean", "rpi"))
    # Heads only on attention metrics; a null layer exactly on whole-model metrics.
    for r in ape_rows:
        assert (r["head_index"] is not None) == (r["metric"] in ("mad", "mad_raw", "mad_no_renorm", "entropy",
                                                                 "cls_mass"))
        whole = ("acc", "fs", "fs_jpeg", "fs_blur", "dssdc", "dssdc_per_batch", "ape_norm_ratio")
        assert (r["layer"] is None) == (r["metric"] in whole or r["metric"].endswith(PAIRED_COUNTS))
    # The caller adds trial_id, study and checkpoint_epoch; then the rows fit the Parquet schema as they are.
    keyed = [{"trial_id": "t", "study": "s", "checkpoint_epoch": 0, **r} for r in ape_rows]
    table = pa.Table.from_pylist(keyed, MEASUREMENTS)
    assert table.num_rows == len(ape_rows)


def test_rows_have_sane_ranges_and_consistent_derived_values(ape_rows):
    max_distance = math.sqrt(2) * (GRID - 1)
    for r in ape_rows:
        value, metric = r["value"], r["metric"]
        if metric in ("acc", "mad", "mad_no_renorm", "entropy", "cls_mass"):
            assert 0.0 <= value <= 1.0, r
        elif metric == "mad_raw":
            assert 0.0 <= value <= max_distance, r
        elif metric in ("ssdc", "ssdc_content", "ssdc_per_batch"):
            assert -1.0 <= value <= 1.0, r
        elif metric in ("fs", "fs_jpeg", "fs_blur"):
            assert math.isnan(value) or value <= 1.0, r
    mad, mad_raw = _values(ape_rows, "clean", "mad"), _values(ape_rows, "clean", "mad_raw")
    assert all(mad[k] == pytest.approx(mad_raw[k] / max_distance) for k in mad)
    # Not renormalised, a head's MAD is its renormalised MAD times the mass its queries left on patches
    # (exactly so when every query of the head gives CLS the same share; here, up to that spread).
    no_renorm, cls_mass = _values(ape_rows, "clean", "mad_no_renorm"), _values(ape_rows, "clean", "cls_mass")
    assert all(no_renorm[k] <= mad[k] and no_renorm[k] == pytest.approx(mad[k] * (1 - cls_mass[k]), rel=0.05)
               for k in mad)
    acc = _values(ape_rows, "clean", "acc")[(None, None)]
    for level in JPEG_LEVELS:
        shifted = _values(ape_rows, "jpeg", "acc", float(level))[(None, None)]
        fs = _values(ape_rows, "jpeg", "fs", float(level))[(None, None)]
        assert fs == pytest.approx(metrics.fragility(acc, shifted), nan_ok=True)
    # The paired counts give back both accuracies and FS: (b - c) / (a + b) over the same n images.
    n = ape_rows[0]["n_images"]
    for kind, levels in (("jpeg", JPEG_LEVELS), ("blur", BLUR_LEVELS)):
        for level in map(float, levels):
            a, b, c = (_values(ape_rows, kind, name, level)[(None, None)] for name in PAIRED_COUNTS)
            assert (a + b) / n == pytest.approx(acc)
            assert (a + c) / n == pytest.approx(_values(ape_rows, kind, "acc", level)[(None, None)])
            fs = _values(ape_rows, kind, "fs", level)[(None, None)]
            assert fs == pytest.approx((b - c) / (a + b), nan_ok=True) if a + b else math.isnan(fs)
    # alpha = 1 is the trained model: the same numbers as the unscaled conditions.
    assert _values(ape_rows, "pe_scale", "acc", 1.0)[(None, None)] == acc
    assert _layers(ape_rows, "pe_scale", "ssdc", 1.0) == _layers(ape_rows, "rpi", "ssdc")
    rpi = _layers(ape_rows, "rpi", "ssdc")
    assert _values(ape_rows, "rpi", "dssdc")[(None, None)] == pytest.approx(rpi[1] - rpi[0])


def test_attention_rows_match_one_shot_metrics_on_the_whole_subset(images):
    model = _model("rope2d")
    rows = evaluate_checkpoint(
        model, images, _labels(), mean=MEAN, std=STD, grid=GRID, batch_size=24, alphas=(), **NO_SHIFTS
    )
    with torch.no_grad():
        attention = model(normalize(images, MEAN, STD), return_attention=True).attention
    for layer, attn in enumerate(attention):
        for metric, expected in (
            ("mad", mean_attention_distance(attn, GRID)),
            ("mad_no_renorm", mean_attention_distance(attn, GRID, renormalize=False)),
            ("entropy", attention_entropy(attn, GRID)),
            ("cls_mass", cls_attention_mass(attn)),
        ):
            values = _values(rows, "clean", metric)
            got = torch.tensor([values[(layer, h)] for h in range(model.config.heads)], dtype=torch.float64)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_clean_measurements_do_not_depend_on_batch_size_and_mode_is_restored(images):
    model = _model("sincos2d").train()
    kwargs = dict(mean=MEAN, std=STD, grid=GRID, alphas=(), **NO_SHIFTS)
    small = evaluate_checkpoint(model, images, _labels(), batch_size=16, **kwargs)
    assert model.training
    large = evaluate_checkpoint(model, images, _labels(), batch_size=64, **kwargs)
    for metric in ("acc", "ssdc", "mad", "entropy"):
        a, b = _values(small, "clean", metric), _values(large, "clean", metric)
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-5) for k in a)


def test_ssdc_under_rpi_has_one_estimand_whatever_the_batch_and_evaluation_size():
    """One permutation per image: the same model on the same images scores the same SSDC under RPI at
    evaluation batch 16 and 256, and within 0.05 on 250 and 2,000 images. The paper's estimator (one
    permutation per 1,000 images, SSDC per group) keeps its own name: another estimand, not the batch's."""
    model, many = _model("sincos2d"), _smooth_images(2000, seed=5)  # index-anchored structure at init
    kwargs = dict(mean=MEAN, std=STD, grid=GRID, alphas=(), **NO_SHIFTS)
    labels = torch.zeros(2000, dtype=torch.long)
    small = evaluate_checkpoint(model, many[:250], labels[:250], batch_size=16, **kwargs)
    large = evaluate_checkpoint(model, many[:250], labels[:250], batch_size=256, **kwargs)
    whole = evaluate_checkpoint(model, many, labels, batch_size=256, **kwargs)
    by_batch = [_layers(rows, "rpi", "ssdc") for rows in (small, large)]
    assert by_batch[0] == pytest.approx(by_batch[1], abs=0.05)
    assert _layers(whole, "rpi", "ssdc") == pytest.approx(by_batch[1], abs=0.05)
    assert all(v > 0.5 for v in by_batch[1])  # the structure the test is about is there
    per_batch = [_layers(rows, "rpi", "ssdc_per_batch") for rows in (small, large)]
    assert per_batch[0] == pytest.approx(per_batch[1], abs=1e-4)  # the same 250 images share one permutation
    assert all(a < b - 0.05 for a, b in zip(per_batch[1], by_batch[1]))  # one permutation keeps content
    assert _values(large, "rpi", "dssdc_per_batch")[(None, None)] == pytest.approx(per_batch[1][1] - per_batch[1][0])


def test_ape_norm_ratio_is_the_table_over_the_patch_embeddings_for_a_learned_ape_only(images):
    model = _model("ape")
    kwargs = dict(mean=MEAN, std=STD, grid=GRID, batch_size=24, alphas=(), **NO_SHIFTS)
    rows = evaluate_checkpoint(model, images, _labels(), **kwargs)
    with torch.no_grad():
        patches = model.patch_embed(normalize(images, MEAN, STD)).norm(dim=-1).mean()
        table = model.pe.table[0, 1:].norm(dim=-1).mean()
    assert _values(rows, "clean", "ape_norm_ratio")[(None, None)] == pytest.approx(float(table / patches), rel=1e-5)
    for pe in ("none", "sincos2d"):  # no learned table: nothing weight decay or training could move
        assert not _values(evaluate_checkpoint(_model(pe), images[:8], _labels(8), **kwargs), "clean",
                           "ape_norm_ratio")


def test_every_pe_declares_its_alpha_scaling():
    """The PE classes say how the analysis scales them: additive tables pe_scale, rotations rope_scale."""
    assert pes_scaled_by("pe_scale") == ("ape", "sincos2d")
    assert pes_scaled_by("rope_scale") == ("rope2d", "rope2d_mixed")
    assert alpha_scale("none") is None and alpha_scale("ape").name == "pe_scale"
    assert {cls.alpha_scaling for cls in POS_EMBEDS.values()} <= {*ALPHA_SCALES, None}


def test_an_unknown_alpha_scaling_is_named_with_the_choices(monkeypatch):
    from trainables.model import pos_embed

    class Odd(pos_embed.LearnedAbsolute):
        alpha_scaling = "pe_sacle"

    monkeypatch.setitem(pos_embed.POS_EMBEDS, "odd", Odd)
    with pytest.raises(ValueError,
                       match=r"pe='odd' declares alpha_scaling='pe_sacle'; valid: \['pe_scale', 'rope_scale', None\]"):
        alpha_scale("odd")


@pytest.mark.parametrize("pe", pes_scaled_by("rope_scale"))
def test_rope_alpha_rows_are_rope_scale_never_pe_scale(pe, images):
    """Scaling RoPE's angles is position interpolation: its rows never land under Study P's pe_scale."""
    model = _model(pe)
    rows = evaluate_checkpoint(model, images[:16], _labels(16), mean=MEAN, std=STD, grid=GRID, batch_size=16,
                               alphas=(0.0, 0.5, 1.0), **NO_SHIFTS)
    assert not any(r["intervention"] == "pe_scale" for r in rows)
    scaled = Counter(r["metric"] for r in rows if r["intervention"] == "rope_scale")
    L = model.config.depth
    counts = {f"{fs}_{c}": 3 for fs in ("fs_jpeg", "fs_blur") for c in PAIRED_COUNTS}
    assert scaled == {"acc": 3, "fs_jpeg": 3, "fs_blur": 3, "ssdc": 3 * L, "dssdc": 3, **counts}
    assert all(r["n_images"] == 16 for r in rows)
    # alpha 0 removes the rotation: the sanity point equals the same weights without a PE.
    none = ViT(ViTConfig.preset("tiny", pe="none")).eval()
    none.load_state_dict(model.state_dict(), strict=False)
    none_rows = evaluate_checkpoint(none, images[:16], _labels(16), mean=MEAN, std=STD, grid=GRID, batch_size=16,
                                    **NO_SHIFTS)
    assert _values(rows, "rope_scale", "acc", 0.0) == _values(none_rows, "clean", "acc")


# --------------------------------------------------------------------------- evaluation subset


class _ListDataset(torch.utils.data.Dataset):
    """A map-style Dataset of (uint8 image, int label) with .labels and no .images (as folder splits are)."""

    def __init__(self, images, labels):
        self._images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self._images[i], int(self.labels[i])


def test_evaluation_subset_is_the_epoch_scores_stratified_draw_for_both_dataset_kinds():
    images, labels = _smooth_images(50), torch.arange(50) % 5
    a_images, a_labels = evaluation_subset(TensorImages(images, labels), size=20, seed=3)
    b_images, b_labels = evaluation_subset(_ListDataset(images, labels), size=20, seed=3)
    assert torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)
    assert a_images.dtype == torch.uint8 and a_images.shape == (20, 3, 32, 32) and a_labels.dtype == torch.int64
    assert torch.bincount(a_labels).tolist() == [4] * 5  # every class in proportion
    # the images the training loop scores every epoch (epoch_eval_images, seed 0)
    rows = capped_subset(labels, 20)
    assert torch.equal(evaluation_subset(TensorImages(images, labels), size=20)[0], images[rows])
    assert not torch.equal(evaluation_subset(TensorImages(images, labels), size=20, seed=4)[0], a_images)
    assert len(evaluation_subset(TensorImages(images, labels), size=1000)[1]) == 50  # capped at the split
    assert len(evaluation_subset(TensorImages(images, labels), size=3)[1]) == 3  # below the classes: a seeded draw
    whole_images, whole_labels = evaluation_subset(_ListDataset(images, labels))  # default: the whole split
    assert torch.equal(whole_labels, labels) and torch.equal(whole_images, images)
    with pytest.raises(ValueError, match="must be >= 1"):
        evaluation_subset(TensorImages(images, labels), size=0)


def test_paired_counts_follow_each_image_across_batches(images):
    """Counted per image in evaluation order, over uneven batches: the same cells as direct predictions."""
    from analysis.measuring.interventions import Jpeg

    model = _model("ape")
    labels = _labels()
    rows = evaluate_checkpoint(model, images, labels, mean=MEAN, std=STD, grid=GRID, batch_size=24,
                               jpeg_levels=(10,), blur_levels=(), alphas=())
    with torch.no_grad():
        clean = model(normalize(images, MEAN, STD)).logits.argmax(-1) == labels
        shift = model(normalize(Jpeg(10).images(images), MEAN, STD)).logits.argmax(-1) == labels
    counted = [_values(rows, "jpeg", name, 10.0)[(None, None)] for name in PAIRED_COUNTS]
    assert counted == [int((clean & shift).sum()), int((clean & ~shift).sum()), int((~clean & shift).sum())]
