"""The training loop: plain PyTorch, no Ray.

    python -m trainables.loop.train --dataset shapes --pe rope2d --epochs 2

``train(cfg, workdir)`` trains one model from a ``RunConfig``; ``train_pack(cfgs, workdirs)`` trains K
at once (``trainables.model.packed``: stacked parameters under vmap; ``train`` is a pack of one). Each member
has its own data order, draws, loss, checkpoint and snapshots, exactly as alone; one whose loss turns
non-finite leaves the pack at the end of that epoch, the others go on.

* per step, on the device: images augmented per image in chunks of several steps (``trainables.data.inputs``),
  CutMix (a share ``cutmix_prob`` of the batches), normalisation, RPT (a fresh patch permutation through
  the model's ``perm``), cross-entropy with optional label smoothing; bf16 autocast on CUDA, no host
  sync per step, fused AdamW, ``torch.compile`` when ``compile`` is set (``trainables.model.compiled``);
* per epoch: train loss/accuracy, evaluation on ``cfg.eval_split`` (``inputs.EpochEval``), learning
  rate, images/s, handed to ``report`` so a Ray layer can plug in without this module knowing Ray;
* a resumable checkpoint (``checkpoints.save_member``) every ``checkpoint_every`` epochs (at most every
  ``checkpoint_interval_s`` seconds) and at the end; a ``workdir`` holding one continues from it. Every
  random draw derives from (seed, epoch), per image from (seed, epoch, index), so a resumed run draws
  what an uninterrupted one would have, whatever the chunking or the number of workers. CPU and CUDA
  runs need not agree bit for bit; a bit-reproducible CUDA run needs ``torch.use_deterministic_algorithms(True)``
  and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which the loop does not set (bench/gpu_suite.py measures their cost);
* fp16 model-only snapshots at log-spaced epochs 0, 1, 2, 4, ... and the last: when structure emerges.

Under ``torch.distributed`` (Ray Train's DDP workers) the model is wrapped in DDP and each rank reads
its shard; only rank 0 writes and reports.
"""

from __future__ import annotations

import argparse
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
from trainables.data.augment import StepDraws, augmentation, step_batch
from trainables.data.datasets import capped_subset, input_record, load_dataset
from trainables.data.images import normalize
from trainables.data.inputs import EpochEval, TrainSource, pack_epoch
from trainables.data.protocols import cutmix_draw
from trainables.loop import checkpoints
from trainables.loop.optim import build_optimizer, lr_scheduler
from trainables.model.fast_paths import wrap_forward
from trainables.model.packed import PackedViT, mixed_precision
from trainables.config.run_config import FIELD_SPECS, RunConfig

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


def pack_step(pack: PackedViT, optimizer: torch.optim.Optimizer, cfgs: Sequence[RunConfig], batches, *,
              num_classes: int, mean, std, mix_gens: Sequence[torch.Generator], perm_gens: Sequence[torch.Generator],
              use_amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimiser step of every member of the pack, each on its own batch.

    batches[k]: member k's augmented uint8 images (B, 3, S, S) and labels (B,) on the device; cfgs[k],
    mix_gens[k], perm_gens[k]: its config and its epoch's CutMix and RPT generators. Per member: CutMix,
    normalisation, RPT (``step_inputs``: drawn per member, applied to the pack at once), loss with its
    label smoothing; the summed loss gives each member exactly its own gradient. Returns the losses (K,)
    and the counts of images whose soft-target argmax (under CutMix the larger pasted share) was
    predicted (K,), as device tensors: reading them would sync the device. Until a step succeeds, a fast
    path that fails takes itself down (`pack.fast_paths`) and the forward and backward run again on the
    same inputs (drawn once)."""
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


def step_inputs(cfgs: Sequence[RunConfig], batches, *, num_classes: int, mean, std,
                mix_gens: Sequence[torch.Generator], perm_gens: Sequence[torch.Generator]):
    """The step's host draws per member (`mix_draw`, `random_permutation`, each from its own
    generators), applied to the whole pack at once (`augment.step_batch`: CutMix, normalisation and the
    permutations in one copy): images (K, B, 3, S, S), soft targets (K, B, C), the permutations."""
    draws = []
    for cfg, (images, labels), mix_gen, perm_gen in zip(cfgs, batches, mix_gens, perm_gens):
        box, partner = mix_draw(cfg, labels.numel(), images.shape[-1], mix_gen)
        perm = random_permutation(labels.numel(), cfg.model.num_patches, per_image=cfg.rpt_per_image,
                                  generator=perm_gen) if cfg.rpt else None
        draws.append(StepDraws(box, partner, perm))
    return step_batch(batches, draws, num_classes=num_classes, mean=mean, std=std)


def member_losses(pack: PackedViT, x: torch.Tensor, target: torch.Tensor, perms, *,
                  use_amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward under `mixed_precision`: the losses (K,) (differentiable) and the correct counts (K,)."""
    with mixed_precision(x.device, use_amp):
        logits = pack(x, perms)  # (K, B, C)
    losses = pack.losses(logits, target)  # (K,)
    return losses, (logits.argmax(-1) == target.argmax(-1)).sum(-1)


