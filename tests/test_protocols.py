"""Protocols: names, per-image augmentation, CutMix, soft targets, normalisation and seeding."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms.v2.functional as TF
from reference import Augmented, SeededSampler, cutmix_batch, eval_transform, prepare_batch, train_transform
from torch.utils.data import DataLoader

from trainables.data.images import TensorImages, normalize
from trainables.data.protocols import PROTOCOLS, soft_targets
from trainables.data.shapes import make_shapes
from trainables.config.switches import LABEL_SMOOTHING, Protocol

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


@pytest.fixture(scope="module")
def small_split() -> TensorImages:
    images, labels = make_shapes(64, seed=0)
    return TensorImages(images, labels)


def _asymmetric_image(size: int = 32) -> torch.Tensor:
    """A ramp along x and y: any crop offset or flip changes it."""
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    return torch.stack([xs * 7 % 256, ys * 5 % 256, (xs * 3 + ys * 2) % 256]).to(torch.uint8)


# -- names -------------------------------------------------------------------------------------


def test_eight_protocols_plus_modern():
    names = [n for n in PROTOCOLS if n != "modern"]
    assert len(names) == 8 and len({PROTOCOLS[n] for n in names}) == 8
    assert PROTOCOLS["baseline"] == Protocol()
    assert PROTOCOLS["modern"] == Protocol(True, True, True)
    assert Protocol(True, True, True).name == "autoaugment+cutmix+label_smoothing"
    assert Protocol(False, True, True).name == "cutmix+label_smoothing"
    for name, protocol in PROTOCOLS.items():
        assert Protocol.from_name(name) == protocol
        assert name == "modern" or protocol.name == name
    assert Protocol(label_smoothing=True).smoothing == LABEL_SMOOTHING == 0.1
    assert Protocol().smoothing == 0.0


def test_unknown_protocol_lists_names():
    with pytest.raises(ValueError, match="baseline.*modern"):
        Protocol.from_name("cutmix+autoaugment")


# -- every protocol end to end -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_protocol_gives_float_inputs_and_soft_targets(name, small_split):
    protocol = PROTOCOLS[name]
    data = Augmented(small_split, train_transform(protocol, "shapes", 32))
    loader = DataLoader(data, batch_size=16, sampler=SeededSampler(len(data), seed=0))
    images, labels = next(iter(loader))
    assert images.dtype == torch.uint8 and images.shape == (16, 3, 32, 32) and labels.shape == (16,)
    x, targets = prepare_batch(images, labels, protocol, 10, MEAN, STD, torch.Generator().manual_seed(1))
    assert x.dtype == torch.float32 and x.shape == (16, 3, 32, 32)
    assert targets.shape == (16, 10) and (targets >= 0).all()
    torch.testing.assert_close(targets.sum(1), torch.ones(16))
    if protocol.cutmix:  # a mixed batch has some row with two nonzero classes (unless lambda ~ 1)
        assert ((targets > 0).sum(1) <= 2).all()
    else:
        assert torch.equal(targets, soft_targets(labels, 10))
    loss = torch.nn.functional.cross_entropy(torch.zeros(16, 10), targets, label_smoothing=protocol.smoothing)
    torch.testing.assert_close(loss, torch.log(torch.tensor(10.0)))  # uniform logits: log C whatever the targets


@pytest.mark.parametrize("dataset,size,strong", [
    ("cifar100", 32, "autoaugment_cifar10"),
    ("tinyimagenet", 64, "color_jitter"),
    ("imagenet100", 224, "autoaugment_imagenet"),
])
def test_strong_augmentation_per_dataset(dataset, size, strong):
    transform = train_transform(Protocol(autoaugment=True), dataset, size)
    assert transform.strong_name == strong
    raw = torch.randint(0, 256, (3, 300, 260) if size == 224 else (3, size, size), dtype=torch.uint8)
    out = transform(raw, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == (3, size, size)
    assert train_transform("baseline", dataset, size).strong is None


# -- per-image randomness, reference crop, AutoAugment, eval ---------------------------------------


def test_images_of_one_batch_get_different_draws():
    """v2 transforms on a batch tensor would give every image the same crop/flip:
    a batch of identical images must come out different."""
    split = TensorImages(_asymmetric_image().expand(32, 3, 32, 32).contiguous(), torch.zeros(32, dtype=torch.long))
    for key_kind in ("seeded", "global"):
        data = Augmented(split, train_transform("baseline", "shapes", 32))
        sampler = SeededSampler(32, seed=0) if key_kind == "seeded" else None
        images, _ = next(iter(DataLoader(data, batch_size=32, sampler=sampler)))
        distinct = {tuple(img.flatten().tolist()) for img in images}
        assert len(distinct) > 16, key_kind


def test_pad_crop_matches_torchvision_and_is_uniform():
    """Every output is one of torchvision's pad(4)+crop(+flip) results (brute force over all
    17 x 17 x 2 choices), and the choices are drawn uniformly (flip ~ 1/2, offsets ~ 1/9)."""
    image = _asymmetric_image()
    padded = TF.pad(image, [4, 4, 4, 4], fill=0)
    reference = {}
    for top in range(9):
        for left in range(9):
            crop = padded[:, top:top + 32, left:left + 32]
            reference[tuple(crop.flatten().tolist())] = (top, left, False)
            reference[tuple(crop.flip(-1).flatten().tolist())] = (top, left, True)
    transform = train_transform("baseline", "shapes", 32)
    g = torch.Generator().manual_seed(0)
    draws = [reference[tuple(transform(image, g).flatten().tolist())] for _ in range(1800)]
    flips = sum(d[2] for d in draws) / len(draws)
    tops = torch.bincount(torch.tensor([d[0] for d in draws]), minlength=9) / len(draws)
    assert abs(flips - 0.5) < 0.05
    assert ((tops - 1 / 9).abs() < 0.04).all()


def test_autoaugment_changes_pixels_and_eval_does_not(small_split):
    baseline = train_transform("baseline", "shapes", 32)
    augmented = train_transform("autoaugment", "shapes", 32)
    evaluation = eval_transform("shapes", 32)
    changed = 0
    for i in range(40):
        image = small_split.images[i]
        # Same seed: same crop and flip draws (they come first), so any difference is AutoAugment's.
        a = baseline(image, torch.Generator().manual_seed(i))
        b = augmented(image, torch.Generator().manual_seed(i))
        changed += not torch.equal(a, b)
        assert torch.equal(evaluation(image, torch.Generator().manual_seed(i)), image)
        assert torch.equal(evaluation(image), image)
    assert changed >= 25  # some AutoAugment sub-policies leave an image as is (p < 1, identity ops)


def test_eval_transform_squashes_224_px_images_as_study_ps_code():
    """Study P's `prep_data.py` evaluates `T.Resize((224, 224))`: the whole image, squashed, no crop."""
    image = torch.randint(0, 256, (3, 300, 400), dtype=torch.uint8)
    image[:, :, :40] = 0  # a band a centre crop would cut off
    out = eval_transform("imagenet100", 224)(image)
    assert torch.equal(out, TF.resize(image, [224, 224], antialias=True))
    assert out[:, :, :20].float().mean() < 5  # the band is still there, 400 -> 224 wide
    small = torch.randint(0, 256, (3, 40, 48), dtype=torch.uint8)  # below 128 px: resize and centre crop
    assert torch.equal(eval_transform("cifar10", 32)(small), TF.center_crop(TF.resize(small, [32], antialias=True),
                                                                            [32, 32]))


