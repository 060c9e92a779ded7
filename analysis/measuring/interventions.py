"""Named, parameterised inference-time interventions (STUDIES.md, Study P).

Each intervention acts in one of two places, and says which by what it returns:

- on the images, ``images(x)``: uint8 (B, 3, H, W) -> uint8 (B, 3, H, W), before normalisation
  (``jpeg``, ``blur``): the "content-destroying shifts" of the fragility score;
- on the model call, ``model_kwargs(...)`` -> kwargs for ``ViT.forward`` (``rpi`` -> ``perm``,
  ``pe_scale`` and ``rope_scale`` -> ``pe_scale``).

``pe_scale`` is Study P's PE scaling, defined for additive PEs only (a weaker position signal).
``rope_scale`` multiplies RoPE's rotation angles, which is position interpolation, not a weaker signal:
the logit at alpha 0.5 for offset (0, 2) equals the alpha 1 logit for offset (0, 1), and q/k norms do
not change. It is kept as its own intervention so it never lands on the axes or in the claims of Study
P's scaling.

``clean`` does neither. Interventions compose: a condition is a tuple of them, applied with
``apply_condition``. Make one from its class (``Jpeg(5)``, ``GaussianBlur(2.5, 5)``, ``PEScale(0.3)``,
``RandomPermutation(seed=0)``: one permutation per image; ``RandomPermutation(seed=0,
group=PAPER_RPI_BATCH)``: one per 1,000 images, the paper's batch); each class's ``name`` is its
measurements-table name. JPEG quality 5 and blur kernel 5 / sigma 2.5 are the
paper's headline shifts, set for 224 px images; at 32 px they are far harsher, hence the grids.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torchvision.io
import torchvision.transforms.v2.functional as TF

# The headline severities among these (JPEG q5, blur sigma 2.5): records.vocab.JPEG_HEADLINE / BLUR_HEADLINE.
JPEG_LEVELS = (5, 10, 20, 50, 75)  # quality
BLUR_KERNEL = 5
BLUR_LEVELS = (0.5, 1.0, 1.5, 2.0, 2.5)  # sigma, at kernel BLUR_KERNEL
ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))  # 0, 0.1, ..., 1.0
# Study P's evaluation batch (`prep_data.py`: val_batch_size = 1000), whose images share one RPI permutation
# (`ImagePatcher`: one `randperm` per forward pass): the images of the paper's estimator's permutation.
PAPER_RPI_BATCH = 1000


class Intervention:
    """Base: identity on images, no model kwargs. ``level`` is what the measurements table stores."""

    name: ClassVar[str]

    @property
    def level(self) -> float | None:
        return None

    def images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, 3, H, W) -> uint8 (B, 3, H, W)."""
        return images

    def model_kwargs(self, *, positions: range, num_patches: int, device: torch.device | str) -> dict[str, Any]:
        """Keyword arguments for ``ViT.forward`` on the batch of the evaluation set's images ``positions``."""
        return {}


def _check_uint8(images: torch.Tensor) -> None:
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(f"interventions act on uint8 (B, 3, H, W) images; got {images.dtype} {tuple(images.shape)}")


@dataclass(frozen=True)
class Clean(Intervention):
    name: ClassVar[str] = "clean"


@dataclass(frozen=True)
class Jpeg(Intervention):
    """JPEG round trip at ``quality`` (1..100), per image with libjpeg on the CPU, even for GPU batches:
    nvjpeg encodes slightly differently, and the same quality should mean the same pixels on every machine."""

    quality: int
    name: ClassVar[str] = "jpeg"

    def __post_init__(self):
        quality = self.quality
        if isinstance(quality, float) and quality.is_integer():  # levels come back from Parquet as float64
            quality = int(quality)
        if not isinstance(quality, (int, np.integer)) or isinstance(quality, bool) or not 1 <= quality <= 100:
            raise ValueError(f"jpeg quality {self.quality!r} must be an integer in 1..100; defaults: {JPEG_LEVELS}")
        object.__setattr__(self, "quality", int(quality))

    @property
    def level(self) -> float:
        return float(self.quality)

    def images(self, images: torch.Tensor) -> torch.Tensor:
        _check_uint8(images)
        with warnings.catch_warnings():
            # torchvision 0.29 deprecates its image codecs in favour of torchcodec, which this
            # environment does not ship; the codecs still work, and one warning per batch floods logs.
            warnings.filterwarnings("ignore", category=DeprecationWarning, module="torchvision.io")
            encoded = torchvision.io.encode_jpeg(list(images.cpu()), quality=self.quality)
            decoded = torchvision.io.decode_jpeg(encoded, mode=torchvision.io.ImageReadMode.RGB)
        return torch.stack(decoded).to(images.device)


