"""Packed training throughput: images/s per process for K = 1, 2, 4, 8 members, against K = 1 (one plain ViT).

One step = forward + per-member cross-entropy + backward + AdamW step on fixed synthetic batches (no data
loading), each member its own batch of B images, so a K-pack trains K x B images per step. Baseline:
K = 1, which `PackedViT` runs as the plain module (what an unpacked trial trains), timed side by side in
the same run. Timing windows alternate between configurations over repeats (order
rotated each repeat), so drift in machine load hits all; the headline is the median of per-repeat ratios
of images/s against K = 1. On a shared CPU, process CPU time is the fairer clock (wall time
measures the neighbours too); both are printed.

    .venv/bin/python bench/packing.py                                 # CPU: preset tiny, batch 32
    .venv/bin/python bench/packing.py --preset study_l --batch-size 128 --device cuda --amp
    .venv/bin/python bench/packing.py --inputs                        # the step's inputs: per member vs batched

On CPU the step is compute-bound, so packing is expected near 1x per image there (it saves the per-trial
Ray overhead, not kernel time); the GPU gain, where a study_l step is launch-bound, is measured by
bench/gpu_suite.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from trainables.data.augment import StepDraws, step_batch
from trainables.data.images import normalize, to_device
from trainables.data.protocols import cutmix_draw, soft_targets
from trainables.loop import train
from trainables.loop.optim import build_optimizer
from trainables.model.packed import PackedViT
from trainables.config.run_config import RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the lone step's CutMix lives there
from reference import cutmix_batch  # noqa: E402


def member_configs(preset: str, k: int) -> list[RunConfig]:
    return [RunConfig.for_dataset("cifar10", preset=preset, seed=seed, data_root="/unused") for seed in range(k)]


def packed_step(cfgs: list[RunConfig], images, targets, amp: bool, device: torch.device):
    pack = PackedViT(cfgs, device).train()
    optimizer = pack.optimizer(build_optimizer)
    k = len(cfgs)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = pack(images[:k])
        loss = pack.losses(logits, targets[:k]).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def timed(step, steps: int, device: torch.device, max_seconds: float = float("inf")) -> tuple[float, float, int]:
    """(wall seconds, process CPU seconds, steps run) for up to `steps` steps, stopping early once
    `max_seconds` of wall time have passed; CUDA synchronised at both ends."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    done = 0
    while done < steps and (done == 0 or time.perf_counter() - wall < max_seconds):
        step()
        done += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu, done


def synthetic_batches(cfgs: list[RunConfig], batch: int, device: torch.device, seed: int = 0):
    """Fixed (K, B, 3, S, S) images and (K, B, C) one-hot targets, one batch per member."""
    side, classes = cfgs[0].model.img_size, cfgs[0].model.num_classes
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(len(cfgs), batch, 3, side, side, generator=g).to(device)
    targets = F.one_hot(torch.randint(0, classes, (len(cfgs), batch), generator=g), classes).float().to(device)
    return images, targets


def measure(
    device: torch.device, *, preset: str, batch: int, sizes: list[int], steps: int, repeats: int, warmup: int,
    amp: bool, max_seconds: float = float("inf"),
) -> dict[str, dict[str, float]]:
    """images/s per process for each K in `sizes` (1 always included, the baseline), side by side.

    Each timing window runs `steps` steps or stops after `max_seconds`; returns, per "K=k": wall and
    process-CPU images/s (medians), the median per-repeat ratio against K = 1 (wall time on CUDA,
    process time on CPU), and on CUDA the peak memory of a step per member (MiB)."""
    sizes = sorted({1, *sizes})
    cfgs = member_configs(preset, max(sizes))
    images, targets = synthetic_batches(cfgs, batch, device)
    configs, memory = {}, {}
    for k in sizes:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        configs[f"K={k}"] = (k, packed_step(cfgs[:k], images, targets, amp, device))
        timed(configs[f"K={k}"][1], warmup, device, max_seconds)
        if device.type == "cuda":
            memory[f"K={k}"] = (torch.cuda.max_memory_allocated(device) - base) / k / 2**20
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}  # (wall, cpu) images/s
    names = list(configs)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            k, step = configs[name]
            wall, cpu, done = timed(step, steps, device, max_seconds)
            n = k * batch * done
            rates[name].append((n / wall, n / max(cpu, 1e-9)))
    clock = 0 if device.type == "cuda" else 1
    summary = {}
    for name in names:
        summary[name] = {
            "images_per_s_wall": statistics.median(r[0] for r in rates[name]),
            "images_per_s_cpu": statistics.median(r[1] for r in rates[name]),
            "ratio_to_k1": statistics.median(r[clock] / b[clock] for r, b in zip(rates[name], rates["K=1"])),
            **({"mib_per_member": memory[name]} if name in memory else {}),
        }
    return summary


