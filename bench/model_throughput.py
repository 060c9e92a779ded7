"""Training-step throughput of our ViT against timm's VisionTransformer of the same shape.

One step = forward + cross-entropy + backward + AdamW step, on a fixed synthetic batch (no data loading).
Both models are Study L's shape (img 32, patch 4, D 192, depth 8, 8 heads, MLP 2, CLS token, learned APE,
10 classes; the same 2,400,586 parameters). Timing windows alternate between the two models (and swap
order every repeat), so drift in machine load hits both; the headline is the median of per-repeat ratios.

    .venv/bin/python bench/model_throughput.py                       # CPU, batch 128
    .venv/bin/python bench/model_throughput.py --device cuda --amp   # GPU, bf16 autocast

Target: ratio (ours / timm) >= 0.95 on CPU fp32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from trainables.model.vit import ViT
from trainables.config.architecture import ViTConfig


def build_models(device: torch.device) -> dict[str, torch.nn.Module]:
    cfg = ViTConfig.preset("study_l", pe="ape")
    ours = ViT(cfg)
    theirs = VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, embed_dim=cfg.dim, depth=cfg.depth,
        num_heads=cfg.heads, mlp_ratio=cfg.mlp_ratio, class_token=True, global_pool="token",
        num_classes=cfg.num_classes,
    )
    counts = {name: sum(p.numel() for p in m.parameters()) for name, m in (("ours", ours), ("timm", theirs))}
    assert counts["ours"] == counts["timm"], f"models differ in size: {counts}"
    print(f"parameters: {counts['ours']:,} each")
    return {"ours": ours.to(device).train(), "timm": theirs.to(device).train()}


def make_step(model: torch.nn.Module, device: torch.device, amp: bool):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(images)
            logits = out.logits if hasattr(out, "logits") else out
            loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def timed_steps(step, images, labels, steps: int, device: torch.device) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) for `steps` training steps (CUDA synchronised at both ends).

    On a CPU shared with other jobs, wall time measures the neighbours as much as the model; the process's
    CPU time (all its threads) is the work the model itself did, so it is reported beside wall time.
    """
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step(images, labels)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10, help="timing windows per model, interleaved")
    parser.add_argument("--steps", type=int, default=1, help="training steps per timing window")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads; 1 gives steadier numbers on a shared CPU (0: leave as is)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA)")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    models = build_models(device)
    steps = {name: make_step(model, device, args.amp) for name, model in models.items()}
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (args.batch_size,), device=device)
    print(f"device={device} batch={args.batch_size} steps/window={args.steps} repeats={args.repeats} "
          f"amp={args.amp} threads={torch.get_num_threads()} torch={torch.__version__}")

    for name in models:
        for _ in range(args.warmup):
            steps[name](images, labels)

    # Windows alternate ours/timm, order swapped every repeat (ABBA), so slow drifts in machine load
    # (other jobs on a shared CPU) hit both models alike; medians drop the bursts.
    rates = {(name, clock): [] for name in models for clock in ("wall", "cpu")}
    for repeat in range(args.repeats):
        order = list(models) if repeat % 2 == 0 else list(reversed(models))
        for name in order:
            for clock, seconds in zip(("wall", "cpu"), timed_steps(steps[name], images, labels, args.steps, device)):
                rates[name, clock].append(args.steps * args.batch_size / seconds)
        print(f"repeat {repeat:2d}: wall img/s ours {rates['ours', 'wall'][-1]:7.1f} timm "
              f"{rates['timm', 'wall'][-1]:7.1f} | cpu-time img/s ours {rates['ours', 'cpu'][-1]:7.1f} "
              f"timm {rates['timm', 'cpu'][-1]:7.1f}")

    clocks = ("wall", "cpu") if device.type == "cpu" else ("wall",)
    for clock in clocks:
        ratios = [o / t for o, t in zip(rates["ours", clock], rates["timm", clock])]
        print(f"median ({clock:4s}): ours {statistics.median(rates['ours', clock]):7.1f} img/s, "
              f"timm {statistics.median(rates['timm', clock]):7.1f} img/s, "
              f"ratio ours/timm {statistics.median(ratios):.3f} (median of per-repeat ratios)")


if __name__ == "__main__":
    main()