def mix_draw(cfg: RunConfig, batch: int, side: int, mix_gen: torch.Generator):
    """One member's CutMix draws for a batch (`protocols.cutmix_draw`: box, partners), or (None, None). A
    CutMix protocol mixes a share ``cutmix_prob`` of its batches (one box per batch, Lee et al.'s recipe);
    the coin is drawn only when ``cutmix_prob < 1``, so the default keeps the CutMix stream of earlier versions."""
    if cfg.cutmix and (cfg.cutmix_prob >= 1 or float(torch.rand((), generator=mix_gen)) < cfg.cutmix_prob):
        return cutmix_draw(batch, side, side, mix_gen)
    return None, None


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


def _rank_and_world() -> tuple[int, int]:
    distributed = dist.is_available() and dist.is_initialized()
    return (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)


def train(cfg: RunConfig, workdir: str | os.PathLike, *, report: Report | None = None, log=print) -> dict[str, Any]:
    """Train one model; returns the final metrics, incl. ``test_acc`` on the full test split (None when the
    run evaluates on ``holdout``) and ``error`` (None, or why the run stopped: a non-finite training loss).
    ``workdir`` holds the resumable checkpoint and the snapshots; if it already holds a checkpoint the run
    continues from it. A pack of one: `train_pack`."""
    pack_report = None if report is None else (lambda members: report(*members[0][1:]))
    return train_pack([cfg], [workdir], report=pack_report, log=log)[0]


