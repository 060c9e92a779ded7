"""A pack that runs out of GPU memory is trained again in halves (`train_pack_fitting`)."""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from typing import Any

import torch

from trainables.loop import train
from trainables.model.fast_paths import is_out_of_memory
from trainables.config.run_config import RunConfig


def train_pack_fitting(cfgs: Sequence[RunConfig], workdirs: Sequence[str | os.PathLike], *,
                       report: train.PackReport | None = None, dropped: train.Dropped | None = None,
                       log=print, states: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """`train.train_pack`, retried in halves when the pack runs out of GPU memory: each half resumes
    from the members' own checkpoints, so work done before the error is kept (the epochs after the last
    checkpoint are trained and reported again: a caller keeps each epoch once; ``states``, the members'
    loaded checkpoints, serve the first attempt only). A member that does
    not fit alone fails with a message naming the batch size; a split pack's message names --pack.

    The retry starts outside the ``except`` block, once the failed attempt is gone: its traceback
    holds every frame of that attempt (model, optimiser state, the data's device copy, activations),
    so retrying inside the handler, or keeping the exception, would keep all of it on the device."""
    error, gone = None, {}  # gone: members dropped (and closed) for a non-finite loss before the error

    def on_drop(trial_id: str, final: dict[str, Any]) -> None:
        gone[trial_id] = final
        if dropped is not None:
            dropped(trial_id, final)

    try:
        return train.train_pack(cfgs, workdirs, report=report, dropped=on_drop, log=log, states=states)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        if len(cfgs) == 1:
            raise RuntimeError(f"trial {cfgs[0].trial_id} runs out of GPU memory even alone at "
                               f"batch_size={cfgs[0].batch_size}: {exc}") from exc
        error = f"{type(exc).__name__}: {str(exc)[:300]}"  # text only: no reference to the attempt
    release_device_memory()
    # A dropped member never rejoins: its checkpoint stays at its last good epoch, behind the others'.
    left = [(c, w) for c, w in zip(cfgs, workdirs) if c.trial_id not in gone]
    half = max(1, len(left) // 2)
    log(f"a pack of {len(cfgs)} ran out of GPU memory ({error}); training its {len(left)} remaining members as "
        f"packs of {half} and {len(left) - half} (a smaller --pack avoids this retry)")
    finals = dict(gone)
    for part in (left[:half], left[half:]):
        if part:
            done = train_pack_fitting([c for c, _ in part], [w for _, w in part], report=report, dropped=dropped,
                                      log=log)
            finals.update(zip((c.trial_id for c, _ in part), done))
    return [finals[c.trial_id] for c in cfgs]


def release_device_memory() -> None:
    """Free what a dropped attempt held: its reference cycles (frames, autograd graphs), then the
    caching allocator's now unused blocks (a no-op without CUDA)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
