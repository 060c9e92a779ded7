"""The forward of a pack wrapped for DDP and/or `torch.compile`: the one place the loop wraps it.

K = 1: DDP (``world`` > 1), then ``torch.compile`` over the DDP module, in that order, so DDP's
gradient all-reduce hooks stay in the step (compiling the bare module under DDP would train each rank
on its own); on CUDA with CUDA graphs (mode "reduce-overhead": the whole forward's kernels replayed;
batch shapes are fixed, partial batches dropped), each call marked as a new step first.

K > 1: the vmapped forward (`PackedViT.forward_stacked`) compiled as one graph (Dynamo captures
``vmap(functional_call(...))`` without breaks), forward and backward, in the default mode: its inputs
are the stacked leaves, which CUDA graphs would copy into static buffers at every replay.

Compiling is opt-in (``compile=True``) until a GPU has measured it, and CUDA only in training (on the
CPU it measured slower). The compiler stack is imported only here, so an eager run never loads it.
A compile that fails on the first step falls back to the eager forward with one logged line
(`pack.fast_paths`).
"""

from __future__ import annotations

import torch

from trainables.config import RunConfig
from trainables.packed import PackedViT


def wrap_forward(pack: PackedViT, cfg: RunConfig, device: torch.device, world: int) -> None:
    """DDP for several workers, then torch.compile when ``cfg.compile`` and the device is CUDA."""
    if world > 1:
        pack.wrap(lambda module: torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None))
    if cfg.compile and device.type == "cuda":
        compile_forward(pack, mode=None if pack.stacked else "reduce-overhead")


def compile_forward(pack: PackedViT, *, mode: str | None = None, backend: str = "inductor") -> None:
    """Wrap the pack's forward in ``torch.compile(mode, backend)``; a failure on the first step takes
    it down again (the eager forward)."""
    def compiled(forward):
        graph = torch.compile(forward, mode=mode, backend=backend)
        if mode != "reduce-overhead":
            return graph

        def marked(*args, **kwargs):  # a new CUDA-graph step: the previous replay's outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
            return graph(*args, **kwargs)

        return marked

    undo = pack.wrap(compiled)
    pack.fast_paths.add(f"torch.compile ({backend})", "the eager forward", undo)
