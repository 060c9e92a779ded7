"""The training loop: plain PyTorch, no Ray.

    python -m trainables.train --dataset shapes --pe rope2d --epochs 2

One call of ``train(cfg, workdir)`` trains one model from a ``RunConfig``:

* per step, all on the device: the batch's images, augmented per image in
  chunks of several steps (``trainables.inputs``: in-memory splits live on the
  device; folder-backed ones are decoded by workers or on the GPU), then CutMix
  (soft targets; a share ``cutmix_prob`` of the batches), normalisation, RPT (a
  fresh patch permutation through the model's ``perm``), cross-entropy with
  optional label smoothing; bf16 autocast on CUDA, no host sync per step, fused
  AdamW, and ``torch.compile`` when ``compile`` is set (CUDA; ``trainables.compiled``);
* per epoch: train loss/accuracy, evaluation loss/top-1 on ``cfg.eval_split`` (a fixed subset of
  ``epoch_eval_images`` but after the last epoch: ``inputs.EpochEval``),
  learning rate, images/s, handed to ``report(metrics, checkpoint_dir)`` so a
  Ray layer can plug in without this module knowing Ray;
* a resumable checkpoint (model, optimiser, scheduler, epoch, RNG states,
  history, config) every ``checkpoint_every`` epochs (and at most every
  ``checkpoint_interval_s`` seconds: the launcher sets 120 s for GPU trials) and at the end, written
  atomically; only the latest is kept. A run whose ``workdir`` holds one
  continues from it. Every random draw is derived from (seed, epoch): the
  shuffle, each image's augmentation (keyed by (seed, epoch, index)), CutMix
  and RPT, so a resumed run draws what an uninterrupted one would have drawn,
  whatever the chunking or the number of workers. CPU and CUDA runs need not
  agree bit for bit; a bit-reproducible CUDA run needs
  ``torch.use_deterministic_algorithms(True)`` and
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` set before CUDA starts (the loop sets
  neither: bench/gpu_suite.py measures what they cost per step);
* small model-only snapshots (fp16) at log-spaced epochs 0, 1, 2, 4, ... and
  the last, for analysing when structure emerges.

Under ``torch.distributed`` (Ray Train's DDP workers) the model is wrapped in
DDP and each rank reads its shard; only rank 0 writes and reports.

``train_pack(cfgs, workdirs)`` is the same loop for K trials at once
(``trainables.packed``: stacked parameters under vmap; ``train`` is a pack of
one, the plain module). Each member has its own data order, draws, loss,
checkpoint and snapshots, exactly as alone; a member whose loss turns
non-finite leaves the pack at the end of that epoch, the others go on.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from records.vocab import did_not_learn
from trainables import checkpoints
from trainables.augment import augmentation
from trainables.compiled import wrap_forward
from trainables.config import RunConfig
from trainables.datasets import capped_subset, input_record, load_dataset
from trainables.fast_paths import is_out_of_memory
from trainables.images import to_device
from trainables.inputs import EpochEval, TrainSource, pack_epoch
from trainables.packed import PackedViT, mixed_precision
from trainables.protocols import cutmix_batch, normalize, soft_targets

Report = Callable[[dict[str, Any], "str | None"], None]
# Once per epoch, every member still in the pack: [(trial id, metrics, checkpoint dir or None), ...]
PackReport = Callable[[list[tuple[str, dict[str, Any], "str | None"]]], None]
# A member leaving the pack for a non-finite loss, at once: (trial id, its final dict with `error`)
Dropped = Callable[[str, dict[str, Any]], None]


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


def epoch_seed(seed: int, epoch: int, stream: int = 0) -> int:
    """An independent, reproducible RNG seed per (seed, epoch, purpose): stream 2 CutMix, 3 RPT."""
    return (seed * 1_000_003 + epoch * 7_919 + stream) % (2**63 - 1)


def build_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    """The one place the weight-decay rule lives (``cfg.decay_exempt``).

    ``timm``: no decay on biases, norms, the CLS token and learned PE parameters
    (``ViT.no_weight_decay``), as in timm/DeiT. ``none``: every parameter decays, which
    with ``adam`` is the literal ``torch.optim.Adam(model.parameters(), weight_decay=wd)``
    of Study P's table. ``adam`` adds the decay to the gradient (coupled L2); ``adamw``
    decouples it. Groups: [decayed, not decayed]; the second is empty under ``none``.
    Fused where torch has the kernel for the device (CUDA, CPU): a few launches per step instead of
    foreach's ~50, and its step counters live on the device (foreach reads them on the host)."""
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


