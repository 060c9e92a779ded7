"""Batched training augmentation with per-image randomness: draw on the host, apply on the device.

    spec = augmentation("autoaugment+cutmix", "cifar100", 32)    # what a protocol does to one image
    keys = item_keys(seed, epoch, indices)                     # uint64 (n,): one key per (seed, epoch, index)
    params = draw(spec, keys)                                  # small host arrays: offsets, flips, sub-policies ...
    out = apply(spec, images, params)                          # uint8 (n, 3, S, S) on any device -> same

Every random choice is made per image from its own key, as torchvision's transforms make it for one
image (its per-image pipeline is the reference): crop offsets and flip, AutoAugment's sub-policy, each op's
apply flag and sign, ColorJitter's three factors and their order. A key depends only on (seed, epoch,
image index), so the draws do not depend on batch size, chunking, DDP ranks or resumption; a draw is a
counter-based hash of the key (splitmix64), so a chunk of 1,024 images takes a few vectorised numpy calls.

`apply` sorts the chunk by what happens to each image (one host-to-device copy, no device-to-host sync)
and calls one `torchvision.transforms.v2.functional` kernel per group of images sharing (op, magnitude,
sign): 40-60 groups per chunk of `CHUNK_IMAGES` for AutoAugment, so a kernel call's fixed 0.1-0.3 ms is
paid per group, not per image. Against torchvision's per-image path for the same draws
(tests/test_augment.py): crop, flip and AutoAugment bit-exact (same kernels); ColorJitter (per-image
factors cannot be grouped: broadcast kernels written like torchvision's) brightness exact, contrast and
saturation within one intensity level (float rounding of the blend); the random resized crop (from
LARGE_IMAGE_SIZE, per image at native size at decode time, torchvision's `resized_crop`) bit-exact on
the CPU, within a few levels on CUDA (antialiased resize; bench/gpu_suite.py measures it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import v2
from torchvision.transforms.v2.functional._geometry import _get_inverse_affine_matrix

from trainables.data.images import device_constant, normalize, to_device
from trainables.data.protocols import COLOR_JITTER, augmentation_for
from trainables.config.data_roots import LARGE_IMAGE_SIZE
from trainables.config.switches import Protocol

CHUNK_IMAGES = 1024  # images per `apply` call in the training loop: per-call costs dominate below ~1,000
RESIZED_CROP_SCALE = (0.08, 1.0)  # torchvision's RandomResizedCrop defaults (ImageNet practice)
RESIZED_CROP_RATIO = (3 / 4, 4 / 3)
STRONG = (None, "color_jitter", "autoaugment_cifar10", "autoaugment_imagenet")

# Draw slots: each kind of draw reads its own counters of an image's key, so adding one never shifts another.
_CROP, _FLIP, _POLICY, _APPLY, _SIGN, _JITTER, _ORDER, _RRC_TRY, _RRC_AT = range(9)


@dataclass(frozen=True)
class Augmentation:
    """What a protocol does to one training image of side `img_size`. Below LARGE_IMAGE_SIZE: zero-pad
    `img_size // 8` and crop back (every offset equally likely), flip with p = 0.5, then `strong` (one of
    STRONG). From it: random resized crop per image at decode time (`resized_crop`), then flip and
    `strong` batched."""

    img_size: int
    strong: str | None = None
    crop_padding: int = 0  # zero padding of the crop below LARGE_IMAGE_SIZE; 0: img_size // 8

    def __post_init__(self) -> None:
        if self.strong not in STRONG:
            raise ValueError(f"unknown strong augmentation {self.strong!r}; valid: {list(STRONG)}")

    @property
    def padding(self) -> int:
        return self.crop_padding or self.img_size // 8

    @property
    def resized_crop(self) -> bool:
        return self.img_size >= LARGE_IMAGE_SIZE


def augmentation(protocol: Protocol | str, dataset_name: str, img_size: int, crop_padding: int = 0) -> Augmentation:
    """What `protocol` does to a `dataset_name` training image of side `img_size`, batched (torchvision's
    per-image transforms are the reference); crop_padding: the run config's (0: img_size // 8)."""
    protocol = Protocol.from_name(protocol) if isinstance(protocol, str) else protocol
    strong = augmentation_for(dataset_name, img_size) if protocol.autoaugment else None
    return Augmentation(img_size, strong, crop_padding)


