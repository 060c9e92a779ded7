"""The training loop: plain PyTorch, no Ray.

    python -m trainables.train --dataset shapes --pe rope2d --epochs 2

One call of ``train(cfg, workdir)`` trains one model from a ``RunConfig``:

* per step, all on the device: the batch's images, augmented per image in
  chunks of several steps (``trainables.inputs``: in-memory splits live on the
  device; folder-backed ones are decoded by workers or on the GPU), then CutMix
  (soft targets; a share ``cutmix_prob`` of the batches), normalisation, RPT (a
  fresh patch permutation through the model's ``perm``), cross-entropy with
  optional label smoothing; bf16 autocast on CUDA, no host sync per step, and
  ``torch.compile`` with CUDA graphs when ``compile`` is set (CUDA only);
* per epoch: train loss/accuracy, evaluation loss/top-1 on ``cfg.eval_split``,
  learning rate, images/s, handed to ``report(metrics, checkpoint_dir)`` so a
  Ray layer can plug in without this module knowing Ray;
* a resumable checkpoint (model, optimiser, scheduler, epoch, RNG states,
  history, config) every ``checkpoint_every`` epochs and at the end, written
  atomically; only the latest is kept. A run whose ``workdir`` holds one
  continues from it. Every random draw is derived from (seed, epoch): the
  shuffle, each image's augmentation (keyed by (seed, epoch, index)), CutMix
  and RPT, so a resumed run draws what an uninterrupted one would have drawn,
  whatever the chunking or the number of workers;
  CPU and CUDA runs need not agree bit for bit. A bit-reproducible CUDA run
  needs ``torch.use_deterministic_algorithms(True)`` and
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` set before CUDA starts (the loop sets
  neither: bench/gpu_suite.py measures what they cost per step);
* small model-only snapshots (fp16) at log-spaced epochs 0, 1, 2, 4, ... and
  the last, for analysing when structure emerges.

Under ``torch.distributed`` (Ray Train's DDP workers) the model is wrapped in
DDP and each rank reads its shard; only rank 0 writes and reports.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainables.augment import augmentation
from trainables.config import RunConfig
from trainables.datasets import load_dataset
from trainables.images import to_device
from trainables.inputs import EvalSource, TrainSource
from trainables.protocols import cutmix_batch, normalize, soft_targets
from trainables.vit import ViT

Report = Callable[[dict[str, Any], "str | None"], None]

CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FILE = "state.pt"
SNAPSHOT_DIR = "snapshots"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is visible; use 'auto' or 'cpu'")
    return torch.device(name)


def snapshot_epochs(epochs: int) -> list[int]:
    """Log-spaced epochs 0 (untrained), 1, 2, 4, 8, ... plus the last."""
    marks = {0, epochs}
    e = 1
    while e < epochs:
        marks.add(e)
        e *= 2
    return sorted(marks)


def _epoch_seed(seed: int, epoch: int, stream: int = 0) -> int:
    # Independent, reproducible RNG stream per (seed, epoch, purpose).
    return (seed * 1_000_003 + epoch * 7_919 + stream) % (2**63 - 1)


def build_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    # No weight decay on biases, norms, the CLS token and learned PE parameters
    # (``ViT.no_weight_decay``), as in timm/DeiT; Adam gets coupled L2 decay as in Study P.
    skip = model.no_weight_decay()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr)
    return torch.optim.Adam(groups, lr=cfg.lr)


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Linear warm-up to 1, then cosine decay to 0 (or constant)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def random_permutation(batch: int, n: int, *, per_image: bool, generator: torch.Generator) -> torch.Tensor:
    """RPT permutation: (N,) shared by the batch (Study P) or (B, N) per image."""
    if per_image:
        return torch.rand(batch, n, generator=generator).argsort(dim=1)
    return torch.randperm(n, generator=generator)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, mean, std, device: torch.device) -> tuple[float, float]:
    """Mean cross-entropy and top-1 over (uint8 images, labels) batches."""
    model.eval()
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.float64)
    count = 0
    for images, y in batches:
        x = normalize(images.to(device, non_blocking=True), mean, std)
        y = y.to(device, non_blocking=True)
        logits = model(x).logits.float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
        count += y.numel()
    totals = _all_reduce([loss_sum.item(), correct.item(), count], device)
    return totals[0] / max(totals[2], 1), totals[1] / max(totals[2], 1)


def train_step(cfg: RunConfig, forward, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
               *, num_classes: int, mean, std, mix_gen: torch.Generator, perm_gen: torch.Generator,
               use_amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimiser step on augmented uint8 images (B, 3, S, S) and labels (B,), on their device:
    CutMix (a share cutmix_prob of batches), normalisation, RPT, loss with label smoothing.
    Returns the loss and the count of images whose dominant label (the CutMix base image's)
    was predicted, both as device tensors: reading them would sync the device."""
    targets = soft_targets(labels, num_classes)
    # The coin is drawn only when cutmix_prob < 1, so the default keeps the CutMix stream as it was.
    if cfg.cutmix and (cfg.cutmix_prob >= 1 or float(torch.rand((), generator=mix_gen)) < cfg.cutmix_prob):
        images, targets = cutmix_batch(images, targets, generator=mix_gen)
    x = normalize(images, mean, std)
    perm = None
    if cfg.rpt:
        perm = to_device(random_permutation(x.shape[0], cfg.model.num_patches, per_image=cfg.rpt_per_image,
                                            generator=perm_gen), x.device)
    if x.is_cuda:  # a new step for CUDA graphs (compiled forward); nothing for an eager one
        torch.compiler.cudagraph_mark_step_begin()
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=use_amp):
        logits = forward(x, perm=perm).logits
    loss = F.cross_entropy(logits.float(), targets, label_smoothing=cfg.protocol.smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach(), (logits.argmax(1) == targets.argmax(1)).sum()


def _all_reduce(values: list[float], device: torch.device) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _save_snapshot(model: torch.nn.Module, cfg: RunConfig, epoch: int, workdir: Path) -> None:
    # fp16 halves storage (a thousand trials x ~8 snapshots); analysis casts back.
    state = {k: v.half() if v.is_floating_point() else v for k, v in _unwrap(model).state_dict().items()}
    _atomic_save({"model": state, "config": cfg.to_flat(), "epoch": epoch}, workdir / SNAPSHOT_DIR / f"epoch_{epoch:04d}.pt")


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> tuple[ViT, RunConfig, int]:
    """Model, run config and epoch from a checkpoint or a snapshot file."""
    blob = torch.load(path, map_location=map_location, weights_only=False)
    cfg = RunConfig.from_flat(blob["config"])
    model = ViT(cfg.model)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in blob["model"].items()})
    return model.eval(), cfg, int(blob["epoch"])