def train_pack(
    cfgs: Sequence[RunConfig],
    workdirs: Sequence[str | os.PathLike],
    *,
    report: PackReport | None = None,
    dropped: Dropped | None = None,
    log=print,
    states: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Train K trials together in one process (`trainables.model.packed`; K = 1 is the plain module, DDP-able).

    Each member keeps everything a trial has alone: its init (its seed), data order and augmentation
    draws, CutMix, RPT permutations and label smoothing, and its own ``workdir`` (checkpoint in the
    unpacked format, snapshots), so it resumes packed or unpacked. Members must share the pack key
    and resume from the same epoch. Once per epoch (no per-step host sync) a member whose training
    loss is non-finite is dropped with its reason; the others go on. ``report([(trial_id, metrics,
    checkpoint_dir), ...])`` is called once per epoch with every member still in the pack (so a Ray
    layer reports once per epoch); ``dropped(trial_id, final)`` at once when a member leaves (so it
    can be closed before the pack goes on). Returns one final dict per member, in order; a dropped
    member's has ``error`` set (why and at which epoch) and ``failed_epoch``. ``states``: the members'
    checkpoints as a caller already loaded them (`checkpoints.load`), else each is read from its workdir."""
    if len(cfgs) != len(workdirs) or not cfgs:
        raise ValueError(f"train_pack needs one workdir per member config, got {len(cfgs)} configs, "
                         f"{len(workdirs)} workdirs")
    cfg = cfgs[0]  # everything in the pack key is the same for every member
    workdirs = [Path(w) for w in workdirs]
    device = resolve_device(cfg.device)
    rank, world = _rank_and_world()
    if world > 1 and len(cfgs) > 1:
        raise ValueError(f"a pack of {len(cfgs)} trials cannot run under DDP ({world} workers); DDP trials train alone")
    random.seed(cfg.seed)
    data, sources, evals_at, inputs = pack_inputs(cfgs, device)
    batch_size = max(1, cfg.batch_size // world)

    pack = PackedViT(cfgs, device, log=log)  # each member initialised from its own seed (init_member)
    optimizer = pack.optimizer(build_optimizer, cfg)
    scheduler = lr_scheduler(optimizer, cfg, sources[0], batch_size, world)
    start_epoch, histories = checkpoints.restore_pack(pack, optimizer, scheduler,
                                                      [checkpoints.local_checkpoint(w) for w in workdirs], device, log,
                                                      states=states)
    if start_epoch == 1 and rank == 0:
        for k in range(pack.k):
            checkpoints.save_snapshot(pack.member_state_dict(k), cfgs[k], 0, workdirs[k])

    wrap_forward(pack, cfg, device, world)
    use_amp = cfg.amp and device.type == "cuda"
    snapshots = set(snapshot_epochs(cfg.epochs))
    t_run, last_checkpoint = time.perf_counter(), time.monotonic()
    members = list(range(len(cfgs)))  # original index of each member still in the pack
    finals: list[dict[str, Any]] = [{"error": None} for _ in cfgs]

    for epoch in range(start_epoch, cfg.epochs + 1):
        pack.train()
        t0 = time.perf_counter()
        loss_sums, corrects, count = train_epoch(pack, optimizer, scheduler, [cfgs[i] for i in members],
                                                 [sources[i] for i in members], data, epoch=epoch,
                                                 batch_size=batch_size, use_amp=use_amp)
        train_time = time.perf_counter() - t0
        diverged = [k for k in range(pack.k) if not math.isfinite(loss_sums[k])]
        for k in diverged:
            i = members[k]
            finals[i] = {"error": f"training loss is {loss_sums[k] / max(count, 1)} at epoch {epoch}: diverged",
                         "failed_epoch": epoch}
            log(f"[{cfgs[i].trial_id}] {finals[i]['error']}; dropped from the pack")
            if dropped is not None:
                dropped(cfgs[i].trial_id, _final(finals[i], histories[i], cfg, data.num_classes, inputs))
        if len(diverged) == pack.k:
            break
        if diverged:
            keep = pack.drop(optimizer, diverged)
            loss_sums, corrects, members = ([values[k] for k in keep] for values in (loss_sums, corrects, members))
        eval_source = evals_at.source(epoch, cfg.epochs)
        eval_batches = eval_source.batches(max(256, cfg.batch_size), num_replicas=world, rank=rank)
        evals = evaluate_pack(pack, eval_batches, data.mean, data.std, device, use_amp=use_amp)
        checkpoint_now = epoch == cfg.epochs or (
            epoch % cfg.checkpoint_every == 0 and time.monotonic() - last_checkpoint >= cfg.checkpoint_interval_s)
        last_checkpoint = time.monotonic() if checkpoint_now else last_checkpoint
        # Every member's checkpoint is written before any report, so a crash in a report (or a killed
        # driver) leaves all members resumable from the same epoch, i.e. still one pack.
        reports = []
        for k, i in enumerate(members):
            histories[i].append({
                "epoch": epoch, "train_loss": loss_sums[k] / max(count, 1), "train_acc": corrects[k] / max(count, 1),
                "eval_loss": evals[k][0], "eval_acc": evals[k][1], "eval_images": len(eval_source.split),
                "lr": scheduler.get_last_lr()[0],
                "images_per_s": count / max(train_time, 1e-9),  # per member: a pack of K trains K x this
                "wall_time_s": time.perf_counter() - t_run})
            checkpoint_dir = None
            if rank == 0:
                if epoch in snapshots:
                    checkpoints.save_snapshot(pack.member_state_dict(k), cfgs[i], epoch, workdirs[i])
                if checkpoint_now:
                    checkpoint_dir = checkpoints.save_member(pack, k, optimizer, scheduler, histories[i], workdirs[i])
                log_epoch(cfgs[i], histories[i][-1], log)
            reports.append((cfgs[i].trial_id, histories[i][-1], checkpoint_dir))
        if report is not None:
            report(reports)

    return [_final(finals[i], histories[i], cfg, data.num_classes, inputs) for i in range(len(cfgs))]


def pack_inputs(cfgs: Sequence[RunConfig], device: torch.device):
    """(the data set, each member's training source, the per-epoch evaluation, the input record). The
    holdout split is fixed per data set (seed 0), so every trial tunes on the same images; the training
    split has one device copy, which each member reads under its own protocol's augmentation."""
    cfg = cfgs[0]
    data = load_dataset(cfg.dataset, cfg.data_root, seed=0, holdout_fraction=cfg.holdout_fraction)
    train_split = data.train
    if 0 < cfg.max_train_images < len(train_split):
        train_split = train_split.subset(capped_subset(train_split.labels, cfg.max_train_images))
    base = TrainSource(train_split, augmentation(cfg.protocol, data.name, data.img_size, cfg.crop_padding),
                       device=device, num_workers=cfg.num_workers, gpu_decode=cfg.gpu_decode)
    sources = [base.with_spec(augmentation(c.protocol, data.name, data.img_size, c.crop_padding)) for c in cfgs]
    evals_at = EpochEval(data.test if cfg.eval_split == "test" else data.holdout, cfg.epoch_eval_images, data.img_size,
                         device=device, num_workers=cfg.num_workers)
    return data, sources, evals_at, input_record(data, train_split, cfg, device)


def train_epoch(pack: PackedViT, optimizer, scheduler, cfgs: Sequence[RunConfig], sources: Sequence[TrainSource],
                data, *, epoch: int, batch_size: int, use_amp: bool) -> tuple[list[float], list[float], float]:
    """One epoch of every member, each under its own draws: (summed losses (K), correct counts (K), images
    per member), over every rank. The sums stay on the device: a per-step .item() would stall the GPU."""
    rank, world = _rank_and_world()
    device = pack.device
    mix_gens = [torch.Generator().manual_seed(epoch_seed(c.seed, epoch, 2)) for c in cfgs]
    perm_gens = [torch.Generator().manual_seed(epoch_seed(c.seed, epoch, 3)) for c in cfgs]
    loss_sum, correct = torch.zeros(2, pack.k, device=device, dtype=torch.float64)  # (K,) each
    count = 0
    steps = pack_epoch(sources, [c.seed for c in cfgs], epoch=epoch, batch_size=batch_size, num_replicas=world,
                       rank=rank)  # one call per protocol group
    for batches in steps:  # each member's augmented batch, already on the device
        losses, correct_here = pack_step(pack, optimizer, cfgs, batches, num_classes=data.num_classes,
                                         mean=data.mean, std=data.std, mix_gens=mix_gens, perm_gens=perm_gens,
                                         use_amp=use_amp)
        scheduler.step()
        batch = batches[0][1].numel()
        loss_sum += losses * batch
        correct += correct_here
        count += batch
    totals = _all_reduce([*loss_sum.tolist(), *correct.tolist(), count], device)
    return totals[: pack.k], totals[pack.k : 2 * pack.k], totals[-1]


def log_epoch(cfg: RunConfig, metrics: dict[str, Any], log) -> None:
    log(f"[{cfg.trial_id}] epoch {metrics['epoch']}/{cfg.epochs} loss {metrics['train_loss']:.3f} "
        f"acc {metrics['train_acc']:.3f} {cfg.eval_split} {metrics['eval_acc']:.3f} "
        f"lr {metrics['lr']:.2e} {metrics['images_per_s']:.0f} img/s")


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


@torch.no_grad()
def evaluate_pack(pack: PackedViT, batches, mean, std, device: torch.device, *,
                  use_amp: bool = False) -> list[tuple[float, float]]:
    """(mean cross-entropy, top-1) per member over (uint8 images, labels) batches; one batch serves all.
    The forward runs under the training step's precision (`mixed_precision`); the loss in fp32.
    The sums stay on the device: one read at the end, none per batch."""
    pack.eval()
    loss_sum, correct = torch.zeros(2, pack.k, device=device, dtype=torch.float64)  # (K,) each
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m trainables.loop.train", description=(
        "Train one ViT without Ray. Example: python -m trainables.loop.train --dataset shapes --pe rope2d --epochs 2"))
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
    fields = {name: getattr(args, name) for name in ("data_root", "pe", "protocol", "rpt", "epochs", "seed")}
    fields["warmup_epochs"] = min(args.epochs, RunConfig.warmup_epochs)
    for key, _, value in (kv.partition("=") for kv in args.set):  # any run-config field, these included
        fields[key] = FIELD_SPECS[key].parse(key, value) if key in FIELD_SPECS else value
    cfg = RunConfig.for_dataset(args.dataset, preset=args.preset, **fields)
    final = train(cfg, Path(args.workdir) / cfg.trial_id)
    print(f"final {cfg.eval_split} accuracy {final['eval_acc']:.4f}")
    return final


if __name__ == "__main__":
    main()