# -- seeding -----------------------------------------------------------------------------------------


def test_same_seed_same_output_and_global_rng_untouched(small_split):
    transform = train_transform("modern", "shapes", 32)
    image = small_split.images[0]
    before = torch.get_rng_state()
    a = transform(image, torch.Generator().manual_seed(7))
    b = transform(image, torch.Generator().manual_seed(7))
    c = transform(image, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), before)  # the loop's own RNG stream is not disturbed


def test_seeded_loader_same_for_any_worker_count(small_split):
    data = Augmented(small_split, train_transform("modern", "shapes", 32))

    def epoch_batches(workers: int, epoch: int) -> torch.Tensor:
        sampler = SeededSampler(len(data), seed=3)
        sampler.set_epoch(epoch)
        loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=workers)
        return torch.cat([images for images, _ in loader])

    serial = epoch_batches(0, epoch=1)
    assert torch.equal(serial, epoch_batches(2, epoch=1))
    assert not torch.equal(serial, epoch_batches(0, epoch=2))


def test_seeded_sampler_shards_cover_everything():
    shards = [list(SeededSampler(10, seed=1, num_replicas=3, rank=r)) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    assert {i for s in shards for i, _ in s} == set(range(10))
    one = SeededSampler(10, seed=1)
    one.set_epoch(0)
    first = [i for i, _ in one]
    one.set_epoch(1)
    assert sorted(first) == list(range(10)) and first != [i for i, _ in one]
    assert len(list(SeededSampler(10, seed=1, num_replicas=3, rank=0, drop_last=True))) == 3


# -- CutMix, soft targets, normalisation ------------------------------------------------------------


def test_cutmix_weights_equal_pasted_area():
    """Image b is constant b and has label b: after CutMix the weight of class v in row b must
    equal the fraction of row b's pixels that now hold the value v (the actual pasted mask)."""
    batch, classes, size = 8, 10, 32
    images = torch.arange(batch, dtype=torch.uint8).view(batch, 1, 1, 1).expand(batch, 3, size, size).contiguous()
    labels = torch.arange(batch)
    clipped = 0
    for seed in range(60):
        mixed, targets = cutmix_batch(images, labels, classes, torch.Generator().manual_seed(seed))
        assert torch.equal(images[:, 0, 0, 0], labels.to(torch.uint8))  # input untouched
        for b in range(batch):
            fractions = torch.bincount(mixed[b, 0].flatten().long(), minlength=classes).float() / size**2
            torch.testing.assert_close(targets[b], fractions, atol=1e-6, rtol=0)
        pasted = (mixed != images).any(1).float().mean((1, 2))
        clipped += bool((pasted.max() > 0) and (pasted.max() < 0.2))
        torch.testing.assert_close(targets.sum(1), torch.ones(batch))
    assert clipped > 0  # some boxes were small or clipped at the border


def test_cutmix_keeps_soft_targets_soft():
    targets = torch.softmax(torch.randn(6, 5), 1)
    images = torch.rand(6, 3, 8, 8)
    _, mixed = cutmix_batch(images, targets, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(mixed.sum(1), torch.ones(6))
    with pytest.raises(ValueError, match="num_classes"):
        cutmix_batch(images, torch.zeros(6, dtype=torch.long))


def test_normalize_matches_reference():
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    expected = (images.float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    torch.testing.assert_close(normalize(images, MEAN, STD), expected)
    torch.testing.assert_close(normalize(images[0], MEAN, STD), expected[0])


def test_soft_targets_one_hot():
    assert soft_targets(torch.tensor([2, 0]), 3).tolist() == [[0, 0, 1], [1, 0, 0]]