def loss_drift(device: torch.device, *, preset: str, batch: int, k: int, steps: int, amp: bool) -> float:
    """Largest relative difference between a K-pack's member losses and the same members trained alone
    (K = 1, the plain module), after `steps` steps on fixed batches: the packed-vs-alone gap that bf16
    autocast leaves (in fp32 it stays near rounding; tests/test_packed.py asserts 1e-4 there)."""
    cfgs = member_configs(preset, k)
    images, targets = synthetic_batches(cfgs, batch, device, seed=1)

    def final_losses(pack: PackedViT, x, t) -> torch.Tensor:
        optimizer = pack.optimizer(build_optimizer)
        for _ in range(steps):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = pack(x)
            losses = pack.losses(logits, t)
            optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            optimizer.step()
        return losses.detach().float().cpu()

    packed = final_losses(PackedViT(cfgs, device).train(), images, targets)
    alone = torch.cat([final_losses(PackedViT([c], device).train(), images[i : i + 1], targets[i : i + 1])
                       for i, c in enumerate(cfgs)])
    return float(((packed - alone).abs() / alone.abs()).max())


# -- the step's inputs: per member (before) against batched over the pack (after) ----------------------------


def input_configs(preset: str, k: int, batch: int) -> list[RunConfig]:
    """A mixed pack as a study packs it: CutMix on every other member, RPT none / per batch / per image."""
    protocols, rpt = ("cutmix", "baseline"), (None, "batch", "image")
    return [RunConfig.for_dataset("cifar10", preset=preset, seed=seed, data_root="/unused", batch_size=batch,
                                  protocol=protocols[seed % 2], rpt=rpt[seed % 3] is not None,
                                  rpt_per_image=rpt[seed % 3] == "image") for seed in range(k)]


def per_member_inputs(cfgs, batches, *, num_classes, mean, std, mix_gens, perm_gens):
    """`train.step_inputs` before `augment.step_batch` (commit f011b34), written out: per member its
    CutMix (`reference.cutmix_batch`: a copy of its partners), normalisation and a copy of its permutation."""
    xs, targets, perms = [], [], []
    for cfg, (images, labels), mix_gen, perm_gen in zip(cfgs, batches, mix_gens, perm_gens):
        target = soft_targets(labels, num_classes)
        if cfg.cutmix:  # cutmix_prob 1: no coin
            images, target = cutmix_batch(images, target, generator=mix_gen)
        xs.append(normalize(images, mean, std))
        targets.append(target)
        perms.append(to_device(train.random_permutation(labels.numel(), cfg.model.num_patches,
                                                        per_image=cfg.rpt_per_image, generator=perm_gen),
                               images.device) if cfg.rpt else None)
    one = len(xs) == 1
    return ((xs[0].unsqueeze(0) if one else torch.stack(xs)),
            (targets[0].unsqueeze(0) if one else torch.stack(targets)), perms)


def batched_inputs(cfgs, batches, *, num_classes, mean, std, mix_gens, perm_gens):
    """The same draws per member on the host, applied to the pack at once (`augment.step_batch`)."""
    draws = []
    for cfg, (images, labels), mix_gen, perm_gen in zip(cfgs, batches, mix_gens, perm_gens):
        box, partner = cutmix_draw(labels.numel(), *images.shape[-2:], mix_gen) if cfg.cutmix else (None, None)
        perm = train.random_permutation(labels.numel(), cfg.model.num_patches, per_image=cfg.rpt_per_image,
                                        generator=perm_gen) if cfg.rpt else None
        draws.append(StepDraws(box, partner, perm))
    return step_batch(batches, draws, num_classes=num_classes, mean=mean, std=std)


class _OpCount(TorchDispatchMode):
    """aten ops dispatched (views and metadata queries included: what the dispatcher runs)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def input_step(cfgs, inputs, device: torch.device, batch: int):
    """(the step's inputs alone, the whole step: inputs, forward, loss, backward, AdamW), on fixed
    uint8 batches, each member's generators reseeded per call (the same draws every step)."""
    side = cfgs[0].model.img_size
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, generator=g).to(device),
                torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in cfgs]
    pack = PackedViT(cfgs, device).train()
    optimizer = pack.optimizer(build_optimizer)

    def prepare():
        mix = [torch.Generator().manual_seed(c.seed * 7 + 2) for c in cfgs]
        perm = [torch.Generator().manual_seed(c.seed * 7 + 3) for c in cfgs]
        return inputs(cfgs, batches, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3, mix_gens=mix, perm_gens=perm)

    def step() -> None:
        x, target, perms = prepare()
        losses, _ = train.member_losses(pack, x, target, perms, use_amp=False)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        optimizer.step()

    return prepare, step


