"""`shapes`: a procedural 10-class image set whose classes need shape AND layout.

No download, deterministic from a seed, generated in about a second with vectorised torch ops, so
demos and tests train on real spatial structure without any data on disk. Each image is one scene on a
textured background (smooth noise, a linear gradient or stripes, in random colours); objects get random
positions, sizes and colours, drawn with anti-aliased edges from signed distance functions (SDF < 0
inside, in pixels).

The 10 classes (index: name):

| # | name | what decides the class |
| - | ---- | ---------------------- |
| 0 | disc | shape: a filled disc anywhere |
| 1 | square_centre | shape and absolute position: a square near the image centre |
| 2 | triangle | shape: a filled triangle pointing up |
| 3 | cross | shape: a plus sign |
| 4 | ring | shape: an annulus (a disc outline: same silhouette as 0, local structure differs) |
| 5 | bars_horizontal | orientation: two parallel horizontal bars ("=") |
| 6 | bars_vertical | orientation: two parallel vertical bars ("||") |
| 7 | discs_side_by_side | layout: two small discs in a row |
| 8 | discs_stacked | layout: the same two discs in a column |
| 9 | square_corner | absolute position: the square of class 1, but in one of the four corners |

So 7 vs 8 can only be told apart by the relative position of two objects spread over several patches,
and 1 vs 9 only by absolute position (a positional encoding must carry it: a ViT without one is
permutation-invariant on patches, so for it 1 and 9 are one class). Every class is invariant to a
horizontal flip and survives random crops with padding, the baseline augmentation; strong AutoAugment
translations can move a corner square inwards, which is part of what that protocol does. Contrast is
guaranteed: backgrounds are dark (channel values in [0, 0.45]), objects bright ([0.6, 1]), and half of
the images are inverted.

    images, labels = make_shapes(12_000, img_size=32, seed=0)   # uint8 (N, 3, 32, 32), int64 (N,)
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

CLASSES = ("disc", "square_centre", "triangle", "cross", "ring", "bars_horizontal", "bars_vertical",
           "discs_side_by_side", "discs_stacked", "square_corner")
NUM_CLASSES = len(CLASSES)
_CHUNK_PIXELS = 2**18  # pixels rendered at once: small temporaries stay in cache-friendly, reused memory


def split_seed(seed: int, split: str) -> int:
    """Independent generator seed per (seed, split), so the test set does not depend on the train size."""
    return int(np.random.SeedSequence([seed, {"train": 0, "test": 1}[split]]).generate_state(1)[0])


def make_shapes(num_images: int, *, img_size: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Render `num_images` scenes: (images uint8 (N, 3, S, S), labels int64 (N,)). Classes are exactly
    balanced when N is a multiple of 10 (labels are `arange(N) % 10`, shuffled). The same (num_images,
    img_size, seed) always gives the same tensors."""
    if num_images < 0:
        raise ValueError(f"num_images must be >= 0, got {num_images}")
    if img_size < 16:
        raise ValueError(f"img_size must be >= 16 for shapes to be drawable, got {img_size}")
    g = torch.Generator().manual_seed(seed)
    labels = (torch.arange(num_images) % NUM_CLASSES)[torch.randperm(num_images, generator=g)]
    params = _scene_params(labels, float(img_size), g)
    images = torch.empty(num_images, 3, img_size, img_size, dtype=torch.uint8)
    chunk_size = max(1, _CHUNK_PIXELS // (img_size * img_size))
    for start in range(0, num_images, chunk_size):
        stop = min(start + chunk_size, num_images)
        chunk = {k: v[start:stop] for k, v in params.items()}
        images[start:stop] = _render(labels[start:stop], chunk, img_size, g)
    return images, labels


def _uniform(n: int, low: float, high: float, g: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=g)


def _scene_params(labels: torch.Tensor, S: float, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Per-image geometry and colours, all (N,) or (N, 3), drawn for every image up front."""
    n = labels.numel()
    r = _uniform(n, 0.12, 0.21, g) * S  # object "radius" (half-extent), px
    rho = _uniform(n, 0.07, 0.10, g) * S  # radius of each disc of a pair, px
    gap = _uniform(n, 2.7, 3.6, g) * rho  # centre distance of a pair
    jitter = _uniform(n, -0.3, 0.3, g) * rho  # pair misalignment across its axis
    ux, uy = torch.rand(n, generator=g), torch.rand(n, generator=g)  # free position in [0, 1)
    corner_x = torch.randint(0, 2, (n,), generator=g).float()
    corner_y = torch.randint(0, 2, (n,), generator=g).float()

    # Half-extents along x and y of each class's drawing, so every object fits inside the image.
    half_x, half_y = r.clone(), r.clone()
    side, stacked = labels == 7, labels == 8
    half_x[side], half_y[side] = gap[side] / 2 + rho[side], rho[side] + jitter[side].abs()
    half_x[stacked], half_y[stacked] = rho[stacked] + jitter[stacked].abs(), gap[stacked] / 2 + rho[stacked]
    margin = 1.0
    cx = half_x + margin + ux * (S - 2 * (half_x + margin))
    cy = half_y + margin + uy * (S - 2 * (half_y + margin))

    centre = labels == 1  # square near the centre: +-8% of the side (wider than a patch of S/8)
    cx[centre] = S / 2 + (ux[centre] - 0.5) * 0.16 * S
    cy[centre] = S / 2 + (uy[centre] - 0.5) * 0.16 * S
    # Square in a corner: its edges 1 px + up to S/8 from two borders. Both squares' positions
    # jitter by at least one patch (S/8), so where a square sits relative to the patch grid does
    # not give the class away to a model without positions.
    corner = labels == 9
    off_x = r[corner] + margin + ux[corner] * S / 8
    off_y = r[corner] + margin + uy[corner] * S / 8
    cx[corner] = torch.where(corner_x[corner] > 0, S - off_x, off_x)
    cy[corner] = torch.where(corner_y[corner] > 0, S - off_y, off_y)

    bg0 = _uniform(3 * n, 0.0, 0.45, g).view(n, 3)
    bg1 = (bg0 + _uniform(3 * n, -0.2, 0.2, g).view(n, 3)).clamp(0.0, 0.45)
    fg = _uniform(3 * n, 0.6, 1.0, g).view(n, 3)
    # Inverting half the images (bright background, dark object) = inverting their colours,
    # since a scene is affine in its colours (the pixel noise is symmetric).
    invert = (torch.rand(n, generator=g) < 0.5).view(n, 1)
    bg0, bg1, fg = (torch.where(invert, 1 - c, c) for c in (bg0, bg1, fg))
    return dict(r=r, rho=rho, gap=gap, jitter=jitter, cx=cx, cy=cy, texture=torch.randint(0, 3, (n,), generator=g),
                angle=_uniform(n, 0.0, math.pi, g), freq=_uniform(n, 1.5, 4.0, g),
                phase=_uniform(n, 0.0, 2 * math.pi, g), bg0=bg0, bg1=bg1, fg=fg)


def _render(labels: torch.Tensor, p: dict[str, torch.Tensor], S: int, g: torch.Generator) -> torch.Tensor:
    """uint8 (n, 3, S, S) for one chunk of scene parameters."""
    n = labels.numel()
    coords = torch.arange(S, dtype=torch.float32) + 0.5  # pixel centres
    y, x = coords.view(1, S, 1), coords.view(1, 1, S)

    # Background texture t in [0, 1], (n, S, S): smooth noise | gradient | stripes.
    noise = F.interpolate(torch.rand(n, 1, 4, 4, generator=g), size=(S, S), mode="bicubic", align_corners=False)
    noise = noise.squeeze(1).clamp(0, 1)
    cos, sin = p["angle"].cos().view(n, 1, 1), p["angle"].sin().view(n, 1, 1)
    along = (cos * (x - S / 2) + sin * (y - S / 2)) / S  # in [-0.71, 0.71]
    gradient = (along / 1.42 + 0.5).clamp(0, 1)
    stripes = 0.5 + 0.5 * torch.sin(2 * math.pi * p["freq"].view(n, 1, 1) * along + p["phase"].view(n, 1, 1))
    kind = p["texture"].view(n, 1, 1)
    t = torch.where(kind == 0, noise, torch.where(kind == 1, gradient, stripes))

    # Signed distance of each scene's object(s), (n, S, S); then anti-aliased coverage.
    sdf = torch.empty(n, S, S)
    for c in range(NUM_CLASSES):
        idx = (labels == c).nonzero().squeeze(1)
        if idx.numel():
            sdf[idx] = _class_sdf(c, x, y, {k: v[idx].view(-1, 1, 1) for k, v in p.items() if v.dim() == 1})
    alpha = (0.5 - sdf).clamp(0, 1).unsqueeze(1)  # (n, 1, S, S): 1 inside, 0 outside, a 1-px ramp

    bg0, bg1 = p["bg0"].view(n, 3, 1, 1), p["bg1"].view(n, 3, 1, 1)
    # Pixel noise, uniform in +-0.05 (std 0.03): cheaper to draw than a normal, as good a texture.
    image = torch.rand(n, 3, S, S, generator=g).sub_(0.5).mul_(0.1)
    image.add_(bg0 + (bg1 - bg0) * t.unsqueeze(1))
    image.add_(alpha * (p["fg"].view(n, 3, 1, 1) - image))  # alpha-blend the object over the background
    return image.mul_(255).round_().clamp_(0, 255).to(torch.uint8)


def _box(dx: torch.Tensor, dy: torch.Tensor, half_x, half_y) -> torch.Tensor:
    """SDF of an axis-aligned rectangle (exact outside the corners, fine for a 1-px ramp)."""
    return torch.maximum(dx.abs() - half_x, dy.abs() - half_y)


def _class_sdf(c: int, x: torch.Tensor, y: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """SDF (m, S, S) of class `c` for m scenes; x (1, 1, S), y (1, S, 1) pixel centres; p values (m, 1, 1)."""
    dx, dy, r = x - p["cx"], y - p["cy"], p["r"]
    stroke = (0.2 * r).clamp(min=1.0)  # half-width of bars, cross arms and the ring: >= 2 px wide
    if c == 0:
        return torch.sqrt(dx**2 + dy**2) - r
    if c in (1, 9):
        return _box(dx, dy, 0.85 * r, 0.85 * r)  # 0.85: the same area as the disc, roughly
    if c == 2:
        # Isosceles triangle, apex (0, -r), base at y = +0.8 r from x = -r to +r: three half-planes.
        norm = math.sqrt(1.8**2 + 1.0)
        left = (-1.8 * dx - (dy + r)) / norm
        right = (1.8 * dx - (dy + r)) / norm
        return torch.maximum(torch.maximum(left, right), dy - 0.8 * r)
    if c == 3:
        return torch.minimum(_box(dx, dy, stroke, r), _box(dx, dy, r, stroke))
    if c == 4:
        return (torch.sqrt(dx**2 + dy**2) - (r - stroke)).abs() - stroke
    if c in (5, 6):
        a, b = (dx, dy) if c == 5 else (dy, dx)  # a runs along the bars, b across
        offset = 0.5 * r
        return torch.minimum(_box(a, b - offset, r, stroke), _box(a, b + offset, r, stroke))
    if c in (7, 8):
        rho, half, jit = p["rho"], p["gap"] / 2, p["jitter"] / 2
        a, b = (dx, dy) if c == 7 else (dy, dx)  # a along the pair, b across
        first = torch.sqrt((a + half) ** 2 + (b + jit) ** 2) - rho
        second = torch.sqrt((a - half) ** 2 + (b - jit) ** 2) - rho
        return torch.minimum(first, second)
    raise ValueError(f"unknown shapes class {c}; valid: 0..{NUM_CLASSES - 1}")
