"""Study L's training protocols: per-image augmentation, CutMix, label smoothing, normalisation.

A protocol is three switches (Study L, arXiv 2605.16390; recipe of Lee et al.
2021, "Vision Transformer for Small-Size Datasets"):

* baseline, always on: random crop (zero padding img_size // 8: 4 px at 32 px,
  8 px at 64 px) + horizontal flip; from `LARGE_IMAGE_SIZE` (224 px) a random
  resized crop of the full image (scale 0.08-1, ImageNet practice) + flip;
* `autoaugment`: torchvision's AutoAugment, CIFAR-10 policy below 128 px and
  ImageNet policy from it; on Tiny-ImageNet ColorJitter(0.4, 0.4, 0.4) instead,
  as Study L does (so this factor changes meaning across data sets);
* `cutmix`: CutMix (Yun et al. 2019), beta(1, 1), one box per batch (as in
  Lee et al.'s recipe), on a share `cutmix_prob` of the batches (run config,
  default 1; Lee et al. use 0.5); the box is pasted from a shuffled copy of
  the batch; targets mixed by the pasted area after clipping to the image, as
  soft targets (B, C);
* `label_smoothing`: 0.1, applied by the loss:
  `F.cross_entropy(logits, soft_targets, label_smoothing=protocol.smoothing)`.

Data path (uint8 until the model; B batch, C classes, S image side):

    split -> uint8 (N, 3, S, S) on the device (in-memory sets)      trainables/inputs.py
    augment.draw (host, per image) + augment.apply (device, batched) -> uint8 (n, 3, S, S)
    soft_targets -> cutmix_batch -> normalize -> float (B, 3, S, S), (B, C)   per batch, on the device

The per-image transforms below (`TrainTransform`, `Augmented`) are the
reference that trainables/augment.py is tested and benchmarked against; the
loop no longer uses them. Per-image randomness is deliberate: torchvision v2
transforms called on a batch tensor draw ONE parameter set for the whole
batch (every image gets the same crop, flip and AutoAugment op), so these
transforms only ever see one image, and augment.py draws per image too.

Seeding. A transform takes an optional `torch.Generator`: with one, every draw
comes from it (torchvision's own draws run under the default CPU generator
seeded from it, which is restored afterwards); without one, draws use torch's
global RNG as torchvision does. `SeededSampler` + `Augmented` give every
(seed, epoch, index) its own generator (`item_seed`), so augmentations are the
same for any number of DataLoader workers, persistent or not, and after a
resume; augment.py keys its draws by the same `item_seed`. The epoch's order
is `epoch_order` (shared by `SeededSampler` and the device input path).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Sampler
from torchvision.transforms import v2

from records import vocab
from trainables.images import (
    LARGE_IMAGE_SIZE,
    device_constant,
    eval_resize_size,
    resize_center_crop,
    to_device,
)

LABEL_SMOOTHING = 0.1
CUTMIX_BETA = 1.0
COLOR_JITTER = 0.4  # brightness, contrast and saturation: Study L's AutoAugment stand-in on Tiny-ImageNet
COLOR_JITTER_DATASETS = ("tinyimagenet",)


@dataclass(frozen=True)
class Protocol:
    """Study L's three switches. `name`: "baseline", or the enabled ones joined by "+"."""

    autoaugment: bool = False
    cutmix: bool = False
    label_smoothing: bool = False

    @property
    def name(self) -> str:
        return vocab.protocol_name(self.autoaugment, self.cutmix, self.label_smoothing)

    @property
    def smoothing(self) -> float:
        """The `label_smoothing` argument of the loss: 0.1 when on, else 0."""
        return LABEL_SMOOTHING if self.label_smoothing else 0.0

    @classmethod
    def from_name(cls, name: str) -> Protocol:
        """The protocol a name (or the alias ``modern``) means; an unknown name raises ValueError."""
        return cls(**vocab.protocol_switches(name))


