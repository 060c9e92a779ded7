"""`ViTConfig` (frozen, flat) and the presets: the ViT's architecture as data, without torch.

The model itself is `trainables.model.vit.ViT`. Kept apart so that planning a
sweep (`vitsweep sweep ... --dry-run`, trial ids, pack keys, the estimate) imports no torch or timm.
Each field carries its type and range (`trainables.config.fields.spec`), each PE its geometry rule (`PE_QUARTERS`).

Presets (`ViTConfig.preset(name, **overrides)`; overrides may change any field; params with pe="ape"):

| preset  | img / patch (G) | dim | depth | heads | mlp | drop / attn / proj | drop_path | ape_init     | C   | params |
| ------- | --------------- | --- | ----- | ----- | --- | ------------------ | --------- | ------------ | --- | ------ |
| study_l | 32 / 4 (8)      | 192 | 8     | 8     | 2   | 0 / 0 / 0          | 0         | trunc_normal | 10  | 2.40M  |
| study_p | 224 / 16 (14)   | 384 | 12    | 8     | 4   | .15 / .15 / .15    | 0.2       | normal       | 100 | 21.70M |
| vit_s   | 224 / 16 (14)   | 384 | 12    | 6     | 4   | .15 / .15 / .15    | 0.2       | normal       | 100 | 21.70M |
| tiny    | 32 / 4 (8)      | 64  | 2     | 4     | 2   | 0 / 0 / 0          | 0         | trunc_normal | 10  | 0.08M  |

Every preset leaves pe="ape", in_chans=3 and rope_base=10000 at their defaults. study_p and vit_s
follow Study P's code (`mahmoud-mannes/vit-encoding-paper`, `code/src/main/model.py`) where the paper
is silent: CLS `torch.randn` (cls_init="normal"), Linear layers at PyTorch's default init
(linear_init="torch"), no LayerNorm before the head (final_norm=False; params 21.70M less 768); the
others keep timm's ViT: CLS N(0, 1e-6), Linear trunc-normal 0.02, a final LayerNorm.

study_l: Study L's model (depth 8, D 192, 8 heads, MLP 2, "~2.4M parameters"); use img_size=64,
patch_size=8 for Tiny-ImageNet (still an 8x8 grid; 2.43M parameters). study_p: Study P's model (ViT-S
width with 8 heads, dropout 0.15, drop path 0.2, APE N(0, 1), ImageNet-100). vit_s: the standard 6-head
ViT-S at Study P's recipe. tiny: tests and demos. Heads do not change the parameter count.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

from records import vocab
from trainables.config.fields import Spec, check_fields, spec

_STUDY_P = dict(
    img_size=224, patch_size=16, num_classes=100, dim=384, depth=12, heads=8, mlp_ratio=4.0,
    drop_rate=0.15, attn_drop_rate=0.15, proj_drop_rate=0.15, drop_path_rate=0.2, ape_init="normal",
    cls_init="normal", linear_init="torch", final_norm=False,
)
_NO_DROPOUT = dict(drop_rate=0.0, attn_drop_rate=0.0, proj_drop_rate=0.0, drop_path_rate=0.0)
PRESETS: dict[str, dict[str, Any]] = {
    "study_l": dict(img_size=32, patch_size=4, num_classes=10, dim=192, depth=8, heads=8, mlp_ratio=2.0,
                    ape_init="trunc_normal", **_NO_DROPOUT),
    "study_p": _STUDY_P,
    "vit_s": {**_STUDY_P, "heads": 6},
    "tiny": dict(img_size=32, patch_size=4, num_classes=10, dim=64, depth=2, heads=4, mlp_ratio=2.0,
                 ape_init="trunc_normal", **_NO_DROPOUT),
}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of one ViT. Flat scalars only, so Tune, MLflow and Parquet take it as is."""

    img_size: int = spec(32, ge=1)
    patch_size: int = spec(4, ge=1)
    in_chans: int = spec(3, ge=1)
    num_classes: int = spec(10, ge=1)
    dim: int = spec(192, ge=1)
    depth: int = spec(8, ge=1)
    heads: int = spec(8, ge=1)
    mlp_ratio: float = spec(2.0, gt=0)
    # Open: a PE registered at run time in `trainables.model.pos_embed.POS_EMBEDS` (a test, a notebook) is valid too.
    pe: str = spec("ape", choices=vocab.PES, open=True)
    drop_rate: float = spec(0.0, ge=0, lt=1, help="on the tokens after CLS + additive PE (timm's pos_drop; unlike "
                            "timm, not before the head)")
    attn_drop_rate: float = spec(0.0, ge=0, lt=1, help="on the softmax attention weights")
    proj_drop_rate: float = spec(0.0, ge=0, lt=1, help="after the attention output projection and inside the MLP")
    drop_path_rate: float = spec(0.0, ge=0, lt=1, help="stochastic depth, rising linearly to this over the blocks")
    # The names of `trainables.model.pos_embed.APE_INITS` (checked there).
    ape_init: str = spec("trunc_normal", choices=("normal", "trunc_normal"),
                         help="normal: N(0, 1) (Study P) | trunc_normal: std 0.02 (timm)")
    rope_base: float = spec(10000.0, gt=0, help="rope2d frequency base: Study P 10000, Heo et al. axial 100")
    cls_init: str = spec("timm", choices=("timm", "normal"), help="timm: N(0, 1e-6), timm's ViT | normal: N(0, 1), "
                         "Study P's torch.randn")
    linear_init: str = spec("timm", choices=("timm", "torch"), help="timm: trunc-normal 0.02 and zero bias, timm's "
                            "ViT | torch: PyTorch's default, Study P's")
    final_norm: bool = spec(True, help="LayerNorm on CLS before the head (timm); Study P's code has none")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size={self.img_size} is not divisible by patch_size={self.patch_size}; "
                             f"valid patch sizes for img_size={self.img_size}: {_divisors(self.img_size)}")
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}; "
                             f"valid heads for dim={self.dim}: {_divisors(self.dim)}")
        if self.pe in vocab.PES:
            check_pe_geometry(self)
        elif self.pe not in (registered := _registered_pes()):  # a PE registered at run time (a test, a notebook)
            raise Spec(str, choices=registered).error("pe", self.pe)

    @property
    def grid(self) -> int:
        return self.img_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def to_flat(self) -> dict[str, Any]:
        """Field name -> scalar (every field is one: ``dataclasses.asdict``'s deep copies cost a 10,000-trial
        dry run seconds)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> ViTConfig:
        """Inverse of to_flat; ignores keys that are not fields (run fields sit in the same flat dict).

        Values are cast to the field's type, so numpy scalars or strings from MLflow params rebuild too.
        """
        kwargs: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name in flat:
                value = flat[field.name]
                kind: type = type(field.default)  # every field has a default
                # bool("False") is True: a flag that comes back as an MLflow string is read by its word
                kwargs[field.name] = value.lower() == "true" if kind is bool and isinstance(value, str) else kind(value)
        return cls(**kwargs)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ViTConfig:
        """The named architecture (see the module docstring), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset={name!r}; valid: {sorted(PRESETS)}")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"unknown ViTConfig field(s) {unknown}; valid: {fields}")
        return cls(**{**PRESETS[name], **overrides})