def train(cfg: RunConfig, workdir: str | os.PathLike, *, report: Report | None = None, log=print) -> dict[str, Any]:
    """Train one model; returns the final metrics, incl. ``test_acc`` on the full test
    split (None when the run evaluates on ``holdout``).

    ``workdir`` holds the resumable checkpoint and the snapshots; if it already
    holds a checkpoint the run continues from it."""
    workdir = Path(workdir)
    device = resolve_device(cfg.device)
    rank, world = _rank(), (dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1)
    torch.manual_seed(cfg.seed)  # model initialisation
    random.seed(cfg.seed)

    # The holdout split is fixed per data set (seed 0) so every trial tunes on the same images.
    data = load_dataset(cfg.dataset, cfg.data_root, seed=0, holdout_fraction=cfg.holdout_fraction)
    train_split = data.train
    if 0 < cfg.max_train_images < len(train_split):
        train_split = train_split.subset(torch.arange(cfg.max_train_images))
    source = TrainSource(train_split, augmentation(cfg.protocol, data.name, data.img_size), device=device,
                         num_workers=cfg.num_workers)
    eval_source = EvalSource(data.test if cfg.eval_split == "test" else data.holdout, data.img_size, device=device,
                             num_workers=cfg.num_workers)
    batch_size = max(1, cfg.batch_size // world)

    model = ViT(cfg.model).to(device)
    optimizer = build_optimizer(model, cfg)
    steps_per_epoch = source.steps(batch_size, num_replicas=world)
    if steps_per_epoch == 0:
        raise ValueError(
            f"batch_size {cfg.batch_size} is larger than the {len(train_split)} training images of {cfg.dataset!r}"
        )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(
            step,
            warmup_steps=cfg.warmup_epochs * steps_per_epoch,
            total_steps=cfg.epochs * steps_per_epoch,
            schedule=cfg.schedule,
        ),
    )

    start_epoch, history = 1, []
    ckpt_path = workdir / CHECKPOINT_DIR / CHECKPOINT_FILE
    if ckpt_path.exists():
        state = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        log(f"[{cfg.trial_id}] resumed from epoch {state['epoch']}")
    elif rank == 0:
        _save_snapshot(model, cfg, 0, workdir)

    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    use_amp = cfg.amp and device.type == "cuda"
    # CUDA graphs (mode "reduce-overhead") replay the whole step's kernels: batch shapes are fixed
    # (partial batches dropped). On CPU compiling measured slower, so it stays off there.
    forward = torch.compile(model, mode="reduce-overhead") if cfg.compile and device.type == "cuda" else model
    snapshots = set(snapshot_epochs(cfg.epochs))
    t_run = time.perf_counter()

    for epoch in range(start_epoch, cfg.epochs + 1):
        model.train()
        mix_gen = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch, 2))
        perm_gen = torch.Generator().manual_seed(_epoch_seed(cfg.seed, epoch, 3))
        # Sums stay on the device: a per-step .item() would stall the GPU every step.
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        correct = torch.zeros((), device=device, dtype=torch.float64)
        count = 0
        t0 = time.perf_counter()
        for images, labels in source.epoch(seed=cfg.seed, epoch=epoch, batch_size=batch_size, num_replicas=world,
                                           rank=rank):
            loss, correct_here = train_step(cfg, forward, optimizer, images, labels, num_classes=data.num_classes,
                                            mean=data.mean, std=data.std, mix_gen=mix_gen, perm_gen=perm_gen,
                                            use_amp=use_amp)
            scheduler.step()
            loss_sum += loss.detach() * labels.numel()
            correct += correct_here
            count += labels.numel()
        loss_sum, correct, count = _all_reduce([loss_sum.item(), correct.item(), count], device)
        train_time = time.perf_counter() - t0
        eval_batches = eval_source.batches(max(256, cfg.batch_size), num_replicas=world, rank=rank)
        eval_loss, eval_acc = evaluate(model, eval_batches, data.mean, data.std, device)
        metrics = {
            "epoch": epoch,
            "train_loss": loss_sum / max(count, 1),
            "train_acc": correct / max(count, 1),
            "eval_loss": eval_loss,
            "eval_acc": eval_acc,
            "lr": scheduler.get_last_lr()[0],
            "images_per_s": count / max(train_time, 1e-9),
            "wall_time_s": time.perf_counter() - t_run,
        }
        history.append(metrics)
        checkpoint_dir = None
        if rank == 0:
            if epoch in snapshots:
                _save_snapshot(model, cfg, epoch, workdir)
            if epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs:
                _atomic_save(
                    {
                        "model": _unwrap(model).state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "epoch": epoch,
                        "torch_rng": torch.get_rng_state(),
                        "python_rng": random.getstate(),
                        "history": history,
                        "config": cfg.to_flat(),
                    },
                    ckpt_path,
                )
                checkpoint_dir = str(ckpt_path.parent)
            log(
                f"[{cfg.trial_id}] epoch {epoch}/{cfg.epochs} loss {metrics['train_loss']:.3f} "
                f"acc {metrics['train_acc']:.3f} {cfg.eval_split} {eval_acc:.3f} "
                f"lr {metrics['lr']:.2e} {metrics['images_per_s']:.0f} img/s"
            )
        if report is not None:
            report(metrics, checkpoint_dir)

    final = dict(history[-1]) if history else {}
    # Runs that tune on the holdout split never look at the test split.
    final["test_acc"] = final.get("eval_acc") if cfg.eval_split == "test" else None
    final["epochs_completed"] = len(history)
    final["history"] = history
    return final


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m trainables.train",
        description="Train one ViT without Ray. Example: python -m trainables.train --dataset shapes --pe rope2d --epochs 2",
    )
    parser.add_argument("--dataset", default="shapes")
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--preset", default="study_l")
    parser.add_argument("--pe", default="ape")
    parser.add_argument("--protocol", default="baseline")
    parser.add_argument("--rpt", action="store_true", help="random permutation of patch tokens in training")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="results/adhoc")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any run-config field")
    args = parser.parse_args(argv)
    fields = {
        "data_root": args.data_root,
        "pe": args.pe,
        "protocol": args.protocol,
        "rpt": args.rpt,
        "epochs": args.epochs,
        "warmup_epochs": min(args.epochs, RunConfig.warmup_epochs),
        "seed": args.seed,
        **dict(kv.split("=", 1) for kv in args.set),
    }
    cfg = RunConfig.for_dataset(args.dataset, preset=args.preset, **fields)
    final = train(cfg, Path(args.workdir) / cfg.trial_id)
    print(f"final {cfg.eval_split} accuracy {final['eval_acc']:.4f}")
    return final


if __name__ == "__main__":
    main()
