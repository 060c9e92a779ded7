"""Which trials of a study train together, K at a time, in one process on one device.

    vitsweep sweep study_l --seeds 5 --pack 8 --dry-run     # 60 trials in 9 packs
    vitsweep sweep study_l --seeds 5 --dry-run --json       # every trial with its `pack` id

Trials pack together when their pack keys are equal (`trainables.config.pack_keys.pack_key`: every run-config
field but seed, the protocol switches, cutmix_prob and RPT) and they resume from the same epoch (the
epoch each one's stored checkpoint holds, `resume_epochs`); `compile` is in the key, so compiled
trials pack with compiled trials only (the loop compiles a pack's vmapped forward and its backward,
`trainables/model/compiled.py`, falling back to eager if the first step fails). Packs
fill greedily in the study's trial order, so `study_l --seeds 5 --pack 8` is CIFAR-10 8 + 2,
Tiny-ImageNet 8 + 2 and CIFAR-100 5 x 8. Some trials always train alone (K = 1):

  * dropout or drop path (`study_p`, `vit_s` presets): per-member random draws under vmap;
  * DDP trials (`--workers-per-trial` > 1): their batch is split across processes instead;
  * a study that declares why its trials train alone (its `UNPACKED` hook, `sweeps/studies/study.py`):
    the hparam study, whose searcher proposes and ASHA stops trials one at a time.

A pack of one trial is named by that trial's id, so an unpacked sweep keeps the names (and Train
storage paths) it has always had; a larger pack by its data set and a hash of its members' ids.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from records import tables
from sweeps.studies.study import unpacked_reason
from trainables.config.pack_keys import pack_blocker, pack_key

# Imports inside functions: the checkpoints' module imports torch; packing a plan (a dry run) needs none.

if TYPE_CHECKING:
    from trainables.config.run_config import RunConfig

DEFAULT_PACK_GPU = 8  # a study_l model at batch 128 leaves an H200 mostly idle; 8 share one launch stream
DEFAULT_PACK_CPU = 1  # on CPUs the step is compute-bound: packing saves Train overhead but no kernel time


@dataclass(frozen=True)
class Pack:
    """Trials trained together; `pack_id` names the Tune trial and Train run that runs them."""

    pack_id: str
    members: tuple[RunConfig, ...]

    @property
    def trial_ids(self) -> list[str]:
        return [c.trial_id for c in self.members]


def pack_size(requested: int | None, gpus_per_trial: float) -> int:
    """--pack K, or its default: 1 when trials use no GPU, `DEFAULT_PACK_GPU` when they do."""
    if requested is None:
        return DEFAULT_PACK_GPU if gpus_per_trial > 0 else DEFAULT_PACK_CPU
    if requested < 1:
        raise ValueError(f"--pack must be >= 1 (1 trains every trial alone), got {requested}")
    return requested


def solo_reason(cfg: RunConfig, *, workers_per_trial: int = 1) -> str | None:
    """Why `cfg` trains alone whatever --pack says, or None."""
    if reason := unpacked_reason(cfg.study):
        return reason
    if workers_per_trial > 1:
        return f"--workers-per-trial {workers_per_trial} trains each trial with DDP"
    return pack_blocker(cfg)


def pack_id(members: Sequence[RunConfig]) -> str:
    if len(members) == 1:
        return members[0].trial_id
    digest = hashlib.sha1(",".join(c.trial_id for c in members).encode()).hexdigest()[:8]
    return f"pack-{members[0].dataset}-k{len(members)}-{digest}"


def form_packs(configs: Sequence[RunConfig], k: int, *, workers_per_trial: int = 1,
               resume_epochs: Mapping[str, int] | None = None) -> list[Pack]:
    """Group `configs` into packs of at most `k`, in trial order.

    resume_epochs: trial id -> the epoch its checkpoint holds (absent: 0, a fresh start); trials
    resuming from different epochs never share a pack (one schedule, one optimiser step count)."""
    if k < 1:
        raise ValueError(f"pack size must be >= 1, got {k}")
    resume_epochs = resume_epochs or {}
    groups: dict[tuple, list[RunConfig]] = {}
    for cfg in configs:
        if k == 1 or solo_reason(cfg, workers_per_trial=workers_per_trial):
            key: tuple = ("solo", cfg.trial_id)
        else:
            key = (pack_key(cfg), resume_epochs.get(cfg.trial_id, 0))
        groups.setdefault(key, []).append(cfg)
    chunks = [tuple(members[start : start + k]) for members in groups.values() for start in range(0, len(members), k)]
    return [Pack(pack_id(chunk), chunk) for chunk in chunks]


def pack_of(packs: Sequence[Pack]) -> dict[str, str]:
    """trial id -> its pack's id."""
    return {trial_id: p.pack_id for p in packs for trial_id in p.trial_ids}


def resume_epochs(results: str, study: str, storage: str, trial_ids: Sequence[str] | None = None) -> dict[str, int]:
    """trial id -> the epoch its stored checkpoint holds, as recorded with the checkpoint
    (`trainables.loop.checkpoints.stored_epoch`), for the trials that have started (rows in the `epochs`
    table; `trial_ids`: only these). The epochs table itself runs ahead of the checkpoints when they
    are throttled (`checkpoint_interval_s`), so it only says which trials to look up. Trials with no
    checkpoint are absent (epoch 0: a fresh start)."""
    from trainables.loop.checkpoints import stored_epoch

    table = tables.read_table(results, study, "epochs")
    if table is None:
        return {}
    started = set(table.column("trial_id").to_pylist())
    if trial_ids is not None:
        started &= set(trial_ids)
    epochs: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="vitsweep-resume-") as scratch:
        for trial_id in sorted(started):
            if epoch := stored_epoch(storage, study, trial_id, scratch):
                epochs[trial_id] = epoch
    return epochs
