"""Batched augmentation (trainables/data/augment.py) against torchvision's per-image path, draw frequencies, keying."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import v2

from trainables.data import augment
from trainables.data.augment import (Augmentation, StepDraws, apply, draw, item_keys, resized_crop, resized_crop_params,
                                     step_batch, uniforms)
from trainables.data.images import normalize
from reference import cutmix_batch, item_seed

from trainables.data.protocols import COLOR_JITTER, cutmix_draw, soft_targets
from trainables.data.shapes import make_shapes

N = 64  # images per equality test: small, but every op of both policies shows up (checked)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    shapes, _ = make_shapes(N, seed=0)
    # Shapes are flat colour fields: add noise so equalize, sharpness and contrast see real histograms.
    noise = torch.randint(-40, 41, shapes.shape, generator=torch.Generator().manual_seed(0))
    return (shapes.int() + noise).clamp(0, 255).to(torch.uint8)


def _reference(spec: Augmentation, image: torch.Tensor, p: augment.Draws, i: int) -> torch.Tensor:
    """Today's per-image path for image i, fed image i's drawn parameters: torchvision's pad +
    crop, flip, and AutoAugment's own per-image op application (its private
    `_apply_image_or_video_transform`) or ColorJitter's kernels."""
    s, pad = spec.img_size, spec.padding
    out = TF.pad(image, [pad] * 4, fill=0)[:, p.top[i]:p.top[i] + s, p.left[i]:p.left[i] + s]
    if p.flip[i]:
        out = TF.horizontal_flip(out)
    if spec.strong and spec.strong.startswith("autoaugment"):
        policy = {"autoaugment_cifar10": v2.AutoAugmentPolicy.CIFAR10,
                  "autoaugment_imagenet": v2.AutoAugmentPolicy.IMAGENET}[spec.strong]
        aa = v2.AutoAugment(policy)
        for stage, (op, _probability, bin_) in enumerate(aa._policies[p.policy[i]]):
            if not p.applied[i, stage]:
                continue
            magnitudes_fn, signed = aa._AUGMENTATION_SPACE[op]
            magnitudes = magnitudes_fn(10, s, s)
            magnitude = 0.0 if magnitudes is None else float(magnitudes[bin_])
            if magnitudes is not None and signed and p.negative[i, stage]:
                magnitude *= -1
            out = aa._apply_image_or_video_transform(out, op, magnitude, interpolation=aa.interpolation, fill=aa._fill)
    elif spec.strong == "color_jitter":
        b, c, sat = (float(f) for f in p.factors[i])
        kernels = [lambda x: TF.adjust_brightness(x, b), lambda x: TF.adjust_contrast(x, c),
                   lambda x: TF.adjust_saturation(x, sat)]
        for op in p.order[i]:
            out = kernels[op](out)
    return out


@pytest.mark.parametrize("strong", [None, "autoaugment_cifar10", "autoaugment_imagenet"])
def test_batched_equals_per_image_bit_for_bit(images, strong):
    spec = Augmentation(32, strong)
    seen_ops = set()
    for epoch in range(1, 4 if strong else 2):  # three chunks: every op of the policy appears
        p = draw(spec, item_keys(5, epoch, np.arange(N)))
        out = apply(spec, images, p)
        assert out.dtype == torch.uint8 and out.shape == images.shape
        for i in range(N):
            assert torch.equal(out[i], _reference(spec, images[i], p, i)), (strong, epoch, i)
        if strong:
            table = augment._policy_table(strong)
            seen_ops |= {table.ops[p.policy[r]][s][0] for r, s in zip(*np.nonzero(p.applied))}
    if strong:
        all_ops = {op for sub in augment._policy_table(strong).ops for op, _ in sub}
        assert seen_ops == all_ops, all_ops - seen_ops


def test_color_jitter_within_one_level(images):
    """Brightness exact; contrast and saturation blend in a different float order: <= 1 level."""
    spec = Augmentation(32, "color_jitter")
    p = draw(spec, item_keys(1, 1, np.arange(N)))
    out = apply(spec, images, p)
    reference = torch.stack([_reference(spec, images[i], p, i) for i in range(N)])
    diff = (out.int() - reference.int()).abs()
    assert diff.max() <= 1, diff.max()
    assert (diff > 0).float().mean() < 1e-3
    brightness_only = draw(spec, item_keys(1, 1, np.arange(N)))
    object.__setattr__(brightness_only, "factors", np.concatenate(
        [p.factors[:, :1], np.ones((N, 2), dtype=np.float32)], 1))
    assert torch.equal(apply(spec, images, brightness_only),
                       torch.stack([_reference(spec, images[i], brightness_only, i) for i in range(N)]))


