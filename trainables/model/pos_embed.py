"""Positional encodings (PEs) of Study P, behind one small interface.

References:
  - Study P: "Positional Encodings Anchor Spatial Structure in Vision Transformers" (arXiv 2606.00124),
    code github.com/mahmoud-mannes/vit-encoding-paper (`code/src/pe_encodings/{SPE,RoPE}.py`).
  - Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (arXiv 2403.13298),
    code github.com/naver-ai/rope-vit (`deit/models_v2_rope.py`): RoPE-Axial and RoPE-Mixed.
  - MAE `util/pos_embed.py` (the same sin/cos channel layout as Study P's sincos2d).

Shapes: B batch, N = G*G patch tokens, T = 1 + N tokens (CLS first), D model width, H heads,
hd = D / H head width, L blocks. Token i >= 1 is patch i - 1 at (row, col) = divmod(i - 1, G): positions are
*indices*, so under a token permutation (RPT / RPI) the PE stays tied to the index, not to the content.

The interface (`PositionalEncoding`), two hooks the ViT calls once per forward:
  additive(pe_scale)  -> (1, T, D) table added to the tokens after the CLS token is prepended, or None.
  rotations(pe_scale) -> list of L (cos, sin) pairs, each (T, hd) or (H, T, hd), applied to q and k of
                         block l by `apply_rotation`, or None.
  alpha_scaling       -> class attribute: how the analysis scales this PE (`analysis.measuring.evaluate`): "pe_scale"
                         (an additive table times alpha), "rope_scale" (rotation angles times alpha), or
                         None (nothing to scale: no alpha rows).
`pe_scale` (Study P's alpha) multiplies the whole additive table, CLS slot included; for the rotary PEs it
multiplies the rotation angles (our extension: alpha = 0 is the identity rotation, i.e. the `none` model).
A new PE is one subclass plus one line in `POS_EMBEDS` (and its name in the torch-free `records.vocab.PES`,
which this registry checks at import, naming a key one has and the other lacks; and, if its geometry has a
rule, one line in `trainables.config.architecture.PE_QUARTERS`).
"""

from __future__ import annotations

import math

import torch
from timm.layers import trunc_normal_
from torch import nn

from records import vocab
from trainables.config.architecture import ViTConfig
from trainables.config.fields import specs

# Heo et al.'s RoPE-Mixed initial frequency base (`rope_theta=10.0` for their mixed models); config.rope_base
# (Study P's 10000, Heo et al.'s axial 100) only concerns the fixed axial `rope2d`.
MIXED_ROPE_INIT_BASE = 10.0

Rotation = tuple[torch.Tensor, torch.Tensor]  # (cos, signed sin: `pair_tables`), each (T, hd) or (H, T, hd)


