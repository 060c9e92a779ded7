"""The packed forward's Linear layers as one matmul each: bias, and the LayerNorm before, folded in.

Why: vmap runs a batched ``F.linear`` as a matmul and a separate bias add, and its backward sums the
output gradient over the batch for the bias; LayerNorm's scale and shift add two weight-gradient
sums over the batch backward. With the input widened by `PAD` columns of ones (cuBLAS wants bf16
rows 16-byte aligned) and the weight by the bias and zeros,

    LayerNorm then Linear (qkv, fc1):  [xhat, 1..] @ [W diag(g), W beta + b, 0..]^T
    Linear after GELU (fc2):           [x, 1..] @ [W, b, 0..]^T

the matmul writes the biased output once, its weight gradient carries the bias's (and, through the
weight-sized fold, g's and beta's), and LayerNorm keeps only its normalisation. The attention's
projection is left as it is: its input comes from the fused attention kernel, so widening it would cost
a copy each way. The folded weights are made from the parameters in every forward (weight-sized work),
in the autocast dtype, so parameters, state_dict and checkpoints keep the ViT's layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD = 8  # columns of ones: a multiple of 8 bf16 elements


class FoldedLinear(nn.Module):
    """x (..., in) -> (..., out) through one matmul with the (out, in + PAD) folded weight."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.new_empty(linear.out_features, linear.in_features + PAD))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A cat, not a pad: the input's producer (LayerNorm, GELU) writes into the wider buffer in
        # its own kernel, where a pad would be a pass of its own over the wider range.
        x = x.to(self.weight.dtype)
        return F.linear(torch.cat([x, x.new_ones(*x.shape[:-1], PAD)], dim=-1), self.weight)


def fold_linears(base: nn.Module) -> list[tuple[str, str | None]]:
    """Swap, in place, each transformer block's qkv, fc1 and fc2 for `FoldedLinear` and the
    LayerNorms in front of qkv and fc1 for their normalisation alone; returns (Linear, its
    LayerNorm or None) by name, what `fold_params` folds."""
    plan = []
    for name, block in base.blocks.named_children():
        for norm, path in (("norm1", "attn.qkv"), ("norm2", "mlp.fc1"), (None, "mlp.fc2")):
            owner, linear = path.split(".")
            setattr(getattr(block, owner), linear, FoldedLinear(getattr(getattr(block, owner), linear)))
            if norm is not None:
                ln = getattr(block, norm)
                setattr(block, norm, nn.LayerNorm(ln.normalized_shape, eps=ln.eps, elementwise_affine=False))
            plan.append((f"blocks.{name}.{path}", f"blocks.{name}.{norm}" if norm else None))
    return plan


def fold_params(params: dict[str, torch.Tensor], plan: list[tuple[str, str | None]],
                low_precision: set[str], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Stacked parameters {name: (K, ...)} -> those of the folded module: each planned Linear's
    weight (K, out, in + PAD) in `dtype`, its bias and LayerNorm's folded in; the `low_precision`
    ones (the Linear layers left, such as the head) cast to `dtype` (None: as they are)."""
    out = {name: p.to(dtype) if dtype is not None and name in low_precision else p for name, p in params.items()}
    for linear, norm in plan:
        weight, bias = out.pop(f"{linear}.weight"), out.pop(f"{linear}.bias")
        if norm is not None:
            scale, shift = out.pop(f"{norm}.weight"), out.pop(f"{norm}.bias")
            # W beta as a product and sum, not a matvec: fp32 under autocast, and one pass over W with the scale
            bias, weight = bias + (weight * shift[..., None, :]).sum(-1), weight * scale[..., None, :]
        if dtype is not None:  # before the cat: one kernel writes the folded weight in its dtype
            weight, bias = weight.to(dtype), bias.to(dtype)
        out[f"{linear}.weight"] = torch.cat([weight, F.pad(bias[..., None], (0, PAD - 1))], dim=-1)
    return out
