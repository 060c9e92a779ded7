"""Study L's training protocols: the switches, CutMix, label smoothing, soft targets.

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
its own 63-bit key (`augment.item_keys`), so an image's augmentation is the same whatever the number of
workers and after a resume.
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

# Every protocol by its name (the vocabulary's, aliases too), in the report's order.
PROTOCOLS: dict[str, Protocol] = {name: Protocol.from_name(name) for name in vocab.PROTOCOLS}


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

