"""Study P's optimiser, measured: four recipes side by side on real images.

The paper's table says Adam, lr 1e-3, weight decay 5e-2. Read literally in PyTorch that is
``torch.optim.Adam(model.parameters(), weight_decay=5e-2)``: L2 added to the gradient of every
parameter, the N(0, 1) APE table included. Arms, all from the same initial weights, the same
images in the same order, the same warm-up and cosine schedule:

    a  adam, decay_exempt=none   the literal recipe (study_p's default until this pilot's CPU run)
    b  adam, decay_exempt=timm   the former mix: coupled L2, APE / CLS / norms / biases exempt
    c  adamw 0.05, timm          AdamW with the timm exemptions: study_p's default since the CPU run
    d  adamw 0.05, none          AdamW, every parameter decays: the other natural reading, and Lee's
                                 recipe (the factorial's at 32 and 64 px)

Model: the ``study_p`` preset (ViT-S width, 8 heads, 224 px, patch 16, dropout 0.15, drop path 0.2,
APE N(0, 1)) with 200 classes. Data: the Tiny-ImageNet subset of ``../shared/data`` (50 train
images per class; 5% of them held out), trained with Study P's baseline protocol at 224 px: a
random resized crop (torchvision's parameters, resampled batched on the device with
``torchvision.ops.roi_align``) and a horizontal flip; the holdout is squashed to 224 x 224
(``trainables.data.images.eval_view``), as the project evaluates 224 px images.

Printed per arm: the train-loss curve (mean per tenth of the run), holdout accuracy (chance 0.005)
and, at init and after every epoch, the APE-to-patch-embedding norm ratio
(``analysis.measuring.evaluate.APENormRatio``, the analysis stage's ``ape_norm_ratio`` row: mean row norm of
the APE table over the mean norm of the patch embeddings of 64 holdout images): a ratio that grows
by an order of magnitude means the image content is vanishing beside the position signal, which is
what Study P's alpha scaling measures; Adam moves each coordinate by at most about lr per step, so
how far decay has moved the N(0, 1) table depends on the number of steps, not only the recipe.

    DATA=$(mktemp -d); tar xzf ../shared/data/tiny-imagenet-200-subset.tar.gz -C "$DATA"
    .venv/bin/python bench/recipe_pilot.py --data-root "$DATA"                   # CPU smoke test, ~3 min
    .venv/bin/python bench/recipe_pilot.py --data-root "$DATA" --budget cpu      # the CPU decision run, ~30 min
    .venv/bin/python bench/recipe_pilot.py --data-root "$DATA" --budget gpu      # the same arms at 224 px on a GPU

Budgets: ``smoke`` (the default without CUDA) runs 4 steps of 8 images per arm and scores 64
holdout images: it proves the script, it decides nothing. ``cpu`` (the run that decided Study P's
default: docs/studies.md, "Protocol choices") trains Study P's model at Tiny-ImageNet's native 64 px with
16 px patches, 3 epochs of 8,000 images (batch 64, 375 steps), a fifth of the subset held out
(2,000 images): ~36 min for the four arms on 2 idle cores (~44 img/s). ``gpu`` runs 20 epochs of the 9,500
training images per arm (batch 128, 74 steps an epoch, 1,480 steps, 2 warm-up epochs, bf16
autocast), about 190,000 images per arm: estimated (not yet measured) at ~3,000 img/s for ViT-S
on one H200, about 5 minutes for the four arms. The measured decision table (docs/studies.md, "Protocol
choices") came from arms a-c before study_p followed Study P's code (CLS N(0, 1), Linear default
init, no final LayerNorm).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torchvision.transforms as T
from torchvision.ops import roi_align

from analysis.measuring.evaluate import APENormRatio
from trainables.data.datasets import load_dataset
from trainables.data.images import eval_view, normalize
from trainables.loop.optim import build_optimizer, lr_factor
from trainables.model.vit import ViT
from trainables.config.run_config import RunConfig

ARMS = {
    "a: adam, L2 on every parameter (literal)": {"optimizer": "adam", "decay_exempt": "none"},
    "b: adam, timm exemptions (former mix)": {"optimizer": "adam", "decay_exempt": "timm"},
    "c: adamw 0.05, timm exemptions": {"optimizer": "adamw", "decay_exempt": "timm"},
    "d: adamw 0.05, every parameter decays": {"optimizer": "adamw", "decay_exempt": "none"},
}
IMG_SIZE = 224


@dataclass(frozen=True)
class Budget:
    epochs: float  # passes over the training split (fractional: the smoke test's few steps)
    batch_size: int
    warmup_epochs: float
    holdout_images: int | None  # None: the whole holdout
    max_steps: int | None = None
    img_size: int = IMG_SIZE  # the crop the model sees; below 224 px the holdout is scored at 64 px
    patch_size: int = 16
    holdout_fraction: float = 0.05


BUDGETS = {
    "smoke": Budget(epochs=1, batch_size=8, warmup_epochs=0, holdout_images=64, max_steps=4),
    # The CPU decision run: Study P's model at Tiny-ImageNet's native 64 px with 16 px patches (a 4x4 grid):
    # 224 px trains at ~3 img/s on 2 cores, 64 px / patch 8 at ~14, 64 px / patch 16 at ~60. A fifth of the
    # training split is held out (2,000 images: the SE of an accuracy near 1% is 0.2 points).
    "cpu": Budget(epochs=3, batch_size=64, warmup_epochs=0.3, holdout_images=None, img_size=64,
                  patch_size=16, holdout_fraction=0.2),
    "gpu": Budget(epochs=20, batch_size=128, warmup_epochs=2, holdout_images=None),
}


def random_resized_crop(images: torch.Tensor, generator: torch.Generator, size: int = IMG_SIZE) -> torch.Tensor:
    """uint8 (B, 3, h, w) -> float (B, 3, size, size) in [0, 255]: torchvision's RandomResizedCrop
    parameters per image (scale 0.08-1, ratio 3/4-4/3) and a horizontal flip, resampled in one batched
    bilinear ``roi_align`` on the images' device (one sample per output pixel: plain bilinear)."""
    boxes = []
    state = torch.get_rng_state()
    torch.manual_seed(int(torch.randint(2**62, (), generator=generator)))  # get_params draws from torch's RNG
    try:
        for b in range(images.shape[0]):
            top, left, height, width = T.RandomResizedCrop.get_params(images[b], scale=(0.08, 1.0),
                                                                      ratio=(3 / 4, 4 / 3))
            boxes.append([b, left, top, left + width, top + height])
    finally:
        torch.set_rng_state(state)
    boxes = torch.tensor(boxes, dtype=torch.float32, device=images.device)
    out = roi_align(images.float(), boxes, output_size=size, spatial_scale=1.0, sampling_ratio=1,
                    aligned=True)
    flip = torch.rand(images.shape[0], generator=generator) < 0.5
    return torch.where(flip.to(images.device)[:, None, None, None], out.flip(-1), out)