@dataclass(frozen=True)
class GaussianBlur(Intervention):
    """Gaussian blur with a ``kernel`` x ``kernel`` window (odd) and standard deviation ``sigma`` (pixels)."""

    sigma: float
    kernel: int = BLUR_KERNEL
    name: ClassVar[str] = "blur"

    def __post_init__(self):
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"blur sigma {self.sigma!r} must be a positive number; defaults: {BLUR_LEVELS}")
        kernel = self.kernel
        if isinstance(kernel, float) and kernel.is_integer():
            kernel = int(kernel)
        if not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"blur kernel {self.kernel!r} must be a positive odd integer; default: {BLUR_KERNEL}")
        object.__setattr__(self, "sigma", float(self.sigma))
        object.__setattr__(self, "kernel", kernel)

    @property
    def level(self) -> float:
        return self.sigma

    def images(self, images: torch.Tensor) -> torch.Tensor:
        _check_uint8(images)
        return TF.gaussian_blur(images, kernel_size=[self.kernel, self.kernel], sigma=[self.sigma, self.sigma])


def rpi_permutation(seed: int, group: int, num_patches: int) -> torch.Tensor:
    """The permutation (N,) shared by the images of group ``group`` (the paper's estimator): a function
    of (seed, group index) only, so every model evaluated with the same seed sees the same token orders,
    whatever else ran before (no shared generator state)."""
    state = np.random.SeedSequence([seed, group]).generate_state(1, np.uint64)[0]
    return torch.randperm(num_patches, generator=torch.Generator().manual_seed(int(state)))


@functools.lru_cache(maxsize=4)  # the clean RPI pass and every alpha's ask for the same batch in turn
def rpi_image_permutations(seed: int, positions: range, num_patches: int) -> torch.Tensor:
    """One permutation per image (B, N): row ``b`` is a function of (seed, the image's position in the
    evaluation set) only, so an image gets the same token order at every batch size and evaluation size.
    Drawn from ``SeedSequence(seed, spawn_key=(image,))``, a stream apart from the per-batch ones."""
    rows = []
    for position in positions:
        state = np.random.SeedSequence(seed, spawn_key=(position,)).generate_state(1, np.uint64)[0]
        rows.append(torch.randperm(num_patches, generator=torch.Generator().manual_seed(int(state))))
    return torch.stack(rows)


@dataclass(frozen=True)
class RandomPermutation(Intervention):
    """RPI: seeded permutations of the patch tokens, passed as the model's ``perm``. ``group`` 1 (the
    default): one permutation per image, so the scrambled content averages out over the evaluation set and
    SSDC under RPI has one estimand whatever the batch or evaluation size. ``group`` k: the evaluation
    set's images ``k*g .. k*g + k - 1`` share one permutation (the paper's code: one ``randperm`` per
    forward pass of ``PAPER_RPI_BATCH`` images), whose SSDC depends on k. Either way independent of the
    batches the evaluation runs in."""

    seed: int = 0
    group: int = 1
    name: ClassVar[str] = "rpi"

    def model_kwargs(self, *, positions: range, num_patches: int, device: torch.device | str) -> dict[str, Any]:
        if self.group == 1:
            return {"perm": rpi_image_permutations(self.seed, positions, num_patches).to(device)}
        groups = [p // self.group for p in positions]
        perms = {g: rpi_permutation(self.seed, g, num_patches) for g in dict.fromkeys(groups)}
        perm = next(iter(perms.values())) if len(perms) == 1 else torch.stack([perms[g] for g in groups])
        return {"perm": perm.to(device)}


@dataclass(frozen=True)
class PEScale(Intervention):
    """Study P's PE scaling: the additive PE table (CLS slot included) times ``alpha``, no retraining."""

    alpha: float
    name: ClassVar[str] = "pe_scale"

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"{self.name} alpha {self.alpha!r} must be a finite number >= 0; defaults: {ALPHAS}")
        object.__setattr__(self, "alpha", float(self.alpha))

    @property
    def level(self) -> float:
        return self.alpha

    def model_kwargs(self, *, positions: range, num_patches: int, device: torch.device | str) -> dict[str, Any]:
        return {"pe_scale": self.alpha}


@dataclass(frozen=True)
class RopeScale(PEScale):
    """RoPE's rotation angles times ``alpha``: position interpolation (alpha 0 removes the rotation,
    which equals ``none``), not Study P's PE scaling. Same model argument, its own name."""

    name: ClassVar[str] = "rope_scale"


def apply_condition(condition: Sequence[Intervention], images: torch.Tensor, *, positions: range, num_patches: int,
                    device: torch.device | str) -> tuple[torch.Tensor, dict[str, Any]]:
    """Apply a tuple of interventions to one uint8 batch: (transformed uint8 images, merged model kwargs).

    positions: the batch's images' positions in the evaluation set (``range(start, start + B)``)."""
    kwargs: dict[str, Any] = {}
    for intervention in condition:
        images = intervention.images(images)
        extra = intervention.model_kwargs(positions=positions, num_patches=num_patches, device=device)
        for key, value in extra.items():
            if key in kwargs:
                raise ValueError(f"condition {condition!r} sets model argument {key!r} twice")
            kwargs[key] = value
    return images, kwargs