def measure_inputs(device: torch.device, *, preset: str, batch: int, sizes: list[int], steps: int, repeats: int,
                   warmup: int) -> dict[str, dict[str, float]]:
    """Per K: aten ops per step (inputs alone, whole step) and process CPU seconds per step, per member
    (before) and batched (after); timing windows alternate before / after, ratios per repeat, medians."""
    summary = {}
    for k in sizes:
        cfgs = input_configs(preset, k, batch)
        paths = {"before": input_step(cfgs, per_member_inputs, device, batch),
                 "after": input_step(cfgs, batched_inputs, device, batch)}
        row: dict[str, float] = {}
        for name, (prepare, step) in paths.items():
            timed(step, warmup, device)
            for part, fn in (("inputs", prepare), ("step", step)):
                with _OpCount() as count:
                    fn()
                row[f"{part}_ops_{name}"] = count.ops
        times: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for repeat in range(repeats):
            for name in (("before", "after") if repeat % 2 == 0 else ("after", "before")):
                prepare, step = paths[name]
                _, inputs_cpu, n_inputs = timed(prepare, 10 * steps, device)
                _, step_cpu, n_steps = timed(step, steps, device)
                times[name].append((inputs_cpu / n_inputs, step_cpu / n_steps))
        for i, part in enumerate(("inputs", "step")):
            row[f"{part}_cpu_s_before"] = statistics.median(t[i] for t in times["before"])
            row[f"{part}_cpu_s_after"] = statistics.median(t[i] for t in times["after"])
            row[f"{part}_ratio"] = statistics.median(a[i] / b[i] for a, b in zip(times["after"], times["before"]))
        summary[f"K={k}"] = row
    return summary


def print_inputs(summary: dict[str, dict[str, float]], preset: str, batch: int) -> None:
    print(f"the step's inputs per member (before) and batched over the pack (after): {preset}, {batch} images per "
          f"member, CutMix on every other member, RPT none / per batch / per image; process CPU time")
    print(f"{'pack':<6} {'input ops':>16} {'step ops':>17} {'input ms':>18} {'step ms':>18}")
    for name, r in summary.items():
        cells = []
        for part in ("inputs", "step"):
            cells.append(f"{r[f'{part}_ops_before']:>6.0f} -> {r[f'{part}_ops_after']:<6.0f}")
        for part in ("inputs", "step"):
            cells.append(f"{1e3 * r[f'{part}_cpu_s_before']:5.1f}->{1e3 * r[f'{part}_cpu_s_after']:5.1f} "
                         f"{r[f'{part}_ratio']:4.2f}x")
        print(f"{name:<6} " + "  ".join(cells))
    print("ops: aten ops dispatched per call; ms: median CPU ms per call; x: median per-repeat after / before")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", help="model preset (default: study_l on CUDA, tiny on CPU)")
    parser.add_argument("--batch-size", type=int, help="images per member per step (default: 128 CUDA, 32 CPU)")
    parser.add_argument("--packs", default="1,2,4,8", help="pack sizes K to time (default 1,2,4,8; 1 always)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per window (the same for every K)")
    parser.add_argument("--repeats", type=int, default=3, help="timing windows per configuration, interleaved")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration first")
    parser.add_argument("--max-seconds", type=float, default=float("inf"), help="wall-time cap per timing window")
    parser.add_argument("--drift-steps", type=int, default=0,
                        help="also train a pack of the largest K and its members alone this many steps and "
                             "print the largest relative loss difference (0: skip)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    parser.add_argument("--inputs", action="store_true",
                        help="time the step's inputs (CutMix, normalisation, RPT) per member against batched instead")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    preset = args.preset or ("study_l" if cuda else "tiny")
    batch = args.batch_size or (128 if cuda else 32)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(k) for k in args.packs.split(",")]
    if min(sizes) < 1:
        raise SystemExit(f"--packs must list pack sizes >= 1, got {args.packs!r}")

    if args.inputs:
        summary = measure_inputs(device, preset=preset, batch=batch, sizes=sizes, steps=args.steps,
                                 repeats=args.repeats, warmup=args.warmup)
        print_inputs(summary, preset, batch)
        return {"inputs": summary}
    summary = measure(device, preset=preset, batch=batch, sizes=sizes, steps=args.steps, repeats=args.repeats,
                      warmup=args.warmup, amp=args.amp, max_seconds=args.max_seconds)
    print(f"{preset} preset, {batch} images per member per step, {args.steps} steps x {args.repeats} repeats, "
          f"{device}{' bf16' if args.amp else ''}, {torch.get_num_threads()} threads")
    print(f"{'pack':<6} {'img/s wall':>11} {'img/s cpu':>10} {'x K=1':>7}" + ("  MiB/member" if cuda else ""))
    for name, row in summary.items():
        mem = f"  {row['mib_per_member']:>10.0f}" if "mib_per_member" in row else ""
        print(f"{name:<6} {row['images_per_s_wall']:>11.0f} {row['images_per_s_cpu']:>10.0f} "
              f"{row['ratio_to_k1']:>6.2f}x{mem}")
    print(f"ratio: median per-repeat images/s against K=1, the plain module ({'wall' if cuda else 'process CPU'} time)")
    result: dict[str, Any] = {"throughput": summary}
    if args.drift_steps:
        k = max(sizes)
        drift = loss_drift(device, preset=preset, batch=batch, k=k, steps=args.drift_steps, amp=args.amp)
        print(f"packed vs alone after {args.drift_steps} steps, K={k}: largest relative loss difference {drift:.2e}")
        result["loss_drift"] = drift
    return result


if __name__ == "__main__":
    main()
