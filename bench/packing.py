"""Packed training throughput: images/s per process for K = 1, 2, 4, 8 members, against one plain ViT.

One step = forward + per-member cross-entropy + backward + AdamW step on fixed synthetic batches (no data
loading), each member its own batch of B images, so a K-pack trains K x B images per step. Baseline: the
plain module (what K = 1 trains today), timed side by side in the same run; "packed K=1" isolates the
cost of vmap + explicit attention. Timing windows alternate between configurations over repeats (order
rotated each repeat), so drift in machine load hits all; the headline is the median of per-repeat ratios
of images/s against the plain module. On a shared CPU, process CPU time is the fairer clock (wall time
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

import torch
import torch.nn.functional as F

from trainables.config import RunConfig
from trainables.packed import PackedViT, init_member
from trainables.train import build_optimizer


def member_configs(preset: str, k: int) -> list[RunConfig]:
    return [RunConfig.for_dataset("cifar10", preset=preset, seed=seed, data_root="/unused") for seed in range(k)]


def plain_step(cfg: RunConfig, images, targets, amp: bool, device: torch.device):
    model = init_member(cfg).to(device).train()
    optimizer = build_optimizer(model, cfg)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(images[0]).logits
        loss = F.cross_entropy(logits.float(), targets[0])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


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


def timed(step, steps: int, device: torch.device) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) for `steps` steps, CUDA synchronised at both ends."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", help="model preset (default: study_l on CUDA, tiny on CPU)")
    parser.add_argument("--batch-size", type=int, help="images per member per step (default: 128 CUDA, 32 CPU)")
    parser.add_argument("--packs", default="1,2,4,8", help="pack sizes K to time (default 1,2,4,8)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per window (the same for every K)")
    parser.add_argument("--repeats", type=int, default=3, help="timing windows per configuration, interleaved")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration first")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    preset = args.preset or ("study_l" if cuda else "tiny")
    batch = args.batch_size or (128 if cuda else 32)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = sorted({int(k) for k in args.packs.split(",")})
    if not sizes or sizes[0] < 1:
        raise SystemExit(f"--packs must list pack sizes >= 1, got {args.packs!r}")

    cfgs = member_configs(preset, max(sizes))
    side, classes = cfgs[0].model.img_size, cfgs[0].model.num_classes
    g = torch.Generator().manual_seed(0)
    images = torch.randn(max(sizes), batch, 3, side, side, generator=g).to(device)
    targets = F.one_hot(torch.randint(0, classes, (max(sizes), batch), generator=g), classes).float().to(device)
    configs = {"plain K=1": (1, plain_step(cfgs[0], images, targets, args.amp, device))}
    for k in sizes:
        configs[f"packed K={k}"] = (k, packed_step(cfgs[:k], images, targets, args.amp, device))
    for _, step in configs.values():
        timed(step, args.warmup, device)

    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}  # (wall, cpu) images/s
    names = list(configs)
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[: repeat % len(names)]
        for name in order:
            k, step = configs[name]
            wall, cpu = timed(step, args.steps, device)
            n = k * batch * args.steps
            rates[name].append((n / wall, n / max(cpu, 1e-9)))

    clock = 0 if cuda else 1  # CUDA: wall clock (the GPU's time); CPU: process time
    print(f"{preset} preset, {batch} images per member per step, {args.steps} steps x {args.repeats} repeats, "
          f"{device}{' bf16' if args.amp else ''}, {torch.get_num_threads()} threads")
    print(f"{'configuration':<14} {'img/s wall':>11} {'img/s cpu':>10} {'x plain':>8}")
    summary = {}
    for name in names:
        ratio = statistics.median(r[clock] / b[clock] for r, b in zip(rates[name], rates["plain K=1"]))
        wall = statistics.median(r[0] for r in rates[name])
        cpu = statistics.median(r[1] for r in rates[name])
        summary[name] = {"images_per_s_wall": wall, "images_per_s_cpu": cpu, "ratio_to_plain": ratio}
        print(f"{name:<14} {wall:>11.0f} {cpu:>10.0f} {ratio:>7.2f}x")
    print(f"ratio: median per-repeat images/s against plain K=1 ({'wall' if cuda else 'process CPU'} time)")
    return summary


if __name__ == "__main__":
    main()