def grid_coordinates(grid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major patch coordinates: (rows (N,), cols (N,)) as float64, patch i at (i // G, i % G)."""
    index = torch.arange(grid * grid, dtype=torch.float64)
    return torch.div(index, grid, rounding_mode="floor"), index % grid


def sincos2d_table(grid: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Study P's fixed 2-D sinusoidal table, CLS slot zero. Returns (1, 1 + G*G, D) float32.

    Element by element, with Q = D/4, k in [0, Q), w_k = 1 / temperature**(k / Q), x = column, y = row:
        table[0, 0, :]          = 0               (CLS carries no position)
        table[0, 1+i, k]        = sin(x_i w_k)
        table[0, 1+i, Q+k]      = cos(x_i w_k)
        table[0, 1+i, 2Q+k]     = sin(y_i w_k)
        table[0, 1+i, 3Q+k]     = cos(y_i w_k)
    This is Study P's `build_2d_sincos_pe` (and MAE's layout). timm's `build_sincos2d_pos_embed` is not:
    its ij grid puts the row first and stacks [sin(y), sin(x), cos(y), cos(x)], hence these few lines.
    """
    rows, cols = grid_coordinates(grid)
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (Q,)
    x, y = cols[:, None] * omega, rows[:, None] * omega  # (N, Q) each
    patches = torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)  # (N, D)
    return torch.cat([patches.new_zeros(1, dim), patches]).float()[None]  # (1, T, D)


def swap_pairs(x: torch.Tensor) -> torch.Tensor:
    """The two members of every channel pair swapped: x = [x1, x2, x3, x4] (quarters of hd) -> [x2, x1, x4, x3].

    Channel j of quarter 1 pairs with channel j of quarter 2 (and 3 with 4), Study P's RoPE layout. A flip
    of each half's two quarters, not chunks and a cat: under torch.compile an index that fuses into the
    rotation, where a cat of quarters is written out (and its backward too).
    """
    return x.unflatten(-1, (2, 2, -1)).flip(-2).flatten(-3)


def apply_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each channel pair (a, b) of q or k by its angle phi: (a cos phi - b sin phi, b cos phi + a sin phi).

    x: (B, H, T, hd); cos, sin: (T, hd) or (H, T, hd) from `pair_tables`, the angle repeated on both
    members of its pair, sin signed for `swap_pairs` ([-sin, sin] on each pair).
    Tables come in the step's dtype (`step_dtype`); the result is cast back so q/k keep their dtype
    whatever the tables' (as timm's `apply_rot_embed`).
    """
    return (x * cos + swap_pairs(x) * sin).to(x.dtype)


def step_dtype(cos: torch.Tensor, sin: torch.Tensor) -> Rotation:
    """Rotation tables in the dtype q and k have in the step: autocast's (bf16) when it is on for the
    tables' device, else as they are (fp32). fp32 tables would promote bf16 q and k to fp32 in every
    block and cast them back: two fp32 passes over q and k for no precision the bf16 result keeps."""
    device = cos.device.type
    if not torch.is_autocast_enabled(device):
        return cos, sin
    dtype = torch.get_autocast_dtype(device)
    return cos.to(dtype), sin.to(dtype)


def pair_tables(angles: torch.Tensor) -> Rotation:
    """Per-pair angles (..., T, hd/2) = [a (hd/4), b (hd/4)] -> (cos, sin) (..., T, hd) for `apply_rotation`:
    cos = [cos a, cos a, cos b, cos b], sin = [-sin a, sin a, -sin b, sin b] (the sign of the pair's first
    member, so the rotation is x cos + swap_pairs(x) sin).

    Pair j of the first half (channels j, Q+j) turns by a_j; pair j of the second half (2Q+j, 3Q+j) by b_j.
    """
    a, b = angles.chunk(2, dim=-1)
    full = torch.cat([a, a, b, b], dim=-1)
    s1, s2, s3, s4 = full.sin().chunk(4, dim=-1)
    return full.cos(), torch.cat([-s1, s2, -s3, s4], dim=-1)


class PositionalEncoding(nn.Module):
    """No positional information (Study P's `none` / "ablated"): the base every PE overrides from."""

    # The name of the analysis's alpha intervention for this PE (analysis.measuring.interventions.PEScale.name or
    # RopeScale.name), or None: nothing to scale, no alpha rows.
    alpha_scaling: str | None = None

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.num_tokens = 1 + config.num_patches  # T
        self.depth = config.depth

    def additive(self, pe_scale: float = 1.0) -> torch.Tensor | None:
        """(1, T, D) table to add to [CLS; patches], or None."""
        return None

    def rotations(self, pe_scale: float = 1.0) -> list[Rotation] | None:
        """L rotations (cos, sin) of q and k, one per block, or None."""
        return None


class LearnedAbsolute(PositionalEncoding):
    """`ape`: one learned vector per index, CLS slot included: table (1, T, D).

    ape_init "normal": N(0, 1), `nn.Embedding`'s default, which Study P's code uses;
    "trunc_normal": std 0.02 truncated at +-2 (absolute), timm ViT's init.
    """

    alpha_scaling = "pe_scale"

    def __init__(self, config: ViTConfig):
        super().__init__(config)
        self.table = nn.Parameter(torch.empty(1, self.num_tokens, config.dim))
        APE_INITS[config.ape_init](self.table)

    def additive(self, pe_scale: float = 1.0) -> torch.Tensor:
        return self.table if pe_scale == 1.0 else self.table * pe_scale


class SinCos2d(PositionalEncoding):
    """`sincos2d`: the fixed table of `sincos2d_table`, added like `ape`."""

    alpha_scaling = "pe_scale"

    def __init__(self, config: ViTConfig):
        super().__init__(config)
        # Not persistent: derived from the config, so checkpoints stay interchangeable with `none`'s.
        self.register_buffer("table", sincos2d_table(config.grid, config.dim), persistent=False)

    def additive(self, pe_scale: float = 1.0) -> torch.Tensor:
        return self.table if pe_scale == 1.0 else self.table * pe_scale


class Rope2d(PositionalEncoding):
    """`rope2d`: fixed axial 2-D RoPE on q and k; CLS not rotated.

    With Q = hd/4 and w_j = rope_base**(-j/Q) = rope_base**(-4j/hd), j in [0, Q) (Heo et al.'s
    `compute_axial_cis`; Study P's `apply_2d_rope`), the patch at (row y, col x) turns
        pair (j, Q+j)       by  x * w_j * pe_scale     (first half of each head's channels: the column)
        pair (2Q+j, 3Q+j)   by  y * w_j * pe_scale     (second half: the row)
    This quarter pairing is Study P's code; Heo et al. pair neighbours (2m, 2m+1) instead, a fixed
    permutation of q/k channels that the qkv weights absorb. The CLS slot has angle 0 (cos 1, sin 0),
    so it passes unchanged without slicing q and k. Base: Study P 10000, Heo et al. 100 (config.rope_base).
    """

    alpha_scaling = "rope_scale"  # position interpolation, not Study P's PE scaling

    def __init__(self, config: ViTConfig):
        super().__init__(config)
        rows, cols = grid_coordinates(config.grid)
        quarter = config.head_dim // 4
        omega = config.rope_base ** (-torch.arange(quarter, dtype=torch.float64) / quarter)  # (Q,)
        angles = torch.cat([cols[:, None] * omega, rows[:, None] * omega], dim=1)  # (N, hd/2)
        angles = torch.cat([angles.new_zeros(1, angles.shape[1]), angles]).float()  # (T, hd/2), CLS angle 0
        self.register_buffer("angles", angles, persistent=False)
        cos, sin = pair_tables(angles)  # (T, hd) each, cached for the training path (pe_scale 1)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rotations(self, pe_scale: float = 1.0) -> list[Rotation]:
        rotation = (self.cos, self.sin) if pe_scale == 1.0 else pair_tables(self.angles * pe_scale)
        return [step_dtype(*rotation)] * self.depth


class RopeMixed(PositionalEncoding):
    """`rope2d_mixed`: Heo et al.'s RoPE-Mixed, learnable frequencies per layer and head; CLS not rotated.

    Pair m in [0, hd/2) of head h in block l turns by theta = (x f_x[l, h, m] + y f_y[l, h, m]) * pe_scale,
    pairs laid out as in `Rope2d` (m < Q: channels (m, Q+m); m >= Q: (Q+m, 2Q+m)). Initialisation as
    Heo et al.'s `init_random_2d_freqs` (base 10): mag_j = 10**(-4j/hd), j in [0, Q); one random angle
    phi ~ U[0, 2 pi) per block and head;
        f_x = [mag cos(phi), mag cos(phi + pi/2)],   f_y = [mag sin(phi), mag sin(phi + pi/2)]   (hd/2 each)
    so each head starts with two orthogonal frequency directions. `freqs` (2, L, H, hd/2) is learned and,
    as in Heo et al., belongs to no weight decay (see ViT.no_weight_decay).
    """

    alpha_scaling = "rope_scale"

    def __init__(self, config: ViTConfig):
        super().__init__(config)
        quarter = config.head_dim // 4
        mag = MIXED_ROPE_INIT_BASE ** (-torch.arange(quarter, dtype=torch.float32) / quarter)  # (Q,)
        phi = torch.rand(config.depth, config.heads, 1) * 2 * math.pi  # (L, H, 1)
        f_x = torch.cat([mag * phi.cos(), mag * (phi + math.pi / 2).cos()], dim=-1)  # (L, H, hd/2)
        f_y = torch.cat([mag * phi.sin(), mag * (phi + math.pi / 2).sin()], dim=-1)
        self.freqs = nn.Parameter(torch.stack([f_x, f_y]))  # (2, L, H, hd/2)
        rows, cols = grid_coordinates(config.grid)
        self.register_buffer("t_x", cols.float(), persistent=False)  # (N,)
        self.register_buffer("t_y", rows.float(), persistent=False)

    def rotations(self, pe_scale: float = 1.0) -> list[Rotation]:
        f_x, f_y = self.freqs.float()[:, :, :, None, :]  # (L, H, 1, hd/2) each
        theta = self.t_x[:, None] * f_x + self.t_y[:, None] * f_y  # (L, H, N, hd/2)
        theta = nn.functional.pad(theta, (0, 0, 1, 0))  # (L, H, T, hd/2), CLS angle 0
        if pe_scale != 1.0:
            theta = theta * pe_scale
        cos, sin = step_dtype(*pair_tables(theta))  # (L, H, T, hd) each
        return list(zip(cos.unbind(0), sin.unbind(0)))


APE_INITS = {
    "normal": nn.init.normal_,  # N(0, 1), Study P
    "trunc_normal": lambda t: trunc_normal_(t, std=0.02),  # timm ViT
}

POS_EMBEDS: dict[str, type[PositionalEncoding]] = {
    "none": PositionalEncoding,
    "ape": LearnedAbsolute,
    "sincos2d": SinCos2d,
    "rope2d": Rope2d,
    "rope2d_mixed": RopeMixed,
}
vocab.check_registry("trainables.model.pos_embed.POS_EMBEDS", POS_EMBEDS, vocab.PES, "PES")
vocab.check_registry("trainables.model.pos_embed.APE_INITS", APE_INITS, specs(ViTConfig)["ape_init"].choices,
                     "ViTConfig.ape_init's choices")


def build_pos_embed(config: ViTConfig) -> PositionalEncoding:
    """The PE module named by config.pe (validated by ViTConfig)."""
    return POS_EMBEDS[config.pe](config)