# -- keys and uniform draws --------------------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser on uint64 arrays (wrapping arithmetic is the point).
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def item_keys(seed, epoch, index) -> np.ndarray:
    """A well-mixed 63-bit key per (seed, epoch, index) (splitmix64's finaliser over the three), as uint64,
    broadcasting seed, epoch and index (ints or integer arrays). Fixed: data orders and resumes depend on it."""
    x = np.zeros(np.broadcast(np.asarray(seed), np.asarray(epoch), np.asarray(index)).shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for v in (seed, epoch, index):
            v = np.asarray(v, dtype=np.int64).astype(np.uint64)  # two's complement, like `v & 2**64 - 1`
            x = _mix((x ^ v) * np.uint64(0x9E3779B97F4A7C15))
    return x >> np.uint64(1)


def uniforms(keys: np.ndarray, slot: int, count: int = 1) -> np.ndarray:
    """float64 (n, count) in [0, 1), independent per (key, slot, j): a hash of the counter."""
    counters = np.uint64(slot * 64 + 1) + np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = _mix(keys.astype(np.uint64)[:, None] ^ (counters * np.uint64(0x9E3779B97F4A7C15)))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


# -- draws -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draws:
    """Per-image parameters of one chunk (host numpy arrays, n images). top, left: int64 (n,), crop
    offsets into the zero-padded image, in [0, 2 * padding]; flip: bool (n,); policy: int64 (n,),
    AutoAugment sub-policy; applied, negative: bool (n, 2), each op's apply flag and sign; factors:
    float32 (n, 3), ColorJitter's brightness, contrast, saturation factors; order: int64 (n, 3), their order."""

    top: np.ndarray
    left: np.ndarray
    flip: np.ndarray
    policy: np.ndarray
    applied: np.ndarray
    negative: np.ndarray
    factors: np.ndarray
    order: np.ndarray

    def __len__(self) -> int:
        return len(self.flip)


def draw(spec: Augmentation, keys: np.ndarray) -> Draws:
    """Every random parameter of `spec` for the images with these keys (see `item_keys`)."""
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    n, span = len(keys), 2 * spec.padding + 1
    offsets = (uniforms(keys, _CROP, 2) * span).astype(np.int64)
    flip = uniforms(keys, _FLIP)[:, 0] < 0.5
    policy = np.zeros(n, dtype=np.int64)
    applied = negative = np.zeros((n, 2), dtype=bool)
    if spec.strong and spec.strong.startswith("autoaugment"):
        table = _policy_table(spec.strong)
        policy = (uniforms(keys, _POLICY)[:, 0] * len(table.probability)).astype(np.int64)
        applied = uniforms(keys, _APPLY, 2) < table.probability[policy]  # torchvision: rand <= p
        negative = uniforms(keys, _SIGN, 2) < 0.5
    factors, order = np.ones((n, 3), dtype=np.float32), np.tile(np.arange(3), (n, 1))
    if spec.strong == "color_jitter":
        low, high = max(0.0, 1 - COLOR_JITTER), 1 + COLOR_JITTER
        factors = (low + (high - low) * uniforms(keys, _JITTER, 3)).astype(np.float32)
        order = np.argsort(uniforms(keys, _ORDER, 3), axis=1)  # a uniform random order of the three ops
    return Draws(offsets[:, 0], offsets[:, 1], flip, policy, applied, negative, factors, order)


# -- apply -------------------------------------------------------------------------------------


def apply(spec: Augmentation, images: torch.Tensor, params: Draws, rows: np.ndarray | None = None) -> torch.Tensor:
    """uint8 (n, 3, S, S) on any device -> uint8 (n, 3, S, S): crop + flip (or flip alone after a resized
    crop), then the strong augmentation, each image with its own draws. rows: int64 (n,), optional:
    `images` is then a whole split (N, 3, S, S) and image k of the result is row rows[k] of it (the
    batch's indexing fused into the crop's copy)."""
    n = len(params)
    if images.dtype != torch.uint8 or images.dim() != 4 or (rows is None and images.shape[0] != n) or \
            (rows is not None and len(rows) != n):
        raise ValueError(f"expected uint8 ({n}, 3, S, S) images (or a split and {n} rows), "
                         f"got {images.dtype} {tuple(images.shape)}")
    if spec.resized_crop:
        if rows is not None:
            images = images[to_device(torch.from_numpy(np.asarray(rows, dtype=np.int64)), images.device)]
        flip = to_device(torch.from_numpy(params.flip), images.device)
        images = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
    else:
        images = crop_flip(images, params, spec.padding, rows)
    if spec.strong == "color_jitter":
        return color_jitter(images, params)
    if spec.strong is not None:
        return autoaugment(images, params, spec.strong)
    return images


def crop_flip(images: torch.Tensor, params: Draws, padding: int, rows: np.ndarray | None = None) -> torch.Tensor:
    """Zero-pad by `padding`, crop back at (top, left), flip; `rows` as in `apply`.

    Written as whole-row copies, since a per-pixel gather costs ~3x more on a CPU core: one index_select
    of image rows does the batch indexing and the vertical shift and sorts the chunk by (left, flip), and
    zeroes the rows that fall into the padding; one slice copy per (left, flip) group (at most 2 (2p + 1))
    does the horizontal shift and flip; one index_select restores the order. flip(crop at dx) equals the
    crop at -dx of the flipped image."""
    n, S = len(params), images.shape[-1]
    device = images.device
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    code = params.left * 2 + params.flip
    order = np.argsort(code, kind="stable")
    top = params.top[order]
    # Output rows that fall into the zero padding, as row numbers of `shifted` below (few: |dy| per image).
    source_y = top[:, None] - padding + np.arange(S)  # (n, S)
    k, y = np.nonzero((source_y < 0) | (source_y >= S))
    blank = ((k[:, None] * 3 + np.arange(3)) * S + y[:, None]).reshape(-1)
    host = torch.from_numpy(np.stack([rows[order], top, np.argsort(order)]))
    index, top_d, inverse = to_device(host, device).unbind(0)
    lines = (index[:, None, None] * 3 + torch.arange(3, device=device)[None, :, None]) * S
    lines = lines + (top_d[:, None] - padding + torch.arange(S, device=device)).clamp(0, S - 1)[:, None, :]
    shifted = images.contiguous().view(-1, S).index_select(0, lines.flatten())  # (n * 3 * S, S) image rows
    if len(blank):
        shifted.index_fill_(0, to_device(torch.from_numpy(blank), device), 0)
    shifted = shifted.view(n, 3, S, S)
    out = torch.empty_like(shifted)
    values, starts = np.unique(code[order], return_index=True)
    for value, a, b in zip(values.tolist(), starts.tolist(), np.append(starts[1:], n).tolist()):
        flip, dx = value % 2, value // 2 - padding
        source = shifted[a:b].flip(-1) if flip else shifted[a:b]
        dx = -dx if flip else dx
        out[a:b, :, :, max(0, -dx):S - max(0, dx)] = source[:, :, :, max(0, dx):S - max(0, -dx)]
        out[a:b, :, :, :max(0, -dx)] = 0  # the zero padding the shift uncovers (one side only)
        out[a:b, :, :, S - max(0, dx):] = 0
    return out.view(n, -1).index_select(0, inverse).view(n, 3, S, S)


@dataclass(frozen=True)
class _PolicyTable:
    ops: tuple[tuple[tuple[str, int | None], ...], ...]  # [policy][stage] -> (op, magnitude bin)
    probability: np.ndarray  # float64 (policies, 2)


@functools.cache
def _policy_table(strong: str) -> _PolicyTable:
    # The policies as torchvision defines them (its private `_policies`): the reference is its own.
    name = {"autoaugment_cifar10": v2.AutoAugmentPolicy.CIFAR10, "autoaugment_imagenet": v2.AutoAugmentPolicy.IMAGENET}
    policies = v2.AutoAugment(name[strong])._policies
    ops = tuple(tuple((op, bin_) for op, _, bin_ in sub) for sub in policies)
    return _PolicyTable(ops, np.array([[p for _, p, _ in sub] for sub in policies], dtype=np.float64))


@functools.cache
def _stage_codes(strong: str, height: int, width: int) -> tuple[np.ndarray, tuple[tuple[str, float], ...]]:
    """codes int64 (2 stages, policies, 2 signs) -> index into groups: (op, signed magnitude).
    Images of different sub-policies with the same op and magnitude share a group."""
    space = v2.AutoAugment._AUGMENTATION_SPACE
    table = _policy_table(strong)
    groups: dict[tuple[str, float], int] = {}
    codes = np.zeros((2, len(table.ops), 2), dtype=np.int64)
    for q, sub in enumerate(table.ops):
        for stage, (op, bin_) in enumerate(sub):
            magnitudes_fn, signed = space[op]
            magnitudes = magnitudes_fn(10, height, width)
            for negative in (0, 1):
                magnitude = 0.0 if magnitudes is None else float(magnitudes[bin_])
                if signed and negative:
                    magnitude *= -1
                codes[stage, q, negative] = groups.setdefault((op, magnitude), len(groups))
    return codes, tuple(groups)


def autoaugment_op(images: torch.Tensor, op: str, magnitude: float) -> torch.Tensor:
    """One AutoAugment op on a batch, as torchvision's AutoAugment applies it to one image (nearest
    interpolation, zero fill, shear about the corner). Geometric ops and sharpness run torchvision's
    arithmetic, op for op (its `affine_image`, `rotate_image`, `adjust_sharpness_image`), with one change:
    their matrices and kernel come from tensors already on the device, made once per (op, magnitude,
    size, device) (`device_constant`), where torchvision builds them with `torch.tensor(..., device=...)`
    per call: a blocking copy from pageable memory, i.e. a host sync per group per chunk on CUDA."""
    if op in _GEOMETRIC:
        h, w = images.shape[-2:]
        if op == "Rotate" and magnitude % 360 in (0, 90, 180, 270):  # torchvision's fast paths
            return TF.rotate(images, angle=magnitude)
        grid = device_constant(("autoaugment_grid", op, magnitude, h, w, images.device),
                               lambda: _sampling_grid(op, magnitude, h, w, images.device))
        return _grid_sample(images, grid)
    kernels = {
        "Brightness": lambda x: TF.adjust_brightness(x, 1.0 + magnitude),
        "Color": lambda x: TF.adjust_saturation(x, 1.0 + magnitude),
        "Contrast": lambda x: TF.adjust_contrast(x, 1.0 + magnitude),
        "Sharpness": lambda x: _sharpness(x, 1.0 + magnitude),
        "Posterize": lambda x: TF.posterize(x, int(magnitude)),
        "Solarize": lambda x: TF.solarize(x, 255.0 * magnitude),
        "AutoContrast": TF.autocontrast,
        "Equalize": TF.equalize,
        "Invert": TF.invert,
    }
    return kernels[op](images)


_GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


def _inverse_matrix(op: str, magnitude: float, h: int, w: int) -> list[float]:
    """The inverse affine matrix torchvision's AutoAugment uses for `op` (as TF.affine / TF.rotate
    compute it for these arguments; its `_get_inverse_affine_matrix`, so the numbers are its own)."""
    if op in ("ShearX", "ShearY"):  # TF.affine(..., center=[0, 0]): the corner, in centred coordinates
        shear = math.degrees(math.atan(magnitude))
        return _get_inverse_affine_matrix([-0.5 * w, -0.5 * h], 0.0, [0.0, 0.0], 1.0,
                                          [shear, 0.0] if op == "ShearX" else [0.0, shear])
    if op in ("TranslateX", "TranslateY"):
        shift = [float(int(magnitude)), 0.0] if op == "TranslateX" else [0.0, float(int(magnitude))]
        return _get_inverse_affine_matrix([0.0, 0.0], 0.0, shift, 1.0, [0.0, 0.0])
    return _get_inverse_affine_matrix([0.0, 0.0], -(magnitude % 360), [0.0, 0.0], 1.0, [0.0, 0.0])  # Rotate


def _sampling_grid(op: str, magnitude: float, h: int, w: int, device: torch.device) -> torch.Tensor:
    """float32 (1, h, w, 2): torchvision's `_affine_grid` for the op, its theta and divisor sent in
    one pinned, non-blocking copy (torchvision makes both with torch.tensor(..., device=...))."""
    host = torch.tensor([*_inverse_matrix(op, magnitude, h, w), 0.5 * w, 0.5 * h], dtype=torch.float32)
    values = to_device(host, device)
    theta, divisor = values[:6].reshape(1, 2, 3), values[6:]
    base_grid = torch.empty(1, h, w, 3, dtype=torch.float32, device=device)
    base_grid[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device))
    base_grid[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=device).unsqueeze_(-1))
    base_grid[..., 2].fill_(1)
    rescaled_theta = theta.transpose(1, 2).div_(divisor)
    return base_grid.view(1, h * w, 3).bmm(rescaled_theta).view(1, h, w, 2)


