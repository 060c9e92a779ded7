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

On CPU the step is compute-bound, so packing is expected near 1x per image there (it saves the per-trial
Ray overhead, not kernel time); the GPU gain, where a study_l step is launch-bound, is measured by
bench/gpu_suite.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from trainables.config import RunConfig
from trainables.packed import PackedViT
from trainables.optim import build_optimizer


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