# Every combination of the switches, and the aliases: the vocabulary's names, checked at import.
_ALL = [Protocol(aa, cm, ls) for aa in (False, True) for cm in (False, True) for ls in (False, True)]
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in _ALL} | {
    alias: Protocol.from_name(name) for alias, name in vocab.ALIASES.items()}
vocab.check_registry("trainables.protocols.PROTOCOLS", PROTOCOLS, vocab.PROTOCOLS, "PROTOCOLS")


# -- per-image transforms ------------------------------------------------------------------------


def augmentation_for(dataset_name: str, img_size: int) -> str:
    """Which strong augmentation `autoaugment` means here: "color_jitter" (Tiny-ImageNet, as in
    Study L), "autoaugment_imagenet" (from LARGE_IMAGE_SIZE) or "autoaugment_cifar10"."""
    if dataset_name in COLOR_JITTER_DATASETS:
        return "color_jitter"
    return "autoaugment_imagenet" if img_size >= LARGE_IMAGE_SIZE else "autoaugment_cifar10"


@contextlib.contextmanager
def _global_rng_from(generator: torch.Generator | None):
    """Run torchvision's draws (which use the default CPU generator) from `generator`:
    seed the default generator from it, restore the default's state afterwards."""
    if generator is None:
        yield
        return
    default = torch.default_generator
    state = default.get_state()
    default.manual_seed(int(torch.randint(2**62, (), generator=generator)))
    try:
        yield
    finally:
        default.set_state(state)