def _grid_sample(images: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    # torchvision's `_apply_grid_transform` for uint8 images, nearest, fill None (AutoAugment's).
    n = images.shape[0]
    out = F.grid_sample(images.to(grid.dtype), grid.expand(n, -1, -1, -1) if n > 1 else grid, mode="nearest",
                        padding_mode="zeros", align_corners=False)
    return out.round_().to(images.dtype)


def _sharpness(images: torch.Tensor, factor: float) -> torch.Tensor:
    """torchvision's `adjust_sharpness_image` for uint8 (n, 3, h, w), its 3x3 kernel on the device once."""
    if images.numel() == 0 or images.shape[-2] <= 2 or images.shape[-1] <= 2:
        return images
    kernel = device_constant(("sharpness_kernel", images.device), lambda: to_device(
        torch.tensor([[1 / 13, 1 / 13, 1 / 13], [1 / 13, 5 / 13, 1 / 13], [1 / 13, 1 / 13, 1 / 13]],
                     dtype=torch.float32), images.device))
    output = images.to(dtype=torch.float32, copy=True)
    blurred = F.conv2d(output, kernel.expand(3, 1, 3, 3), groups=3).round_()
    view = output[..., 1:-1, 1:-1]
    view.add_(blurred.sub_(view), alpha=(1.0 - factor))
    return output.clamp_(0, 255).to(images.dtype)


def autoaugment(images: torch.Tensor, params: Draws, strong: str) -> torch.Tensor:
    """Each image's sub-policy, op by op: images sharing (op, magnitude, sign) in one kernel call."""
    codes, groups = _stage_codes(strong, *images.shape[-2:])
    stages = []
    for stage in (0, 1):
        code = codes[stage, params.policy, params.negative[:, stage].astype(np.int64)]
        stages.append(np.where(params.applied[:, stage], code, -1))
    return _grouped(images, stages, lambda stage, code, x, _: autoaugment_op(x, *groups[code]))


def color_jitter(images: torch.Tensor, params: Draws) -> torch.Tensor:
    """ColorJitter(0.4, 0.4, 0.4) with per-image factors and per-image op order."""
    factors = to_device(torch.from_numpy(params.factors), images.device)
    kernels = (_brightness, _contrast, _saturation)
    stages = [params.order[:, k] for k in range(3)]
    return _grouped(images, stages, lambda stage, op, x, f: kernels[op](x, f[:, op].view(-1, 1, 1, 1)), factors)


# Broadcast versions of torchvision's uint8 colour kernels (functional/_color.py): factor (n, 1, 1, 1).
def _blend(image: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    return image.mul(ratio).add_(other * (1.0 - ratio)).clamp_(0, 255).to(torch.uint8)


def _gray_floor(image: torch.Tensor) -> torch.Tensor:
    r, g, b = image.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3).floor_()


def _brightness(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return image.mul(factor).clamp_(0, 255).to(torch.uint8)


def _contrast(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(image, _gray_floor(image).mean(dim=(-3, -2, -1), keepdim=True), factor)


def _saturation(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(image, _gray_floor(image), factor)


def _grouped(images: torch.Tensor, stages: list[np.ndarray], kernel, extra: torch.Tensor | None = None) -> torch.Tensor:
    """Apply `kernel(stage, code, images_of_group, extra_of_group)` to each group of images with the same
    code, stage after stage (code -1: leave the image as is). Each stage's rows sorted by code (computed
    on the host) travel to the device in one copy; a group is then a slice of that index, read and
    written back with index_select / index_copy_, so untouched images are never moved."""
    orders = [np.argsort(codes, kind="stable") for codes in stages]
    rows = to_device(torch.from_numpy(np.stack(orders)), images.device)
    x = images.clone()
    for stage, (codes, order) in enumerate(zip(stages, orders)):
        values, starts = np.unique(codes[order], return_index=True)
        ends = np.append(starts[1:], len(order))
        for code, a, b in zip(values.tolist(), starts.tolist(), ends.tolist()):
            if code >= 0:
                group = rows[stage, a:b]
                part = extra.index_select(0, group) if extra is not None else None
                x.index_copy_(0, group, kernel(stage, code, x.index_select(0, group), part))
    return x


# -- random resized crop (per image, at decode time) -------------------------------------------


def resized_crop_params(keys: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """torchvision's RandomResizedCrop parameters (scale 0.08-1, ratio 3/4-4/3, 10 tries, then the centre
    crop), per image from its key: int64 (n, 4) = top, left, height, width."""
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    heights, widths = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
    tries = uniforms(keys, _RRC_TRY, 20).reshape(-1, 10, 2)
    area = (heights * widths)[:, None] * (RESIZED_CROP_SCALE[0]
                                          + (RESIZED_CROP_SCALE[1] - RESIZED_CROP_SCALE[0]) * tries[..., 0])
    log_lo, log_hi = math.log(RESIZED_CROP_RATIO[0]), math.log(RESIZED_CROP_RATIO[1])
    ratio = np.exp(log_lo + (log_hi - log_lo) * tries[..., 1])
    w = np.round(np.sqrt(area * ratio)).astype(np.int64)
    h = np.round(np.sqrt(area / ratio)).astype(np.int64)
    ok = (w > 0) & (w <= widths[:, None]) & (h > 0) & (h <= heights[:, None])
    first = ok.argmax(1)
    rows = np.arange(len(keys))
    h, w, found = h[rows, first], w[rows, first], ok.any(1)
    # The fallback: the largest centred crop whose aspect ratio lies in the range.
    in_ratio = widths / heights
    fw = np.where(in_ratio < RESIZED_CROP_RATIO[0], widths,
                  np.where(in_ratio > RESIZED_CROP_RATIO[1], np.round(heights * RESIZED_CROP_RATIO[1]), widths))
    fh = np.where(in_ratio < RESIZED_CROP_RATIO[0], np.round(widths / RESIZED_CROP_RATIO[0]), heights)
    h, w = np.where(found, h, fh).astype(np.int64), np.where(found, w, fw).astype(np.int64)
    at = uniforms(keys, _RRC_AT, 2)
    top = np.where(found, (at[:, 0] * (heights - h + 1)).astype(np.int64), (heights - h) // 2)
    left = np.where(found, (at[:, 1] * (widths - w + 1)).astype(np.int64), (widths - w) // 2)
    return np.stack([top, left, h, w], 1)


def resized_crop(image: torch.Tensor, box, img_size: int) -> torch.Tensor:
    """uint8 (3, h, w) -> uint8 (3, S, S): torchvision's kernel as RandomResizedCrop calls it."""
    top, left, height, width = (int(v) for v in box)
    return TF.resized_crop(image, top, left, height, width, [img_size, img_size], antialias=True)


# -- a pack's step: CutMix, normalisation and RPT over every member at once ---------------------


@dataclass(frozen=True)
class StepDraws:
    """One member's host draws for one step, as its lone trial makes them. box: CutMix's (top, bottom,
    left, right), half-open, or None (no CutMix this step); partner: int64 (B,), image b receives image
    partner[b]'s box (`protocols.cutmix_draw`); perm: the RPT permutation, int64 (N,) or (B, N), or None."""

    box: tuple[int, int, int, int] | None = None
    partner: torch.Tensor | None = None
    perm: torch.Tensor | None = None


def step_batch(batches, draws, *, num_classes: int, mean, std):
    """A pack's step input from each member's batch and draws: batches, K pairs of uint8 images
    (B, 3, S, S) and labels (B,) on the device; draws, K `StepDraws` -> normalised images float32
    (K, B, 3, S, S), soft targets (K, B, C), and the permutations as `PackedViT` takes them: for K = 1
    the member's own in a list (the plain module's `perm`), else (K, B, N) (the identity for members
    without RPT), or None when no member permutes.

    Member k's slice is its lone step bit for bit (CutMix on its batch alone with its `cutmix_draw`,
    then `images.normalize`), with device work that does not grow with K: the host's
    numbers (CutMix partners, box rows and columns, target weights, permutations) travel in one copy,
    CutMix is one gather and one masked blend over the pack (a member not mixing this step has an empty
    box and target weights (1, 0): itself), normalisation one call."""
    k = len(batches)
    if len(draws) != k:
        raise ValueError(f"step_batch got {k} member batches and {len(draws)} draws")
    images = batches[0][0].unsqueeze(0) if k == 1 else torch.stack([b[0] for b in batches])
    labels = batches[0][1].unsqueeze(0) if k == 1 else torch.stack([b[1] for b in batches])
    _, batch, _, height, width = images.shape
    mixing = any(d.box is not None for d in draws)
    perms = [d.perm for d in draws]
    permuting = any(p is not None for p in perms)
    parts: list[np.ndarray] = []  # int64 host pieces of the one copy (numpy: no dispatch per piece)
    if mixing:
        boxes = np.array([d.box or (0, 0, 0, 0) for d in draws], dtype=np.int64)  # (K, 4): empty if not mixing
        own = np.arange(batch)
        partner = np.stack([own if d.box is None else d.partner.numpy() for d in draws])
        parts.append(partner + np.arange(k)[:, None] * batch)  # rows of the pack's (K * B) images
        y, x = np.arange(height), np.arange(width)
        parts.append((y >= boxes[:, :1]) & (y < boxes[:, 1:2]))
        parts.append((x >= boxes[:, 2:3]) & (x < boxes[:, 3:]))
        # (1 - a, a) as the lone step's Python floats (float64), sent as their bits: one copy in all.
        areas = [(bottom - top) * (right - left) / (height * width) for top, bottom, left, right in boxes.tolist()]
        parts.append(np.array([(1.0 - a, a) for a in areas], dtype=np.float64).view(np.int64))
    if permuting:
        n = next(p for p in perms if p is not None).shape[-1]
        parts.append(perms[0].numpy() if k == 1 else np.stack([
            np.broadcast_to(np.arange(n) if p is None else p.numpy(), (batch, n)) for p in perms]))
    device_parts = []
    if parts:
        host = torch.from_numpy(np.concatenate([p.reshape(-1) for p in parts]).astype(np.int64, copy=False))
        device_parts = list(to_device(host, images.device).split([p.size for p in parts]))
    target = F.one_hot(labels, num_classes).float()  # protocols.soft_targets
    if mixing:
        partner, rows, cols, weights = device_parts[:4]
        inside = torch.logical_and(rows.view(k, 1, 1, height, 1), cols.view(k, 1, 1, 1, width))
        pasted = images.flatten(0, 1).index_select(0, partner).view_as(images)
        # The box from the partner: wrapping uint8 arithmetic, exact, and 8x cheaper than torch.where on
        # a CPU core (not vectorised there); on a GPU two more launches per step, whatever K.
        images = (pasted - images).mul_(inside).add_(images)
        weights = weights.view(torch.float64).float().view(k, 2, 1, 1)
        swapped = target.flatten(0, 1).index_select(0, partner).view_as(target)
        target = target * weights[:, 0] + swapped * weights[:, 1]
    if permuting:
        perm = device_parts[-1]
        perm = [perm.view(perms[0].shape)] if k == 1 else perm.view(k, batch, -1)
    else:
        perm = [None] if k == 1 else None
    return normalize(images, mean, std), target, perm
