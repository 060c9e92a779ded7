"""`ViTConfig` (frozen, flat) and the presets: the ViT's architecture as data, without torch.

The model itself is `trainables.vit.ViT` (which re-exports these names). Kept apart so that planning a
sweep (`vitsweep sweep ... --dry-run`, trial ids, pack keys, the estimate) imports no torch or timm.
A config checks its PE's geometry here (`PE_CHECKS`, torch-free, for the PEs that have a rule); any
other PE, and any registered at run time in `trainables.pos_embed.POS_EMBEDS`, by its own `validate`.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from records import vocab

# The names of `trainables.pos_embed.APE_INITS` (checked there), for a torch-free check of `ape_init`.
APE_INIT_NAMES = ("normal", "trunc_normal")
CLS_INITS = ("timm", "normal")  # N(0, 1e-6), timm's ViT | N(0, 1), Study P's `torch.randn`
LINEAR_INITS = ("timm", "torch")  # trunc-normal 0.02 and zero bias, timm's ViT | PyTorch's default, Study P's

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
vocab.check_registry("trainables.vit_config.PRESETS", PRESETS, vocab.PRESETS, "PRESETS")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of one ViT. Flat scalars only, so Tune, MLflow and Parquet take it as is."""

    img_size: int = 32
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 10
    dim: int = 192
    depth: int = 8
    heads: int = 8
    mlp_ratio: float = 2.0
    pe: str = "ape"
    drop_rate: float = 0.0  # on the tokens after CLS + additive PE (timm's pos_drop; unlike timm, not before the head)
    attn_drop_rate: float = 0.0  # on the softmax attention weights
    proj_drop_rate: float = 0.0  # after the attention output projection and inside the MLP
    drop_path_rate: float = 0.0  # stochastic depth, rising linearly to this over the blocks (timm)
    ape_init: str = "trunc_normal"  # "normal" N(0, 1) (Study P) | "trunc_normal" std 0.02 (timm)
    rope_base: float = 10000.0  # rope2d frequency base: Study P 10000, Heo et al. axial 100
    cls_init: str = "timm"  # see CLS_INITS
    linear_init: str = "timm"  # see LINEAR_INITS
    final_norm: bool = True  # LayerNorm on CLS before the head (timm); Study P's code has none

    def __post_init__(self) -> None:
        for name in ("img_size", "patch_size", "in_chans", "num_classes", "dim", "depth", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        for name in ("drop_rate", "attn_drop_rate", "proj_drop_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1)")
        if self.mlp_ratio <= 0 or self.rope_base <= 0:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} and rope_base={self.rope_base} must be positive")
        if self.img_size % self.patch_size:
            raise ValueError(
                f"img_size={self.img_size} is not divisible by patch_size={self.patch_size}; "
                f"valid patch sizes for img_size={self.img_size}: {_divisors(self.img_size)}"
            )
        if self.dim % self.heads:
            raise ValueError(
                f"dim={self.dim} is not divisible by heads={self.heads}; "
                f"valid heads for dim={self.dim}: {_divisors(self.dim)}"
            )
        for name, valid in (("ape_init", APE_INIT_NAMES), ("cls_init", CLS_INITS), ("linear_init", LINEAR_INITS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown {name}={getattr(self, name)!r}; valid: {sorted(valid)}")
        _check_pe(self)

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
        """Field name -> scalar."""
        return dataclasses.asdict(self)

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> ViTConfig:
        """Inverse of to_flat; ignores keys that are not fields (run fields sit in the same flat dict).

        Values are cast to the field's type, so numpy scalars or strings from MLflow params rebuild too.
        """
        kwargs = {}
        for field in dataclasses.fields(cls):
            if field.name in flat:
                value, kind = flat[field.name], type(field.default)
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


# -- each PE's geometry --------------------------------------------------------------------------
def check_sincos2d(config: ViTConfig) -> None:
    if config.dim % 4:
        raise ValueError(
            f"pe='sincos2d' needs dim divisible by 4 (sin/cos x column/row), got dim={config.dim}; "
            f"nearest valid dims: {config.dim - config.dim % 4}, {config.dim - config.dim % 4 + 4}"
        )


def check_rope(name: str, config: ViTConfig) -> None:
    if config.head_dim % 4:
        valid = [h for h in range(1, config.dim + 1) if config.dim % h == 0 and (config.dim // h) % 4 == 0]
        raise ValueError(
            f"pe='{name}' needs head_dim = dim / heads divisible by 4 (pairs x column/row), got "
            f"head_dim={config.head_dim} (dim={config.dim}, heads={config.heads}); valid heads for "
            f"dim={config.dim}: {valid}"
        )


def _no_constraint(config: ViTConfig) -> None:
    """`none` and `ape` suit every geometry."""


# The PE classes' `validate` call these (trainables/pos_embed.py), so each rule is written once.
PE_CHECKS: dict[str, Callable[[ViTConfig], None]] = {
    "none": _no_constraint,
    "ape": _no_constraint,
    "sincos2d": check_sincos2d,
    "rope2d": lambda config: check_rope("rope2d", config),
    "rope2d_mixed": lambda config: check_rope("rope2d_mixed", config),
}
# Optional per PE: a PE with no entry here is checked by its class's `validate` (importing torch), so a
# new PE stays a subclass plus its registry line; an entry for a name the vocabulary lacks is a typo.
assert set(PE_CHECKS) <= set(vocab.PES), f"PE_CHECKS names unknown PEs: {sorted(set(PE_CHECKS) - set(vocab.PES))}"


def _check_pe(config: ViTConfig) -> None:
    """Raise ValueError unless `config.pe` names a PE that suits the geometry. Once the PE registry
    is imported (it is, wherever a model is built) it decides, so a PE added to `POS_EMBEDS` at run
    time (a test, a notebook) is known; before that, the torch-free `PE_CHECKS` decide for the
    product's PEs, and only a name they lack imports the registry to look it up."""
    if "trainables.pos_embed" not in sys.modules and config.pe in PE_CHECKS:
        PE_CHECKS[config.pe](config)
        return
    from trainables.pos_embed import POS_EMBEDS

    if config.pe not in POS_EMBEDS:
        raise ValueError(f"unknown pe={config.pe!r}; valid: {sorted(POS_EMBEDS)}")
    POS_EMBEDS[config.pe].validate(config)