# -- each PE's geometry, as data -------------------------------------------------------------------
# The width each PE splits in four: sincos2d's table (sin/cos x column/row) and the rotary PEs' head
# (channel pairs x column/row). `none` and `ape` suit every geometry; a new PE with a rule is one line here.
PE_QUARTERS = {"sincos2d": "dim", "rope2d": "head_dim", "rope2d_mixed": "head_dim"}
assert set(PE_QUARTERS) <= set(vocab.PES), f"PE_QUARTERS names unknown PEs: {sorted(set(PE_QUARTERS) - set(vocab.PES))}"


def _registered_pes() -> tuple[str, ...]:
    """The model's PE registry (`trainables.model.pos_embed.POS_EMBEDS`) if the model is loaded, else the
    vocabulary's names. A PE registered at run time went into that registry, so the model is loaded then;
    read through ``sys.modules`` so that this torch-free module imports nothing above it."""
    model = sys.modules.get("trainables.model.pos_embed")
    return tuple(model.POS_EMBEDS) if model is not None else vocab.PES


def check_pe_geometry(config: ViTConfig) -> None:
    """Raise ValueError naming the nearest valid values when `config.pe` does not suit the geometry."""
    width = PE_QUARTERS.get(config.pe)
    if width == "dim" and config.dim % 4:
        raise ValueError(f"pe={config.pe!r} needs dim divisible by 4 (sin/cos x column/row), got dim={config.dim}; "
                         f"nearest valid dims: {config.dim - config.dim % 4}, {config.dim - config.dim % 4 + 4}")
    if width == "head_dim" and config.head_dim % 4:
        valid = [h for h in range(1, config.dim + 1) if config.dim % h == 0 and (config.dim // h) % 4 == 0]
        raise ValueError(f"pe={config.pe!r} needs head_dim = dim / heads divisible by 4 (pairs x column/row), got "
                         f"head_dim={config.head_dim} (dim={config.dim}, heads={config.heads}); valid heads for "
                         f"dim={config.dim}: {valid}")