class TrainTransform:
    """One image in, one augmented image out: uint8 (3, h, w) -> uint8 (3, S, S). The per-image
    reference of `augment.apply` (tests, bench/input_pipeline.py); training uses augment.py.

    Below LARGE_IMAGE_SIZE the input must already be S x S (datasets store it so).
    """

    def __init__(self, img_size: int, *, strong: str | None):
        self.img_size = img_size
        self.padding = img_size // 8
        self.resized_crop = (
            v2.RandomResizedCrop(img_size, antialias=True) if img_size >= LARGE_IMAGE_SIZE else None
        )
        self.strong_name = strong
        self.strong = {
            None: None,
            "color_jitter": v2.ColorJitter(COLOR_JITTER, COLOR_JITTER, COLOR_JITTER),
            "autoaugment_cifar10": v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10),
            "autoaugment_imagenet": v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET),
        }[strong]

    def __call__(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.resized_crop is not None:
            with _global_rng_from(generator):
                image = self.resized_crop(image)
            flip = bool(torch.rand((), generator=generator) < 0.5)
        else:
            image, flip = self._pad_crop(image, generator)
        if flip:
            image = image.flip(-1)
        if self.strong is not None:
            with _global_rng_from(generator):
                image = self.strong(image)
        return image

    def _pad_crop(self, image: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, bool]:
        """torchvision's RandomCrop(S, padding=p) (zero fill) as one shifted copy, plus the flip draw.

        Written out because it is one slice assignment: v2.RandomCrop pads the whole
        image first and costs ~3x more per image, and it cannot take a generator."""
        S, p = self.img_size, self.padding
        if image.shape[-2:] != (S, S):
            raise ValueError(f"expected a {S}x{S} image for pad-and-crop, got {tuple(image.shape)}")
        # One draw, decoded into a uniform (top, left, flip): RNG calls dominate at 32 px.
        draw = int(torch.randint(0, 2 * (2 * p + 1) ** 2, (), generator=generator))
        flip, top, left = draw % 2, draw // 2 // (2 * p + 1), draw // 2 % (2 * p + 1)
        dy, dx = top - p, left - p  # out[y, x] = image[y + dy, x + dx], zero outside
        out = torch.zeros_like(image)
        out[:, max(0, -dy):S - max(0, dy), max(0, -dx):S - max(0, dx)] = \
            image[:, max(0, dy):S - max(0, -dy), max(0, dx):S - max(0, -dx)]
        return out, flip == 1

    def __repr__(self) -> str:
        crop = "random_resized_crop" if self.resized_crop is not None else f"pad{self.padding}_crop"
        return f"TrainTransform({self.img_size}px: {crop} + flip + {self.strong_name})"


class EvalTransform:
    """Never augments: identity on images already at the evaluation size (every stored split),
    else resize (shorter side 256 for 224) + centre crop."""

    def __init__(self, img_size: int):
        self.img_size = img_size

    def __call__(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return resize_center_crop(image, self.img_size, resize_to=eval_resize_size(self.img_size))

    def __repr__(self) -> str:
        return f"EvalTransform({self.img_size}px)"


def train_transform(protocol: Protocol | str, dataset_name: str, img_size: int) -> TrainTransform:
    """The per-image training transform of `protocol` (a Protocol or its name) for a data set."""
    protocol = Protocol.from_name(protocol) if isinstance(protocol, str) else protocol
    strong = augmentation_for(dataset_name, img_size) if protocol.autoaugment else None
    return TrainTransform(img_size, strong=strong)


def eval_transform(dataset_name: str, img_size: int) -> EvalTransform:
    return EvalTransform(img_size)


# -- batch-level: targets, CutMix, normalisation --------------------------------------------------


def soft_targets(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """labels int64 (B,) -> one-hot float (B, C)."""
    return F.one_hot(labels, num_classes).float()


def cutmix_box(
    height: int, width: int, lam: float, generator: torch.Generator | None = None
) -> tuple[int, int, int, int]:
    """CutMix's box (Yun et al. 2019; timm's rand_bbox): side ratio sqrt(1 - lam), centre uniform
    over the image, clipped to it. Returns (top, bottom, left, right), half-open."""
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy = int(torch.randint(height, (), generator=generator))
    cx = int(torch.randint(width, (), generator=generator))
    top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
    left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
    return top, bottom, left, right


def cutmix_batch(
    images: torch.Tensor,
    targets: torch.Tensor,
    num_classes: int | None = None,
    generator: torch.Generator | None = None,
    *,
    beta: float = CUTMIX_BETA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CutMix on a batch: each image b gets one box pasted from image perm[b].

    images: (B, 3, S, S), any dtype and device (uint8 before `normalize` is cheapest).
    targets: labels int64 (B,) (then `num_classes` is needed) or soft targets (B, C).
    Returns new images and soft targets (B, C) = (1 - a) t_b + a t_perm[b], with a the
    pasted area / image area after clipping, so each row still sums to 1. The
    random draws (lambda ~ Beta(beta, beta), box, permutation) come from `generator`
    (a CPU generator; the permutation is moved to the images' device).
    """
    if targets.dim() == 1:
        if num_classes is None:
            raise ValueError("cutmix_batch got integer labels: pass num_classes (or soft targets (B, C))")
        targets = soft_targets(targets, num_classes)
    batch, _, height, width = images.shape
    if beta == 1.0:  # Beta(1, 1) is uniform: no need to leave torch's generator
        lam = float(torch.rand((), generator=generator))
    else:
        lam = float(np.random.default_rng(int(torch.randint(2**62, (), generator=generator))).beta(beta, beta))
    top, bottom, left, right = cutmix_box(height, width, lam, generator)
    perm = to_device(torch.randperm(batch, generator=generator), images.device)
    mixed = images.clone()
    mixed[:, :, top:bottom, left:right] = images[perm, :, top:bottom, left:right]
    area = (bottom - top) * (right - left) / (height * width)
    return mixed, targets * (1.0 - area) + targets[perm.to(targets.device)] * area


def _pixel_stats(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> torch.Tensor:
    # (2, 3, 1, 1): mean and std on the 0-255 scale; built once per device (`device_constant`).
    stats = torch.tensor([mean, std], dtype=torch.float32).mul(255).view(2, 3, 1, 1)
    return to_device(stats, device)


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 (B, 3, S, S) or (3, S, S) -> float32 (x / 255 - mean) / std, on the images' device."""
    mean, std = tuple(map(float, mean)), tuple(map(float, std))
    m, s = device_constant(("pixel_stats", mean, std, images.device),
                           lambda: _pixel_stats(mean, std, images.device)).unbind(0)
    return images.float().sub_(m).div_(s)


def prepare_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    protocol: Protocol,
    num_classes: int,
    mean: Sequence[float],
    std: Sequence[float],
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-batch half of a protocol: soft targets, CutMix when on, normalisation.
    uint8 (B, 3, S, S), int64 (B,) -> float (B, 3, S, S), soft targets (B, C)."""
    targets = soft_targets(labels, num_classes)
    if protocol.cutmix:
        images, targets = cutmix_batch(images, targets, generator=generator)
    return normalize(images, mean, std), targets


# -- DataLoader plumbing -----------------------------------------------------------------------


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed per (seed, epoch, index) (splitmix64 finaliser over the three)."""
    x = 0
    for v in (seed, epoch, index):
        x = (x ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 30
        x = x * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 27
        x = x * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x >> 1


class Augmented(Dataset):
    """`split` with a per-image `transform(image, generator)` applied: (uint8 (3, S, S), int).

    Keys: an int index (draws from the global RNG, as torchvision does: reproducible
    per process given torch.manual_seed / DataLoader worker seeding), or an
    (index, seed) pair from `SeededSampler` (draws from a generator seeded with it:
    reproducible whatever the workers)."""

    def __init__(self, split: Dataset, transform: Callable[..., torch.Tensor]):
        self.split, self.transform = split, transform
        self._generator: torch.Generator | None = None

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        if isinstance(key, tuple):
            index, seed = key
            if self._generator is None:  # one per process (workers get a pickled copy without it)
                self._generator = torch.Generator()
            image, label = self.split[index]
            return self.transform(image, self._generator.manual_seed(seed)), label
        image, label = self.split[key]
        return self.transform(image), label

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_generator": None}


class SeededSampler(Sampler):
    """Shuffles per epoch from (seed, epoch) and yields (index, item_seed(seed, epoch, index)).

    With `Augmented` every image's augmentation depends only on (seed, epoch, index),
    not on worker count, worker seeds or resumption. Call `set_epoch(epoch)` before
    each epoch (it lives in the main process, so it works with persistent workers).
    num_replicas/rank shard each epoch's order like DistributedSampler (padding by
    repetition so every rank gets the same count, or dropping the tail).
    """

    def __init__(self, length: int, *, seed: int, shuffle: bool = True, num_replicas: int = 1, rank: int = 0,
                 drop_last: bool = False):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must lie in [0, num_replicas={num_replicas}), got {rank}")
        self.length, self.seed, self.shuffle = length, seed, shuffle
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.drop_last:
            return self.length // self.num_replicas
        return -(-self.length // self.num_replicas)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = epoch_order(self.length, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle,
                            num_replicas=self.num_replicas, rank=self.rank, drop_last=self.drop_last)
        for index in order.tolist():
            yield index, item_seed(self.seed, self.epoch, index)


def epoch_order(length: int, *, seed: int, epoch: int, shuffle: bool = True, num_replicas: int = 1, rank: int = 0,
                drop_last: bool = False) -> torch.Tensor:
    """This rank's image indices of `epoch`, int64: the shuffle from (seed, epoch), sharded like
    DistributedSampler (padded by repetition so every rank gets the same count, or the tail dropped)."""
    if shuffle:
        g = torch.Generator().manual_seed(item_seed(seed, epoch, -1))
        order = torch.randperm(length, generator=g)
    else:
        order = torch.arange(length)
    per_rank = length // num_replicas if drop_last else -(-length // num_replicas)
    total = per_rank * num_replicas
    if total > length:
        order = order.repeat(1 + total // max(length, 1))
    return order[:total][rank::num_replicas]
