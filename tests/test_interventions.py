"""analysis.measuring.interventions: what each intervention does to images or to the model call."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from analysis.measuring import interventions as iv
from records import vocab


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


# Every intervention by its measurements-table name, and the severity grids of the levelled ones.
INTERVENTIONS: dict[str, type[iv.Intervention]] = {cls.name: cls for cls in _subclasses(iv.Intervention)}
DEFAULT_LEVELS = {"jpeg": iv.JPEG_LEVELS, "blur": iv.BLUR_LEVELS, "pe_scale": iv.ALPHAS, "rope_scale": iv.ALPHAS}

def make_intervention(name: str, level: float | None = None, **params: Any) -> iv.Intervention:
    """Build an intervention by registry name (the tests' shorthand; the analysis builds its classes).

    ``make_intervention("jpeg", 5)``, ``make_intervention("blur", 2.5, kernel=5)``,
    ``make_intervention("pe_scale", 0.3)``, ``make_intervention("rope_scale", 0.5)``,
    ``make_intervention("rpi", seed=0)``,
    ``make_intervention("clean")``. ``level`` is required exactly for the
    interventions in ``DEFAULT_LEVELS``.
    """
    if name not in INTERVENTIONS:
        raise ValueError(f"unknown intervention {name!r}; choose one of {tuple(INTERVENTIONS)}")
    if name in DEFAULT_LEVELS:
        if level is None:
            raise ValueError(f"intervention {name!r} needs a level; defaults: {DEFAULT_LEVELS[name]}")
        return INTERVENTIONS[name](level, **params)
    if level is not None:
        raise ValueError(
            f"intervention {name!r} takes no level (got {level!r}); levelled ones: {tuple(DEFAULT_LEVELS)}"
        )
    return INTERVENTIONS[name](**params)


def _images(batch: int = 4, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Natural-ish uint8 images: smooth colour fields (bilinearly upsampled noise) with some fine texture."""
    generator = torch.Generator().manual_seed(seed)
    coarse = F.interpolate(torch.rand(batch, 3, size // 8, size // 8, generator=generator), size=size, mode="bilinear")
    fine = 0.15 * torch.rand(batch, 3, size, size, generator=generator)
    return ((coarse + fine).clamp(0, 1) * 255).round().to(torch.uint8)


def _change(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


def test_registry_and_default_levels():
    assert set(INTERVENTIONS) == {"clean", "jpeg", "blur", "rpi", "pe_scale", "rope_scale"}
    assert DEFAULT_LEVELS["rope_scale"] == DEFAULT_LEVELS["pe_scale"] == iv.ALPHAS
    assert iv.JPEG_LEVELS == (5, 10, 20, 50, 75) and vocab.JPEG_HEADLINE in iv.JPEG_LEVELS
    assert iv.BLUR_LEVELS == (0.5, 1.0, 1.5, 2.0, 2.5) and vocab.BLUR_HEADLINE == (iv.BLUR_KERNEL, iv.BLUR_LEVELS[-1])
    assert iv.ALPHAS == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def test_jpeg_changes_pixels_more_at_lower_quality():
    images = _images()
    changes = [_change(make_intervention("jpeg", q).images(images), images) for q in sorted(iv.JPEG_LEVELS)]
    assert all(a > b for a, b in zip(changes, changes[1:])), changes
    out = make_intervention("jpeg", 50).images(images)
    assert out.dtype == torch.uint8 and out.shape == images.shape


def test_jpeg_is_per_image():
    images = _images(batch=3)
    jpeg = make_intervention("jpeg", 10)
    torch.testing.assert_close(jpeg.images(images)[1:2], jpeg.images(images[1:2]), rtol=0, atol=0)


def test_blur_changes_pixels_more_at_larger_sigma_and_matches_torchvision():
    images = _images()
    changes = [_change(make_intervention("blur", s).images(images), images) for s in iv.BLUR_LEVELS]
    assert all(a < b for a, b in zip(changes, changes[1:])), changes
    blurred = make_intervention("blur", 2.5).images(images)
    # Reference: the blur of each image computed separately in float, rounded back to uint8.
    import torchvision.transforms.v2.functional as TF

    reference = torch.stack([TF.gaussian_blur(image.float(), [5, 5], [2.5, 2.5]) for image in images])
    assert (blurred.float() - reference).abs().max() <= 1.0
    assert blurred.dtype == torch.uint8


def test_clean_and_model_interventions_leave_images_alone():
    images = _images()
    for name, level in (("clean", None), ("rpi", None), ("pe_scale", 0.3)):
        intervention = make_intervention(name, level)
        assert intervention.images(images) is images


def _perm(intervention, positions=range(0, 4), num_patches=64):
    return intervention.model_kwargs(positions=positions, num_patches=num_patches, device="cpu")["perm"]


def test_rpi_permutation_is_seeded_per_image_whatever_the_batching():
    rpi = make_intervention("rpi", seed=3)
    first = _perm(rpi, positions=range(0, 4))
    assert first.shape == (4, 64) and all(sorted(row.tolist()) == list(range(64)) for row in first)
    assert len({tuple(row.tolist()) for row in first}) == 4  # a permutation per image
    # Image 2 gets the same order as the third image of a batch from 0 or the first of a batch from 2.
    assert torch.equal(_perm(rpi, positions=range(2, 4)), first[2:])
    assert torch.equal(_perm(make_intervention("rpi", seed=3)), first)
    assert not torch.equal(_perm(make_intervention("rpi", seed=4)), first)


def test_rpi_in_groups_shares_one_permutation_per_group_of_the_evaluation_set():
    paper = iv.RandomPermutation(seed=3, group=iv.PAPER_RPI_BATCH)
    first = _perm(paper)
    assert first.shape == (64,) and sorted(first.tolist()) == list(range(64))  # one group: one (N,) perm
    assert torch.equal(first, _perm(paper, positions=range(990, 1000)))
    straddling = _perm(paper, positions=range(998, 1002))  # a batch across two groups
    assert torch.equal(straddling[0], first) and torch.equal(straddling[1], first)
    assert torch.equal(straddling[2], straddling[3]) and not torch.equal(straddling[2], first)
    assert not torch.equal(first, _perm(iv.RandomPermutation(seed=4, group=iv.PAPER_RPI_BATCH)))


def test_pe_scale_kwargs_and_levels():
    kwargs = dict(positions=range(1), num_patches=4, device="cpu")
    assert make_intervention("pe_scale", 0.3).model_kwargs(**kwargs) == {"pe_scale": 0.3}
    assert make_intervention("pe_scale", 0).level == 0.0
    rope = make_intervention("rope_scale", 0.5)  # the same model argument under its own name
    assert rope.name == "rope_scale" and rope.model_kwargs(**kwargs) == {"pe_scale": 0.5}
    assert rope != make_intervention("pe_scale", 0.5)  # distinct conditions, never merged
    assert make_intervention("jpeg", 5.0).level == 5.0  # levels round-trip through float64 Parquet columns
    assert make_intervention("blur", 2.5).level == 2.5
    assert make_intervention("rpi").level is None and make_intervention("clean").level is None


def test_apply_condition_composes_images_and_kwargs():
    images = _images()
    condition = (make_intervention("jpeg", 5), make_intervention("rpi"), make_intervention("pe_scale", 0.5))
    out, kwargs = iv.apply_condition(condition, images, positions=range(4, 4 + len(images)), num_patches=16,
                                     device="cpu")
    torch.testing.assert_close(out, make_intervention("jpeg", 5).images(images), rtol=0, atol=0)
    assert set(kwargs) == {"perm", "pe_scale"} and kwargs["pe_scale"] == 0.5
    with pytest.raises(ValueError, match="twice"):
        twice = (make_intervention("pe_scale", 0.1),) * 2
        iv.apply_condition(twice, images, positions=range(len(images)), num_patches=16, device="cpu")


@pytest.mark.parametrize(
    "name, level, params, match",
    [
        ("gamma", None, {}, "clean"),  # unknown name lists the registry
        ("jpeg", 0, {}, "1..100"),
        ("jpeg", 101, {}, "1..100"),
        ("jpeg", 7.5, {}, "1..100"),
        ("jpeg", None, {}, "needs a level"),
        ("blur", 0.0, {}, "positive"),
        ("blur", 1.0, {"kernel": 4}, "odd"),
        ("pe_scale", -0.1, {}, ">= 0"),
        ("pe_scale", float("nan"), {}, ">= 0"),
        ("rope_scale", -1.0, {}, "rope_scale alpha"),
        ("rpi", 1.0, {}, "takes no level"),
    ],
)
def test_bad_names_and_levels_raise(name, level, params, match):
    with pytest.raises(ValueError, match=match):
        make_intervention(name, level, **params)


def test_image_interventions_reject_float_images():
    with pytest.raises(ValueError, match="uint8"):
        make_intervention("jpeg", 5).images(torch.rand(1, 3, 8, 8))