def test_resized_crop_is_torchvisions_kernel_at_drawn_boxes():
    keys = item_keys(0, 1, np.arange(200))
    heights = np.random.default_rng(0).integers(40, 400, 200)
    widths = np.random.default_rng(1).integers(40, 400, 200)
    boxes = resized_crop_params(keys, heights, widths)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= heights).all() and (left + w <= widths).all()
    scale = h * w / (heights * widths)
    assert scale.min() >= 0.07 and scale.max() <= 1.0
    # A strip too thin for any ratio in [3/4, 4/3] takes the centred fallback crop.
    top, left, h, w = resized_crop_params(keys[:1], np.array([1000]), np.array([10]))[0]
    assert (h, w, left, top) == (round(10 / 0.75), 10, 0, (1000 - 13) // 2)
    image = torch.randint(0, 256, (3, 300, 260), dtype=torch.uint8)
    box = resized_crop_params(keys[:1], np.array([300]), np.array([260]))[0]
    expected = TF.resized_crop(image, *map(int, box), [224, 224], antialias=True)
    assert torch.equal(resized_crop(image, box, 224), expected)


# -- frequencies ---------------------------------------------------------------------------------


def _within_binomial(count: int, n: int, p: float, z: float = 5.0) -> bool:
    return abs(count - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1


def test_draw_frequencies_match_their_probabilities():
    n = 40_000
    keys = item_keys(11, 3, np.arange(n))
    crop = draw(Augmentation(32, None), keys)
    assert _within_binomial(int(crop.flip.sum()), n, 0.5)
    for offsets in (crop.top, crop.left):
        counts = np.bincount(offsets, minlength=9)
        assert len(counts) == 9 and all(_within_binomial(int(c), n, 1 / 9) for c in counts)
    for strong in ("autoaugment_cifar10", "autoaugment_imagenet"):
        p = draw(Augmentation(32, strong), keys)
        table = augment._policy_table(strong)
        counts = np.bincount(p.policy, minlength=len(table.ops))
        assert len(counts) == 25 and all(_within_binomial(int(c), n, 1 / 25) for c in counts)
        for q in range(25):
            mine = p.policy == q
            for stage in (0, 1):
                assert _within_binomial(int(p.applied[mine, stage].sum()), int(mine.sum()), table.probability[q, stage])
        assert _within_binomial(int(p.negative.sum()), 2 * n, 0.5)
    jitter = draw(Augmentation(64, "color_jitter"), keys)
    lo, hi = 1 - COLOR_JITTER, 1 + COLOR_JITTER
    assert jitter.factors.min() >= lo and jitter.factors.max() < hi
    for k in range(3):  # uniform: each tenth of the range holds a tenth of the draws
        counts = np.histogram(jitter.factors[:, k], bins=10, range=(lo, hi))[0]
        assert all(_within_binomial(int(c), n, 0.1) for c in counts)
    orders = np.unique(jitter.order @ np.array([9, 3, 1]), return_counts=True)[1]
    assert len(orders) == 6 and all(_within_binomial(int(c), n, 1 / 6) for c in orders)


def test_uniforms_are_uniform_and_independent_across_slots():
    keys = item_keys(0, 0, np.arange(20_000))
    a, b = uniforms(keys, 0)[:, 0], uniforms(keys, 1)[:, 0]
    assert 0 <= a.min() and a.max() < 1
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03
    assert all(_within_binomial(int(c), len(a), 0.1) for c in np.histogram(a, bins=10, range=(0, 1))[0])


# -- keying --------------------------------------------------------------------------------------


def test_keys_are_the_scalar_splitmix64_and_order_an_epoch_as_before():
    seeds, epochs, index = np.array([0, 3, 7]), np.array([1, 2, 9]), np.array([5, 0, 49_999])
    assert item_keys(seeds, epochs, index).tolist() == [item_seed(*map(int, t)) for t in zip(seeds, epochs, index)]
    assert int(item_keys(4, 2, -1)) == item_seed(4, 2, -1)
    # The epoch's shuffle is seeded by the key of index -1: a changed hash would change every data order.
    from trainables.data.inputs import epoch_order

    assert torch.equal(epoch_order(50, seed=4, epoch=2), torch.randperm(50, generator=torch.Generator().manual_seed(
        item_seed(4, 2, -1))))


def test_two_images_of_one_chunk_get_different_draws(images):
    """The same image repeated through one call comes out in many different ways."""
    same = images[:1].expand(N, -1, -1, -1).contiguous()
    for strong in (None, "autoaugment_cifar10", "color_jitter"):
        spec = Augmentation(32, strong)
        out = apply(spec, same, draw(spec, item_keys(0, 1, np.arange(N))))
        assert len({tuple(x.flatten().tolist()) for x in out}) > N // 2, strong


def test_draws_do_not_depend_on_chunking_or_order(images):
    """Image i's result depends only on (seed, epoch, i): any chunk split or order gives the same."""
    spec = Augmentation(32, "autoaugment_cifar10")
    index = np.arange(N)
    whole = apply(spec, images, draw(spec, item_keys(2, 4, index)))
    perm = np.random.default_rng(0).permutation(N)
    parts = [apply(spec, images[torch.from_numpy(c)], draw(spec, item_keys(2, 4, c))) for c in np.split(perm, [5, 40])]
    assert torch.equal(torch.cat(parts), whole[torch.from_numpy(perm)])
    # K pack members in one call: each member's rows equal its own call.
    seeds = np.repeat([2, 9], N)
    packed = apply(spec, torch.cat([images, images]), draw(spec, item_keys(seeds, 4, np.tile(index, 2))))
    assert torch.equal(packed[:N], whole) and not torch.equal(packed[N:], whole)


def test_rows_pick_images_from_a_whole_split(images):
    """apply(split, rows=...) (the loop's fused indexing) equals indexing first, for every stage."""
    rows = np.array([5, 5, 63, 0, 17, 40, 2, 2, 9])
    for strong in (None, "autoaugment_cifar10", "color_jitter"):
        spec = Augmentation(32, strong)
        p = draw(spec, item_keys(0, 1, rows))
        assert torch.equal(apply(spec, images, p, rows=rows), apply(spec, images[torch.from_numpy(rows)], p))
    spec = Augmentation(128, "autoaugment_imagenet")
    large = torch.randint(0, 256, (6, 3, 128, 128), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    p = draw(spec, item_keys(0, 1, rows[:4]))
    assert torch.equal(apply(spec, large, p, rows=rows[:4] % 6), apply(spec, large[torch.from_numpy(rows[:4] % 6)], p))


# -- a pack's step input ---------------------------------------------------------------------------


def test_a_packs_step_batch_is_each_members_lone_step_bit_for_bit(images):
    """step_batch over K members (CutMix or not this step, RPT none / per batch / per image) equals each
    member's lone step: protocols.cutmix_batch from the same generator state, then normalize."""
    mean, std, batch, n = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), 8, 16
    kinds = [(True, None), (False, "batch"), (True, "image"), (False, None)]  # (CutMix this step, RPT)
    for k in (1, 2, 4):
        for step in range(4):
            members = kinds[step % 4:] + kinds[:step % 4]
            batches, draws, alone = [], [], []
            for m, (mixed, rpt) in enumerate(members[:k]):
                rows = torch.randperm(N, generator=torch.Generator().manual_seed(10 * k + m))[:batch]
                x, labels = images[rows], rows % 10
                batches.append((x, labels))
                target = soft_targets(labels, 10)
                box = partner = perm = None
                if mixed:
                    x, target = cutmix_batch(x, target, generator=torch.Generator().manual_seed(step + m))
                    box, partner = cutmix_draw(batch, 32, 32, torch.Generator().manual_seed(step + m))
                if rpt:
                    perm = torch.randperm(n) if rpt == "batch" else torch.rand(batch, n).argsort(1)
                draws.append(StepDraws(box, partner, perm))
                alone.append((normalize(x, mean, std), target, perm))
            x, target, perms = step_batch(batches, draws, num_classes=10, mean=mean, std=std)
            assert x.shape == (k, batch, 3, 32, 32) and target.shape == (k, batch, 10)
            for m, (x_m, target_m, perm_m) in enumerate(alone):
                assert torch.equal(x[m], x_m) and torch.equal(target[m], target_m), (k, step, m)
                if k == 1:  # the plain module takes the member's own permutation, or none
                    assert perms[0] is perm_m if perm_m is None else torch.equal(perms[0], perm_m)
                elif perms is not None:  # the identity for a member without RPT
                    full = torch.arange(n).expand(batch, n) if perm_m is None else perm_m.expand(batch, n)
                    assert torch.equal(perms[m], full)
            assert (perms is None) == (k > 1 and all(d.perm is None for d in draws))
    with pytest.raises(ValueError, match="2 member batches and 1 draws"):
        step_batch(batches[:2], draws[:1], num_classes=10, mean=mean, std=std)
