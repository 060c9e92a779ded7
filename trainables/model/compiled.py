"""A pack's forward under `torch.compile` (`trainables.model.fast_paths.wrap_forward` decides when).

K = 1: ``torch.compile`` over the module as the loop wrapped it (after DDP, so DDP's gradient
all-reduce hooks stay in the step: compiling the bare module under DDP would train each rank on its
own); on CUDA with CUDA graphs (mode "reduce-overhead": the whole forward's kernels replayed; batch
shapes are fixed, partial batches dropped), each call marked as a new step first.

K > 1: the vmapped forward (`PackedViT.forward_stacked`) compiled as one graph (Dynamo captures
``vmap(functional_call(...))`` without breaks), forward and backward, in the default mode: its inputs
are the stacked leaves, which CUDA graphs would copy into static buffers at every replay.

Compiling is opt-in (``compile=True``) until a GPU has measured it, and CUDA only in training (on the
CPU it measured slower). Only a compiled run imports this module, so an eager run never loads the
compiler (`torch.compile` and CUDA graphs' step marks import it on first use).
A compile that fails on the first step falls back to the eager forward with one logged line
(`pack.fast_paths`).

Only the training step runs the compiled graph: a forward with gradients off (`evaluate_pack`, under
``torch.no_grad``) runs the eager forward it wraps. Compiled, the evaluation would add graphs of its
own per trial (Dynamo guards on grad mode, and the last partial batch makes the batch size dynamic:
two more compiles, measured with ``aot_eager``), after the first training step has already proven the
compile, so a failing evaluation compile would end the trial instead of falling back; and the
evaluation is a small share of the epoch's forward work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only: packed imports this module (through fast_paths) to compile
    from trainables.model.packed import PackedViT


def compile_forward(pack: PackedViT, *, mode: str | None = None, backend: str | Callable = "inductor") -> None:
    """Wrap the pack's forward in ``torch.compile(mode, backend)``; a failure on the first step takes
    it down again (the eager forward)."""
    def compiled(forward):
        graph = torch.compile(forward, mode=mode, backend=backend)

        def training_only(*args, **kwargs):  # evaluation (no grad) runs eager: see the module docstring
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            if mode == "reduce-overhead":  # a new CUDA-graph step: the previous replay's outputs may be reused
                torch.compiler.cudagraph_mark_step_begin()
            return graph(*args, **kwargs)

        return training_only

    undo = pack.wrap(compiled)
    pack.fast_paths.add(f"torch.compile ({backend})", "the eager forward", undo)
