"""Study L's training protocols: the switches, CutMix, label smoothing, soft targets, the epoch's order.

A protocol is three switches (Study L, arXiv 2605.16390; recipe of Lee et al. 2021, "Vision Transformer
for Small-Size Datasets"), written torch-free in trainables/config/switches.py (`Protocol`, `LABEL_SMOOTHING`):

* baseline, always on: random crop (zero padding img_size // 8: 4 px at 32 px, 8 px at 64 px) +
  horizontal flip; from `LARGE_IMAGE_SIZE` (224 px) a random resized crop of the full image (scale
  0.08-1, ImageNet practice) + flip;
* `autoaugment`: torchvision's AutoAugment, CIFAR-10 policy below 128 px and ImageNet policy from it; on
  Tiny-ImageNet ColorJitter(0.4, 0.4, 0.4) instead, as Study L does (so this factor changes meaning
  across data sets);
* `cutmix`: CutMix (Yun et al. 2019), beta(1, 1), one box per batch (as in Lee et al.'s recipe), on a
  share `cutmix_prob` of the batches (run config, default 1; Lee et al. use 0.5); the box is pasted
  from a shuffled copy of the batch; targets mixed by the pasted area after clipping to the image, as
  soft targets (B, C);
* `label_smoothing`: 0.1, applied by the loss:
  `F.cross_entropy(logits, soft_targets, label_smoothing=protocol.smoothing)`.

Per batch, on the device (uint8 until the model; B batch, C classes, S image side): the augmented
images (trainables/data/augment.py: drawn per image on the host, applied batched; trainables/data/inputs.py) ->
soft targets, CutMix (drawn per member, `cutmix_draw`) and normalisation for a pack's members at once
(`augment.step_batch`) -> float (K, B, 3, S, S), (K, B, C). Every (seed, epoch, index) has
its own 63-bit key (`item_seed`), so an image's augmentation is the same whatever the number of workers
and after a resume; the epoch's order is `epoch_order`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from records import vocab
from trainables.config.data_roots import LARGE_IMAGE_SIZE
from trainables.config.switches import Protocol

CUTMIX_BETA = 1.0
COLOR_JITTER = 0.4  # brightness, contrast and saturation: Study L's AutoAugment stand-in on Tiny-ImageNet
COLOR_JITTER_DATASETS = ("tinyimagenet",)


# Every combination of the switches, and the aliases: the vocabulary's names, checked at import.
_ALL = [Protocol(aa, cm, ls) for aa in (False, True) for cm in (False, True) for ls in (False, True)]
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in _ALL} | {
    alias: Protocol.from_name(name) for alias, name in vocab.ALIASES.items()}
vocab.check_registry("trainables.data.protocols.PROTOCOLS", PROTOCOLS, vocab.PROTOCOLS, "PROTOCOLS")


# -- which strong augmentation ------------------------------------------------------------------


def augmentation_for(dataset_name: str, img_size: int) -> str:
    """Which strong augmentation `autoaugment` means here: "color_jitter" (Tiny-ImageNet, as in
    Study L), "autoaugment_imagenet" (from LARGE_IMAGE_SIZE) or "autoaugment_cifar10"."""
    if dataset_name in COLOR_JITTER_DATASETS:
        return "color_jitter"
    return "autoaugment_imagenet" if img_size >= LARGE_IMAGE_SIZE else "autoaugment_cifar10"


# -- batch-level: targets, CutMix, normalisation --------------------------------------------------


def soft_targets(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """labels int64 (B,) -> one-hot float (B, C)."""
    return F.one_hot(labels, num_classes).float()


def cutmix_box(height: int, width: int, lam: float,
               generator: torch.Generator | None = None) -> tuple[int, int, int, int]:
    """CutMix's box (Yun et al. 2019; timm's rand_bbox): side ratio sqrt(1 - lam), centre uniform
    over the image, clipped to it. Returns (top, bottom, left, right), half-open."""
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy = int(torch.randint(height, (), generator=generator))
    cx = int(torch.randint(width, (), generator=generator))
    top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
    left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
    return top, bottom, left, right


def cutmix_draw(batch: int, height: int, width: int, generator: torch.Generator | None = None, *,
                beta: float = CUTMIX_BETA) -> tuple[tuple[int, int, int, int], torch.Tensor]:
    """CutMix's draws for one batch, in this order: lambda ~ Beta(beta, beta), its box (`cutmix_box`),
    the partner of each image (int64 (B,) on the host: image b receives image partner[b]'s box)."""
    if beta == 1.0:  # Beta(1, 1) is uniform: no need to leave torch's generator
        lam = float(torch.rand((), generator=generator))
    else:
        lam = float(np.random.default_rng(int(torch.randint(2**62, (), generator=generator))).beta(beta, beta))
    return cutmix_box(height, width, lam, generator), torch.randperm(batch, generator=generator)


# -- per-image seeds and the epoch's order ---------------------------------------------------------


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
