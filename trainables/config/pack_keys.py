"""Which trials may share a pack (`pack_key`, `pack_blocker`), as data, without torch.

The packed model itself is `trainables/model/packed.py` (which re-exports these names); kept apart so that
a sweep's plan (`sweeps/launch/packs.py`: `vitsweep sweep ... --dry-run --json` lists each trial's pack)
imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainables.config.run_config import RunConfig

# Fields members of one pack may differ in: what the loop supplies per member (seed -> init, data
# order and draws; protocol switches -> augmentation, CutMix, smoothing; RPT -> perm). Names a
# RunConfig lacks (an older checkout without `cutmix_prob`) are simply absent from the key.
PACK_FREE_FIELDS = ("seed", "autoaugment", "cutmix", "cutmix_prob", "label_smoothing", "rpt", "rpt_per_image")
DERIVED_FIELDS = ("protocol",)  # a name for the three switches, not a field of its own
STOCHASTIC_FIELDS = ("drop_rate", "attn_drop_rate", "proj_drop_rate", "drop_path_rate")


def pack_key(cfg: RunConfig) -> tuple[tuple[str, Any], ...]:
    """Trials with equal keys may train in one pack: every flat field but `PACK_FREE_FIELDS`."""
    return tuple(sorted((k, v) for k, v in cfg.to_flat().items() if k not in PACK_FREE_FIELDS + DERIVED_FIELDS))


def pack_blocker(cfg: RunConfig) -> str | None:
    """Why `cfg` must train alone (K = 1), or None when it may be packed."""
    on = [f"{name}={getattr(cfg.model, name)}" for name in STOCHASTIC_FIELDS if getattr(cfg.model, name) > 0]
    if on:
        return (f"{', '.join(on)} (preset {cfg.preset!r}): dropout and drop path would need per-member "
                "random draws under vmap, so such trials train alone")
    return None