@torch.no_grad()
def norm_ratio(model: ViT, x: torch.Tensor) -> float:
    """The analysis stage's ``ape_norm_ratio`` of ``model`` on the normalised images ``x``."""
    ratio = APENormRatio(model.pe.table)
    ratio.update(model.patch_embed(x))
    return ratio.ratio()


@torch.no_grad()
def accuracy(model: ViT, images: torch.Tensor, labels: torch.Tensor, mean, std, device, amp: bool) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(labels), 256):
        x = normalize(images[start:start + 256].to(device), mean, std)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x).logits
        correct += int((logits.argmax(-1).cpu() == labels[start:start + 256]).sum())
    model.train()
    return correct / len(labels)


def run_arm(name: str, overrides: dict, budget: Budget, data, holdout, device: torch.device, amp: bool,
            log_every: int) -> dict:
    cfg = RunConfig.for_dataset(
        "imagenet100", preset="study_p", lr=1e-3, weight_decay=5e-2, batch_size=budget.batch_size, epochs=1,
        warmup_epochs=0, num_classes=data.num_classes, img_size=budget.img_size, patch_size=budget.patch_size,
        **overrides,
    )
    torch.manual_seed(0)  # the same initial weights in every arm
    model = ViT(cfg.model).to(device).train()
    optimizer = build_optimizer(model, cfg)
    train_images, train_labels = data.train.images, data.train.labels
    steps_per_epoch = len(train_labels) // budget.batch_size
    total = max(1, round(budget.epochs * steps_per_epoch))
    if budget.max_steps:
        total = min(total, budget.max_steps)
    warmup = round(budget.warmup_epochs * steps_per_epoch)
    hold_images, hold_labels = holdout
    probe = normalize(hold_images[:64].to(device), data.mean, data.std)
    ratios = [norm_ratio(model, probe)]  # at init, then after every epoch (and at the end)
    order_gen = torch.Generator().manual_seed(1)  # the same images in the same order in every arm
    crop_gen = torch.Generator().manual_seed(2)
    losses: list[float] = []
    order = torch.empty(0, dtype=torch.long)
    t0 = time.perf_counter()
    for step in range(total):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, warmup_steps=warmup, total_steps=total, schedule="cosine")
        if len(order) < budget.batch_size:
            order = torch.randperm(len(train_labels), generator=order_gen)
        idx, order = order[:budget.batch_size], order[budget.batch_size:]
        x = random_resized_crop(train_images[idx].to(device), crop_gen, budget.img_size)
        x = normalize(x, data.mean, data.std)  # float [0, 255] in: the same arithmetic as uint8
        y = train_labels[idx].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x).logits
        loss = F.cross_entropy(logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % steps_per_epoch == 0 or step + 1 == total:
            ratios.append(norm_ratio(model, probe))
        if log_every and (step + 1) % log_every == 0:
            mean_loss = sum(losses[-log_every:]) / log_every
            print(f"  [{name[:1]}] step {step + 1}/{total} loss {mean_loss:.3f}", flush=True)
    seconds = time.perf_counter() - t0
    acc = accuracy(model, hold_images, hold_labels, data.mean, data.std, device, amp)
    return {"arm": name, "steps": total, "images": total * budget.batch_size, "seconds": seconds,
            "curve": _tenths(losses), "holdout_acc": acc, "ratios": ratios}


def _tenths(values: list[float]) -> list[float]:
    """Mean of each tenth of the run (fewer points when there are fewer than ten steps)."""
    parts = min(10, len(values))
    size = len(values) / parts
    return [sum(values[int(i * size):int((i + 1) * size)]) / max(1, int((i + 1) * size) - int(i * size))
            for i in range(parts)]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", required=True, help="folder holding tiny-imagenet-200/ (see the docstring)")
    parser.add_argument("--budget", choices=sorted(BUDGETS), help="default: gpu with CUDA, else smoke")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if args.threads:
        torch.set_num_threads(args.threads)
    budget_name = args.budget or ("gpu" if device.type == "cuda" else "smoke")
    budget = BUDGETS[budget_name]
    amp = device.type == "cuda"
    data = load_dataset("tinyimagenet", args.data_root, seed=0, holdout_fraction=budget.holdout_fraction)
    hold = data.holdout
    n_hold = len(hold.labels) if budget.holdout_images is None else min(budget.holdout_images, len(hold.labels))
    holdout = (eval_view(hold.images[:n_hold], budget.img_size), hold.labels[:n_hold])
    print(f"recipe pilot: {budget_name} budget {budget}, device {device}, {len(data.train.labels)} train / "
          f"{n_hold} holdout images, {data.num_classes} classes (chance {1 / data.num_classes:.3f})", flush=True)
    log_every = 0 if budget.max_steps else len(data.train.labels) // budget.batch_size // 2
    results = [run_arm(name, o, budget, data, holdout, device, amp, log_every) for name, o in ARMS.items()]
    print("\nloss per tenth of the run (train, mean):")
    for r in results:
        print(f"  {r['arm']:<42} " + " ".join(f"{v:.3f}" for v in r["curve"]))
    print("\nAPE / patch-embedding norm ratio at init, then after each epoch (and the run's last step):")
    for r in results:
        print(f"  {r['arm']:<42} " + " ".join(f"{v:.3g}" for v in r["ratios"]))
    print(f"\n{'arm':<42} {'steps':>6} {'img/s':>7} {'holdout acc':>11} {'APE/patch norm: init':>21} {'end':>8} "
          f"{'end/init':>8}")
    for r in results:
        init, end = r["ratios"][0], r["ratios"][-1]
        print(f"{r['arm']:<42} {r['steps']:>6} {r['images'] / r['seconds']:>7.1f} {r['holdout_acc']:>11.3f} "
              f"{init:>21.2f} {end:>8.2f} {end / init:>8.2f}")
    base = results[0]
    print("\nratios against arm a (literal): holdout acc " + ", ".join(
        f"{r['arm'][:1]} {r['holdout_acc'] / base['holdout_acc']:.2f}x" if base["holdout_acc"] else
        f"{r['arm'][:1]} {r['holdout_acc']:.3f} (a is 0)" for r in results[1:]))
    if budget.max_steps:
        print("smoke budget: proves the script runs; the optimiser decision needs --budget gpu.")
    return results


if __name__ == "__main__":
    main()