def pack_step(pack: PackedViT, optimizer: torch.optim.Optimizer, cfgs: Sequence[RunConfig], batches, *,
              num_classes: int, mean, std, mix_gens: Sequence[torch.Generator], perm_gens: Sequence[torch.Generator],
              use_amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimiser step of every member of the pack, each on its own batch.

    batches[k]: member k's augmented uint8 images (B, 3, S, S) and labels (B,) on the device; cfgs[k],
    mix_gens[k], perm_gens[k]: its config and its epoch's CutMix and RPT generators. Per member:
    CutMix (``mix_batch``), normalisation, RPT, loss with its label smoothing; the summed loss gives
    each member exactly its own gradient. Returns the losses (K,) and the counts of images whose
    soft-target argmax (under CutMix the larger pasted share) was predicted (K,), as device tensors: reading them
    would sync the device. Until a step succeeds, a fast path that fails takes itself down
    (`pack.fast_paths`) and the forward and backward run again on the same inputs (drawn once)."""
    x, target, perms = step_inputs(cfgs, batches, num_classes=num_classes, mean=mean, std=std, mix_gens=mix_gens,
                                   perm_gens=perm_gens)

    def forward_backward() -> tuple[torch.Tensor, torch.Tensor]:
        losses, correct = member_losses(pack, x, target, perms, use_amp=use_amp)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        return losses.detach(), correct

    losses, correct = pack.fast_paths.run(forward_backward)
    optimizer.step()
    return losses, correct


def step_losses(pack: PackedViT, cfgs: Sequence[RunConfig], batches, *, num_classes: int, mean, std,
                mix_gens: Sequence[torch.Generator], perm_gens: Sequence[torch.Generator],
                use_amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The device half of `pack_step` up to the loss (what tests/fake_cuda.py runs on fake CUDA
    tensors): `step_inputs`, then `member_losses`. Nothing here reads a device value."""
    x, target, perms = step_inputs(cfgs, batches, num_classes=num_classes, mean=mean, std=std, mix_gens=mix_gens,
                                   perm_gens=perm_gens)
    return member_losses(pack, x, target, perms, use_amp=use_amp)


def step_inputs(cfgs: Sequence[RunConfig], batches, *, num_classes: int, mean, std,
                mix_gens: Sequence[torch.Generator], perm_gens: Sequence[torch.Generator]):
    """Per member CutMix, normalisation and the RPT permutation (the step's host draws): images
    (K, B, 3, S, S), soft targets (K, B, C), K permutations or None."""
    xs, targets, perms = [], [], []
    for cfg, (images, labels), mix_gen, perm_gen in zip(cfgs, batches, mix_gens, perm_gens):
        images, target = mix_batch(cfg, images, labels, num_classes, mix_gen)
        xs.append(normalize(images, mean, std))
        targets.append(target)
        perms.append(to_device(random_permutation(labels.numel(), cfg.model.num_patches, per_image=cfg.rpt_per_image,
                                                  generator=perm_gen), images.device) if cfg.rpt else None)
    # a pack of one takes a view, not a copy of its batch
    target = targets[0].unsqueeze(0) if len(targets) == 1 else torch.stack(targets)
    x = xs[0].unsqueeze(0) if len(xs) == 1 else torch.stack(xs)
    return x, target, perms


def member_losses(pack: PackedViT, x: torch.Tensor, target: torch.Tensor, perms, *,
                  use_amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward under `mixed_precision`: the losses (K,) (differentiable) and the correct counts (K,)."""
    with mixed_precision(x.device, use_amp):
        logits = pack(x, perms)  # (K, B, C)
    losses = pack.losses(logits, target)  # (K,)
    return losses, (logits.argmax(-1) == target.argmax(-1)).sum(-1)


def mix_batch(cfg: RunConfig, images: torch.Tensor, labels: torch.Tensor, num_classes: int,
              mix_gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One member's step input after CutMix: uint8 images (B, 3, S, S) and soft targets (B, C).

    A CutMix protocol mixes a share ``cutmix_prob`` of its batches (one box per batch, Lee et
    al.'s recipe); the coin is drawn only when ``cutmix_prob < 1``, so the default keeps the
    CutMix stream of earlier versions."""
    targets = soft_targets(labels, num_classes)
    if cfg.cutmix and (cfg.cutmix_prob >= 1 or float(torch.rand((), generator=mix_gen)) < cfg.cutmix_prob):
        images, targets = cutmix_batch(images, targets, generator=mix_gen)
    return images, targets


def random_permutation(batch: int, n: int, *, per_image: bool, generator: torch.Generator) -> torch.Tensor:
    """RPT permutation: (N,) shared by the batch (Study P) or (B, N) per image."""
    if per_image:
        return torch.rand(batch, n, generator=generator).argsort(dim=1)
    return torch.randperm(n, generator=generator)


def _all_reduce(values: list[float], device: torch.device) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _save_snapshot(model_state: dict[str, torch.Tensor], cfg: RunConfig, epoch: int, workdir: Path) -> None:
    # fp16 halves storage (a thousand trials x ~8 snapshots); analysis casts back.
    state = {k: v.half() if v.is_floating_point() else v for k, v in model_state.items()}
    checkpoints.save({"model": state, "config": cfg.to_flat(), "epoch": epoch},
                     workdir / checkpoints.SNAPSHOT_DIR / checkpoints.snapshot_name(epoch))


def train(cfg: RunConfig, workdir: str | os.PathLike, *, report: Report | None = None, log=print) -> dict[str, Any]:
    """Train one model; returns the final metrics, incl. ``test_acc`` on the full test
    split (None when the run evaluates on ``holdout``) and ``error`` (None, or why the
    run stopped: a non-finite training loss).

    ``workdir`` holds the resumable checkpoint and the snapshots; if it already
    holds a checkpoint the run continues from it. A pack of one: `train_pack`."""
    pack_report = None if report is None else (lambda members: report(*members[0][1:]))
    return train_pack([cfg], [workdir], report=pack_report, log=log)[0]


def train_pack(
    cfgs: Sequence[RunConfig],
    workdirs: Sequence[str | os.PathLike],
    *,
    report: PackReport | None = None,
    dropped: Dropped | None = None,
    log=print,
) -> list[dict[str, Any]]:
    """Train K trials together in one process (`trainables.packed`; K = 1 is the plain module, DDP-able).

    Each member keeps everything a trial has alone: its init (its seed), data order and augmentation
    draws, CutMix, RPT permutations and label smoothing, and its own ``workdir`` (checkpoint in the
    unpacked format, snapshots), so it resumes packed or unpacked. Members must share the pack key
    and resume from the same epoch. Once per epoch (no per-step host sync) a member whose training
    loss is non-finite is dropped with its reason; the others go on. ``report([(trial_id, metrics,
    checkpoint_dir), ...])`` is called once per epoch with every member still in the pack (so a Ray
    layer reports once per epoch); ``dropped(trial_id, final)`` at once when a member leaves (so it
    can be closed before the pack goes on). Returns one final dict per member, in order; a dropped
    member's has ``error`` set (why and at which epoch) and ``failed_epoch``."""
    if len(cfgs) != len(workdirs) or not cfgs:
        raise ValueError(f"train_pack needs one workdir per member config, got {len(cfgs)} configs, {len(workdirs)} workdirs")
    cfg = cfgs[0]  # everything in the pack key is the same for every member
    workdirs = [Path(w) for w in workdirs]
    device = resolve_device(cfg.device)
    rank, world = _rank(), (dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1)
    if world > 1 and len(cfgs) > 1:
        raise ValueError(f"a pack of {len(cfgs)} trials cannot run under DDP ({world} workers); DDP trials train alone")
    random.seed(cfg.seed)

    # The holdout split is fixed per data set (seed 0) so every trial tunes on the same images.
    data = load_dataset(cfg.dataset, cfg.data_root, seed=0, holdout_fraction=cfg.holdout_fraction)
    train_split = data.train
    if 0 < cfg.max_train_images < len(train_split):
        train_split = train_split.subset(capped_subset(train_split.labels, cfg.max_train_images))
    # One device copy of the split; each member reads it under its own protocol's augmentation.
    base = TrainSource(train_split, augmentation(cfg.protocol, data.name, data.img_size, cfg.crop_padding),
                       device=device, num_workers=cfg.num_workers)
    sources = [base.with_spec(augmentation(c.protocol, data.name, data.img_size, c.crop_padding)) for c in cfgs]
    evals_at = EpochEval(data.test if cfg.eval_split == "test" else data.holdout, cfg.epoch_eval_images, data.img_size,
                         device=device, num_workers=cfg.num_workers)
    batch_size = max(1, cfg.batch_size // world)
    inputs = input_record(data, train_split, cfg, device)  # the data set and device, for each member's run

    pack = PackedViT(cfgs, device, log=log)  # each member initialised from its own seed (init_member)
    optimizer = pack.optimizer(build_optimizer, cfg)
    steps_per_epoch = base.steps(batch_size, num_replicas=world)
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

    ckpt_paths = [checkpoints.local_checkpoint(w) for w in workdirs]
    start_epoch, histories = restore_pack(pack, optimizer, scheduler, ckpt_paths, device, log)
    if start_epoch == 1 and rank == 0:
        for k in range(pack.k):
            _save_snapshot(pack.member_state_dict(k), cfgs[k], 0, workdirs[k])

    wrap_forward(pack, cfg, device, world)
    use_amp = cfg.amp and device.type == "cuda"
    snapshots = set(snapshot_epochs(cfg.epochs))
    t_run = time.perf_counter()
    last_checkpoint = time.monotonic()
    members = list(range(len(cfgs)))  # original index of each member still in the pack
    finals: list[dict[str, Any]] = [{"error": None} for _ in cfgs]

    for epoch in range(start_epoch, cfg.epochs + 1):
        pack.train()
        _inject_divergence(pack, epoch)
        mix_gens = [torch.Generator().manual_seed(epoch_seed(cfgs[i].seed, epoch, 2)) for i in members]
        perm_gens = [torch.Generator().manual_seed(epoch_seed(cfgs[i].seed, epoch, 3)) for i in members]
        # Sums stay on the device: a per-step .item() would stall the GPU every step.
        loss_sum = torch.zeros(pack.k, device=device, dtype=torch.float64)
        correct = torch.zeros(pack.k, device=device, dtype=torch.float64)
        count = 0
        t0 = time.perf_counter()
        steps = pack_epoch([sources[i] for i in members], [cfgs[i].seed for i in members], epoch=epoch,
                           batch_size=batch_size, num_replicas=world, rank=rank)  # one call per protocol group
        for batches in steps:  # each member's augmented batch, already on the device
            losses, correct_here = pack_step(pack, optimizer, [cfgs[i] for i in members], batches,
                                             num_classes=data.num_classes, mean=data.mean, std=data.std,
                                             mix_gens=mix_gens, perm_gens=perm_gens, use_amp=use_amp)
            scheduler.step()
            batch = batches[0][1].numel()
            loss_sum += losses * batch
            correct += correct_here
            count += batch
        totals = _all_reduce([*loss_sum.tolist(), *correct.tolist(), count], device)
        loss_sums, corrects, count = totals[: pack.k], totals[pack.k : 2 * pack.k], totals[-1]
        train_time = time.perf_counter() - t0
        diverged = [k for k in range(pack.k) if not math.isfinite(loss_sums[k])]
        for k in diverged:
            i = members[k]
            finals[i] = {**(dict(histories[i][-1]) if histories[i] else {}), "error": (
                f"training loss is {loss_sums[k] / max(count, 1)} at epoch {epoch}: diverged"), "failed_epoch": epoch}
            log(f"[{cfgs[i].trial_id}] {finals[i]['error']}; dropped from the pack")
            if dropped is not None:
                dropped(cfgs[i].trial_id, _final(finals[i], histories[i], cfg, data.num_classes, inputs))
        if len(diverged) == pack.k:
            members = []
            break
        if diverged:
            keep = pack.drop(optimizer, diverged)
            loss_sums, corrects = [loss_sums[k] for k in keep], [corrects[k] for k in keep]
            members = [members[k] for k in keep]
        eval_source = evals_at.source(epoch, cfg.epochs)
        eval_batches = eval_source.batches(max(256, cfg.batch_size), num_replicas=world, rank=rank)
        evals = evaluate_pack(pack, eval_batches, data.mean, data.std, device, use_amp=use_amp)
        reports = []
        checkpoint_now = epoch == cfg.epochs or (
            epoch % cfg.checkpoint_every == 0 and time.monotonic() - last_checkpoint >= cfg.checkpoint_interval_s)
        if checkpoint_now:
            last_checkpoint = time.monotonic()
        # Every member's checkpoint is written before any report, so a crash in a report (or a killed
        # driver) leaves all members resumable from the same epoch, i.e. still one pack.
        for k, i in enumerate(members):
            metrics = {
                "epoch": epoch,
                "train_loss": loss_sums[k] / max(count, 1),
                "train_acc": corrects[k] / max(count, 1),
                "eval_loss": evals[k][0],
                "eval_acc": evals[k][1],
                "eval_images": len(eval_source.split),
                "lr": scheduler.get_last_lr()[0],
                "images_per_s": count / max(train_time, 1e-9),  # per member: a pack of K trains K x this
                "wall_time_s": time.perf_counter() - t_run,
            }
            histories[i].append(metrics)
            checkpoint_dir = None
            if rank == 0:
                if epoch in snapshots:
                    _save_snapshot(pack.member_state_dict(k), cfgs[i], epoch, workdirs[i])
                if checkpoint_now:
                    checkpoints.save(
                        {
                            "model": pack.member_state_dict(k),
                            "optimizer": pack.member_optimizer_state(optimizer, k),
                            "scheduler": scheduler.state_dict(),
                            "epoch": epoch,
                            **checkpoints.rng_state(device),
                            "history": histories[i],
                            "config": cfgs[i].to_flat(),
                        },
                        ckpt_paths[i],
                    )
                    checkpoint_dir = str(ckpt_paths[i].parent)
                log(
                    f"[{cfgs[i].trial_id}] epoch {epoch}/{cfg.epochs} loss {metrics['train_loss']:.3f} "
                    f"acc {metrics['train_acc']:.3f} {cfg.eval_split} {metrics['eval_acc']:.3f} "
                    f"lr {metrics['lr']:.2e} {metrics['images_per_s']:.0f} img/s"
                )
            reports.append((cfgs[i].trial_id, metrics, checkpoint_dir))
        if report is not None:
            report(reports)

    return [_final(finals[i], histories[i], cfg, data.num_classes, inputs) for i in range(len(cfgs))]


def _final(outcome: dict[str, Any], history: list[dict[str, Any]], cfg: RunConfig, num_classes: int,
           inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A member's final dict: its last epoch's metrics, `outcome` (error, failed_epoch), the summary, `inputs`."""
    final = {**(dict(history[-1]) if history else {}), "inputs": inputs}
    final.update(outcome)
    # Runs that tune on the holdout split never look at the test split.
    final["test_acc"] = final.get("eval_acc") if cfg.eval_split == "test" and final["error"] is None else None
    final["did_not_learn"] = did_not_learn(final.get("eval_acc"), num_classes)
    final["epochs_completed"] = len(history)
    final["history"] = list(history)
    return final


def train_pack_fitting(
    cfgs: Sequence[RunConfig], workdirs: Sequence[str | os.PathLike], *, report: PackReport | None = None,
    dropped: Dropped | None = None, log=print,
) -> list[dict[str, Any]]:
    """`train_pack`, retried in halves when the pack runs out of GPU memory: each half resumes from
    the members' own checkpoints, so work done before the error is kept (the epochs after the last
    checkpoint are trained and reported again: a caller keeps each epoch once). A member that does
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
        return train_pack(cfgs, workdirs, report=report, dropped=on_drop, log=log)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        if len(cfgs) == 1:
            raise RuntimeError(
                f"trial {cfgs[0].trial_id} runs out of GPU memory even alone at batch_size={cfgs[0].batch_size}: "
                f"{exc}"
            ) from exc
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


def restore_pack(pack: PackedViT, optimizer, scheduler, paths: list[Path], device: torch.device,
                 log=print) -> tuple[int, list[list[dict]]]:
    """Continue every member from its own checkpoint, or none (a fresh start): (start epoch, histories).

    Checkpoints are read to the CPU (`checkpoints.load`); the weights then go into the pack's device,
    the optimiser state where `Optimizer.load_state_dict` puts it, the RNG states stay CPU tensors."""
    found = [p.exists() for p in paths]
    if not any(found):
        return 1, [[] for _ in paths]
    if not all(found):
        missing = [c.trial_id for c, f in zip(pack.configs, found) if not f]
        raise ValueError(f"pack members {missing} have no checkpoint while the others do; members must resume "
                         "from the same epoch (the launcher packs trials by resume epoch)")
    states = [checkpoints.load(p) for p in paths]
    epochs = {s["epoch"] for s in states}
    if len(epochs) > 1:
        raise ValueError(f"pack members resume from different epochs {sorted(epochs)}; they must share one")
    load_pack_state(pack, optimizer, scheduler, states, device)
    for k, state in enumerate(states):
        log(f"[{pack.configs[k].trial_id}] resumed from epoch {state['epoch']}")
    return states[0]["epoch"] + 1, [list(s["history"]) for s in states]


def load_pack_state(pack: PackedViT, optimizer, scheduler, states: list[dict[str, Any]], device: torch.device) -> None:
    """Put loaded (CPU) checkpoint states, one per member, into a pack on `device`."""
    for k, state in enumerate(states):
        pack.load_member_state_dict(k, state["model"])
        pack.load_member_optimizer_state(optimizer, k, state["optimizer"])
    scheduler.load_state_dict(states[0]["scheduler"])
    checkpoints.restore_rng(states[0], device)


@torch.no_grad()
def evaluate_pack(pack: PackedViT, batches, mean, std, device: torch.device, *,
                  use_amp: bool = False) -> list[tuple[float, float]]:
    """(mean cross-entropy, top-1) per member over (uint8 images, labels) batches; one batch serves all.
    The forward runs under the training step's precision (`mixed_precision`); the loss in fp32.
    The sums stay on the device: one read at the end, none per batch."""
    pack.eval()
    loss_sum = torch.zeros(pack.k, device=device, dtype=torch.float64)
    correct = torch.zeros(pack.k, device=device, dtype=torch.float64)
    count = 0
    for images, labels in batches:
        x = normalize(images.to(device, non_blocking=True), mean, std)
        y = labels.to(device, non_blocking=True)
        with mixed_precision(device, use_amp):
            logits = pack(x)  # (K, B, C)
        logits = logits.float()
        # One call per member keeps each member's sum exactly what its unpacked evaluation adds up.
        loss_sum += torch.stack([F.cross_entropy(member, y, reduction="sum") for member in logits])
        correct += (logits.argmax(-1) == y).sum(-1)
        count += y.numel()
    totals = _all_reduce([*loss_sum.tolist(), *correct.tolist(), count], device)
    n = max(totals[-1], 1)
    return [(totals[k] / n, totals[pack.k + k] / n) for k in range(pack.k)]


# Test-only fault injection (not a RunConfig field): "TRIAL_ID:EPOCH" makes that member's weights
# non-finite at the start of that epoch, so its loss diverges and it must leave its pack alone.
DIVERGE_ENV = "VITSWEEP_TEST_DIVERGE"


def _inject_divergence(pack: PackedViT, epoch: int) -> None:
    spec = os.environ.get(DIVERGE_ENV)
    if not spec:
        return
    trial_id, _, at = spec.rpartition(":")
    if int(at) == epoch and trial_id in pack.trial_ids:
        k = pack.trial_ids.index(trial_id)
        state = pack.member_state_dict(k)
        state["head.weight"] = torch.full_like(state["head.weight"], float("inf"))
        pack.load_member_state_dict(k, state)


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
