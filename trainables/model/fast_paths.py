"""The step's fast paths and the slower paths they fall back to, tried in one place.

A fast path is a choice the loop makes for speed whose first real execution may be on the first
GPU it meets: the forward under `torch.compile` (`trainables.model.compiled`) and the fused attention
under vmap (`trainables.model.packed`). `FastPaths.run(step)` runs a step's forward and backward; when
the first step fails with a fast path still unproven, the latest one added is taken down with one
logged line and the step runs again, until it succeeds or none is left (then the error is raised).
Once a step succeeds every fast path is proven and `run` is a plain call. Running out of memory is
never a fast path's fault: it goes on to `train_pack_fitting`, which retries in halves.

`wrap_forward` puts them in place: the one place the loop wraps a pack's forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

if TYPE_CHECKING:
    from trainables.model.packed import PackedViT
    from trainables.config.run_config import RunConfig

_T = TypeVar("_T")

# RuntimeErrors (not torch.cuda.OutOfMemoryError) by which cuBLAS, cuDNN and the caching allocator
# say the device ran out of memory.
_OOM_MESSAGES = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                 "cudnn_status_not_enough_workspace")


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES))


class FastPaths:
    """Unproven fast paths of one pack: (name, what replaces it, how to take it down), in the
    order they were put in place (a later one wraps an earlier one, so it is taken down first)."""

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log
        self.unproven: list[tuple[str, str, Callable[[], None]]] = []

    def add(self, name: str, fallback: str, take_down: Callable[[], None]) -> None:
        self.unproven.append((name, fallback, take_down))

    def run(self, step: Callable[[], _T]) -> _T:
        while self.unproven:
            try:
                out = step()
            except Exception as exc:  # noqa: BLE001 - re-raised once no fast path is left to blame
                if is_out_of_memory(exc):
                    raise
                name, fallback, take_down = self.unproven.pop()
                take_down()
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                self.log(f"{name} failed on the first step ({type(exc).__name__}: {first}); "
                         f"{fallback} from now on")
                continue
            self.unproven = []
            return out
        return step()


def wrap_forward(pack: PackedViT, cfg: RunConfig, device: torch.device, world: int) -> None:
    """The one place the loop wraps a pack's forward: DDP for several workers, then the compiled
    forward (`trainables.model.compiled`, imported only then) when ``cfg.compile`` and the device is CUDA."""
    if world > 1:
        pack.wrap(lambda module: torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None))
    if cfg.compile and device.type == "cuda":
        from trainables.model.compiled import compile_forward  # only a compiled run loads the compiler

        compile_forward(pack, mode=None if pack.stacked else "reduce-overhead")
