"""The optimiser and its learning-rate schedule: Study P's recipe knobs (``optimizer``,
``decay_exempt``, ``weight_decay``, ``lr``, ``warmup_epochs``, ``schedule``) in one place."""

from __future__ import annotations

import math

import torch

from trainables.data.inputs import TrainSource
from trainables.config.run_config import RunConfig


def build_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    """The one place the weight-decay rule lives (``cfg.decay_exempt``).

    ``timm``: no decay on biases, norms, the CLS token and learned PE parameters (``ViT.no_weight_decay``),
    as in timm/DeiT. ``none``: every parameter decays, which with ``adam`` is the literal
    ``torch.optim.Adam(model.parameters(), weight_decay=wd)`` of Study P's table. ``adam`` adds the decay
    to the gradient (coupled L2); ``adamw`` decouples it. Groups: [decayed, not decayed]; the second is
    empty under ``none``. Fused where torch has the kernel for the device (CUDA, CPU): a few launches per
    step instead of foreach's ~50, and its step counters live on the device (foreach reads them on the host)."""
    skip = model.no_weight_decay() if cfg.decay_exempt == "timm" else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            exempt = cfg.decay_exempt == "timm" and (p.ndim <= 1 or name in skip)
            (no_decay if exempt else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = next(model.parameters()).device.type in ("cuda", "cpu")
    return (torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam)(groups, lr=cfg.lr, fused=fused)


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Linear warm-up to 1, then cosine decay to 0 (or constant)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def lr_scheduler(optimizer: torch.optim.Optimizer, cfg: RunConfig, source: TrainSource, batch_size: int,
                 world: int) -> torch.optim.lr_scheduler.LambdaLR:
    """`lr_factor` per optimiser step, over ``cfg.epochs`` epochs of `source`."""
    steps = source.steps(batch_size, num_replicas=world)
    if steps == 0:
        raise ValueError(f"batch_size {cfg.batch_size} is larger than the {source.length} training images of "
                         f"{cfg.dataset!r}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(
        step, warmup_steps=cfg.warmup_epochs * steps, total_steps=cfg.epochs * steps, schedule=cfg.schedule))
