"""The per-image reference pipeline: what the batched path (trainables/data/augment.py, trainables/data/inputs.py)
is checked and benchmarked against. Training does not use it; tests and bench/input_pipeline.py do,
and no product module imports it (tests/test_layout.py).

    data = Augmented(split, train_transform("cutmix", "cifar10", 32))   # (uint8 (3, S, S), int) per key
    sampler = SeededSampler(len(data), seed=0)                          # keys (index, item_seed)
    images, targets = prepare_batch(uint8_batch, labels, protocol, C, mean, std, generator)

Per-image randomness is deliberate: torchvision v2 transforms called on a batch tensor draw ONE
parameter set for the whole batch (every image gets the same crop, flip and AutoAugment op), so these
transforms only ever see one image, and augment.py draws per image too.

Seeding. A transform takes an optional `torch.Generator`: with one, every draw comes from it
(torchvision's own draws run under the default CPU generator seeded from it, which is restored
afterwards); without one, draws use torch's global RNG as torchvision does. `SeededSampler` +
`Augmented` give every (seed, epoch, index) its own generator (`item_seed`: splitmix64 one key at a
time in plain Python, the reference for `augment.item_keys`), so augmentations are the same for any
number of DataLoader workers, persistent or not, and after a resume. The epoch's order is
`inputs.epoch_order`, the device input path's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.utils.data import Dataset, Sampler
from torchvision.transforms import v2

from trainables.data.images import eval_view, normalize
from trainables.data.images import to_device
from trainables.data.inputs import epoch_order
from trainables.data.protocols import COLOR_JITTER, CUTMIX_BETA, augmentation_for, cutmix_draw, soft_targets
from trainables.config.data_roots import LARGE_IMAGE_SIZE
from trainables.config.switches import Protocol

# -- CutMix, one batch at a time ---------------------------------------------------------------------


def cutmix_batch(images: torch.Tensor, targets: torch.Tensor, num_classes: int | None = None,
                 generator: torch.Generator | None = None, *,
                 beta: float = CUTMIX_BETA) -> tuple[torch.Tensor, torch.Tensor]:
    """CutMix on a batch: each image b gets one box pasted from image perm[b].

    images: (B, 3, S, S), any dtype and device (uint8 before `normalize` is cheapest). targets: labels
    int64 (B,) (then `num_classes` is needed) or soft targets (B, C). Returns new images and soft targets
    (B, C) = (1 - a) t_b + a t_perm[b], with a the pasted area / image area after clipping, so each row
    still sums to 1. The random draws (`cutmix_draw`) come from `generator` (a CPU generator; the
    permutation is moved to the images' device); `augment.step_batch` applies them to a whole pack (checked
    against this)."""
    if targets.dim() == 1:
        if num_classes is None:
            raise ValueError("cutmix_batch got integer labels: pass num_classes (or soft targets (B, C))")
        targets = soft_targets(targets, num_classes)
    batch, _, height, width = images.shape
    (top, bottom, left, right), perm = cutmix_draw(batch, height, width, generator, beta=beta)
    perm = to_device(perm, images.device)
    mixed = images.clone()
    mixed[:, :, top:bottom, left:right] = images[perm, :, top:bottom, left:right]
    area = (bottom - top) * (right - left) / (height * width)
    return mixed, targets * (1.0 - area) + targets[perm.to(targets.device)] * area


# -- per-image transforms ------------------------------------------------------------------------


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
    else `images.eval_view` (from 128 px: squashed to img_size x img_size, Study P's code)."""

    def __init__(self, img_size: int):
        self.img_size = img_size

    def __call__(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return eval_view(image, self.img_size)

    def __repr__(self) -> str:
        return f"EvalTransform({self.img_size}px)"


def train_transform(protocol: Protocol | str, dataset_name: str, img_size: int) -> TrainTransform:
    """The per-image training transform of `protocol` (a Protocol or its name) for a data set."""
    protocol = Protocol.from_name(protocol) if isinstance(protocol, str) else protocol
    strong = augmentation_for(dataset_name, img_size) if protocol.autoaugment else None
    return TrainTransform(img_size, strong=strong)


def eval_transform(dataset_name: str, img_size: int) -> EvalTransform:
    return EvalTransform(img_size)


# -- the batch half of a protocol ----------------------------------------------------------------


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


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 63-bit seed per (seed, epoch, index) (splitmix64 finaliser over the three), one at a time."""
    x = 0
    for v in (seed, epoch, index):
        x = (x ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 30
        x = x * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 27
        x = x * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x >> 1


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
