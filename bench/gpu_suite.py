"""GPU suite: the device input path and the training step on one GPU, as one table.

    PYTHONPATH=. python3 bench/gpu_suite.py            # on a CUDA machine: full size, < 8 minutes
    PYTHONPATH=. python3 bench/gpu_suite.py --tiny     # anywhere (CPU): the same code at a tiny size

Needs torch, torchvision, numpy only (no Ray, no MLflow). Sections, each
time-capped (`--section-s`) so the whole run stays under 8 minutes:

* augment: `augment.draw` + `augment.apply` of every protocol's augmentation
  (crop + flip, AutoAugment CIFAR-10 at 32 px, ColorJitter at 64 px,
  flip + AutoAugment ImageNet at 224 px) on chunks of `augment.CHUNK_IMAGES`
  images already on the device: images/s (target: >= 2M/s at 32 px);
* decode: nvjpeg `decode_jpeg(list, device=...)` images/s on 224-px JPEGs,
  and the largest difference of the antialiased random resized crop on the
  device against the CPU kernel (the stated tolerance of that stage);
* memory: GPU memory of one Study L trial on CIFAR-size data (the uint8 data
  copy, then the peak of a training step at batch 128);
* step: the `study_l` training step (CutMix, RPT, bf16 autocast, AdamW) fed by
  `TrainSource` at batch 128, images/s, eager and `torch.compile`d with CUDA
  graphs (target: >= 50,000 images/s for one model), and the eager step
  under `torch.use_deterministic_algorithms(True)` with
  CUBLAS_WORKSPACE_CONFIG=:4096:8 (what bit-reproducible CUDA runs need),
  so its cost is measured;
* packing: training images/s of K `study_l` models packed in one process
  (`trainables.packed`, bf16, batch 128 per member) for K = 1, 4, 8, 16, 32,
  GPU memory per member (to size `--pack`), the same number of separate
  one-model processes sharing the GPU (K = 4 and 8, eager), and the
  packed-vs-alone loss difference after 50 steps under bf16 autocast
  (target: >= 100,000 training images/s per GPU with packing).

Prints one table; writes it as JSON to $OUT/gpu_suite.json when OUT is set
(else bench/out/gpu_suite.json). Kept as bench/measured/gpu_suite.json, it is
what `vitsweep sweep ... --dry-run` estimates GPU-hours from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from trainables.augment import (
    CHUNK_IMAGES,
    Augmentation,
    apply,
    draw,
    item_keys,
    resized_crop,
    resized_crop_params,
)
from trainables.config import RunConfig
from trainables.images import TensorImages
from trainables.inputs import TrainSource, decode_on_device
from trainables.packed import PackedViT
from trainables.train import epoch_seed, build_optimizer, pack_step
from trainables.vit import ViTConfig

AUGMENTATIONS = [  # (name, image side, strong augmentation)
    ("crop+flip 32px", 32, None),
    ("autoaugment cifar10 32px", 32, "autoaugment_cifar10"),
    ("color_jitter 64px", 64, "color_jitter"),
    ("flip+autoaugment imagenet 224px", 224, "autoaugment_imagenet"),
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(fn, items: int, device: torch.device, budget_s: float, min_reps: int = 2) -> float:
    """items/s of fn() after one warm-up call, repeated until budget_s has passed (at least min_reps)."""
    fn()
    _sync(device)
    reps, start = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < budget_s:
        fn()
        reps += 1
    _sync(device)
    return reps * items / (time.perf_counter() - start)


def section_augment(device, chunk: int, budget_s: float, tiny: bool) -> dict:
    """What the loop does per chunk: draw on the host, apply to rows of a split held on the device."""
    out = {}
    for name, size, strong in AUGMENTATIONS:
        if tiny:  # the same code paths at small sizes (128 px keeps the resized-crop path)
            size = 128 if strong == "autoaugment_imagenet" else min(size, 64)
        spec = Augmentation(size, strong)
        for images_per_call in (chunk, 4 * chunk) if size <= 64 else (chunk,):
            split = torch.randint(0, 256, (2 * images_per_call, 3, size, size), dtype=torch.uint8, device=device)
            rng = np.random.default_rng(0)
            counter = iter(range(10**9))

            def run():  # fresh rows and draws every call (host side included), as in training
                rows = rng.choice(len(split), images_per_call, replace=False)
                apply(spec, split, draw(spec, item_keys(0, next(counter), rows)), rows=rows)

            label = name if images_per_call == chunk else f"{name} (chunk {images_per_call})"
            out[label] = {"images_per_s": _rate(run, images_per_call, device, budget_s), "chunk": images_per_call,
                          "img_size": size}
    return out


def section_decode(device, budget_s: float, tiny: bool) -> dict:
    import torchvision.io

    n, side = (8, 160) if tiny else (256, 400)
    g = torch.Generator().manual_seed(0)
    raw = [torch.randint(0, 256, (3, side, side + 40), dtype=torch.uint8, generator=g) for _ in range(n)]
    encoded = [torchvision.io.encode_jpeg(image, quality=90) for image in raw]
    out = {"files": n, "image": f"{side}x{side + 40}"}
    out["decode_images_per_s"] = _rate(lambda: decode_on_device(encoded, device), n, device, budget_s)
    decoded_cpu = [torchvision.io.decode_jpeg(e) for e in encoded]
    keys = item_keys(0, 1, np.arange(n))
    boxes = resized_crop_params(keys, np.full(n, side), np.full(n, side + 40))
    size = 128 if tiny else 224
    diffs = [
        (resized_crop(image.to(device), box, size).cpu().int() - resized_crop(image, box, size).int()).abs().max()
        for image, box in zip(decoded_cpu, boxes)
    ]
    out["resized_crop_max_level_diff_vs_cpu"] = int(max(diffs))
    return out


def _study_l(tiny: bool) -> RunConfig:
    """The Study L recipe's step at 32 px, every per-step switch on (AutoAugment, CutMix, RPT)."""
    preset = "tiny" if tiny else "study_l"
    model = ViTConfig.preset(preset, img_size=32, patch_size=4, num_classes=10)
    return RunConfig(dataset="cifar10", preset=preset, model=model, batch_size=128, epochs=1, warmup_epochs=0,
                     autoaugment=True, cutmix=True, rpt=True)


def section_memory_and_step(device, budget_s: float, tiny: bool, compile_budget_s: float, deterministic: bool) -> dict:
    n_images = 4096 if tiny else 50_000
    g = torch.Generator().manual_seed(0)
    split = TensorImages(torch.randint(0, 256, (n_images, 3, 32, 32), dtype=torch.uint8, generator=g),
                         torch.randint(0, 10, (n_images,), generator=g))
    out = {}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    cfg = _study_l(tiny)
    source = TrainSource(split, Augmentation(32, "autoaugment_cifar10"), device=device)
    if cuda:
        out["data_copy_mib"] = (torch.cuda.memory_allocated(device) - base) / 2**20
    modes = [("eager", False)] + ([("compiled", True)] if cuda else [])
    if deterministic:
        modes = [("eager_deterministic", False)]
    for mode, compiled in modes:
        pack = PackedViT([cfg], device)  # a pack of one is the plain module: the loop's own step
        optimizer = pack.optimizer(build_optimizer, cfg)
        if compiled:
            pack.wrap(lambda m: torch.compile(m, mode="reduce-overhead"))
        pack.train()
        mix_gen = torch.Generator().manual_seed(epoch_seed(0, 1, 2))
        perm_gen = torch.Generator().manual_seed(epoch_seed(0, 1, 3))
        batches = iter(())
        epoch = [0]

        def step():
            nonlocal batches
            try:
                images, labels = next(batches)
            except StopIteration:
                epoch[0] += 1
                batches = source.epoch(seed=0, epoch=epoch[0], batch_size=cfg.batch_size)
                images, labels = next(batches)
            pack_step(pack, optimizer, [cfg], [(images, labels)], num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3,
                      mix_gens=[mix_gen], perm_gens=[perm_gen], use_amp=cuda)

        t0 = time.perf_counter()
        for _ in range(3):  # warm-up (and compilation, capped by the section's budget)
            step()
            if time.perf_counter() - t0 > compile_budget_s:
                break
        _sync(device)
        out[f"{mode}_warmup_s"] = time.perf_counter() - t0
        if cuda and mode == "eager":
            out["step_peak_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        out[f"{mode}_step_images_per_s"] = _rate(step, cfg.batch_size, device, budget_s, min_reps=3)
    return out


def section_packing(device, budget_s: float, tiny: bool) -> tuple[dict, dict]:
    """(printed rows, the estimate table's rows): packed images/s per K, memory per member, loss drift."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import packing  # bench/packing.py: the same step, timed side by side

    cuda = device.type == "cuda"
    preset, batch = ("tiny", 16) if tiny else ("study_l", 128)
    sizes = [1, 2] if tiny else [1, 4, 8, 16, 32]
    table = packing.measure(device, preset=preset, batch=batch, sizes=sizes, steps=2 if tiny else 20,
                            repeats=1 if tiny else 2, warmup=1 if tiny else 3, amp=cuda, max_seconds=budget_s)
    clock = "images_per_s_wall" if cuda else "images_per_s_cpu"
    rows, estimate_rows = {}, {}
    for name, row in table.items():
        rows[f"packed {name}"] = {"images_per_s": row[clock]}
        estimate_rows[name] = {"images_per_s": row[clock], **({"mib_per_member": row["mib_per_member"]}
                                                              if "mib_per_member" in row else {})}
        if "mib_per_member" in row:
            rows[f"packed {name} MiB per member"] = row["mib_per_member"]
    best = max(table, key=lambda name: table[name][clock])
    rows["best K"] = best
    rows["best K / K=1"] = table[best][clock] / table["K=1"][clock]
    for n in ([2] if tiny else [4, 8]):
        rows[f"{n} separate processes"] = {"images_per_s": _separate_processes(n, budget_s, tiny)}
    rows["bf16 packed-vs-alone loss diff (rel.)"] = packing.loss_drift(
        device, preset=preset, batch=batch, k=2 if tiny else 4, steps=3 if tiny else 50, amp=cuda)
    return rows, {preset: estimate_rows}


def _separate_processes(n: int, budget_s: float, tiny: bool) -> float:
    """Summed training images/s of `n` one-model processes started together on this device."""
    cmd = [sys.executable, __file__, "--only-alone", "--section-s", str(budget_s)] + (["--tiny"] if tiny else [])
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "OUT": ""}) for _ in range(n)]
    total = 0.0
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=budget_s * 10 + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            continue
        lines = [line for line in out.splitlines() if line.startswith("ALONE ")]
        total += float(lines[-1].split()[1]) if lines else 0.0
    return total


def _deterministic_subprocess(args, timeout_s: float) -> dict:
    """The eager step under deterministic algorithms, in a fresh process: CUBLAS_WORKSPACE_CONFIG
    must be set before CUDA starts."""
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OUT": ""}
    cmd = [sys.executable, __file__, "--only-deterministic", "--section-s", str(args.section_s)]
    cmd += ["--tiny"] if args.tiny else []
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        line = [l for l in done.stdout.splitlines() if l.startswith("DETERMINISTIC ")]
        return json.loads(line[-1].split(" ", 1)[1]) if line else {"error": done.stderr[-500:]}
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU mode CI runs); implied without CUDA")
    parser.add_argument("--section-s", type=float, default=None, help="seconds measured per row (default 6, tiny 0.2)")
    parser.add_argument("--only-deterministic", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-alone", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.tiny = args.tiny or device.type != "cuda"
    args.section_s = args.section_s if args.section_s is not None else (0.2 if args.tiny else 6.0)
    if args.only_deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)  # measure, even where an op has no such kernel
        result = section_memory_and_step(device, args.section_s, args.tiny, 120, deterministic=True)
        print("DETERMINISTIC " + json.dumps(result))
        return result

    if args.only_alone:  # one of the separate processes of section_packing
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import packing

        preset, batch = ("tiny", 16) if args.tiny else ("study_l", 128)
        row = packing.measure(device, preset=preset, batch=batch, sizes=[1], steps=2 if args.tiny else 20,
                              repeats=1, warmup=1 if args.tiny else 3, amp=device.type == "cuda",
                              max_seconds=args.section_s)["K=1"]
        print(f"ALONE {row['images_per_s_wall']}")
        return row

    chunk = 64 if args.tiny else CHUNK_IMAGES
    t_start = time.perf_counter()
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "tiny": args.tiny, "chunk_images": chunk, "sections": {},
        "measured_at": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    sections = results["sections"]
    sections["augment"] = section_augment(device, chunk, args.section_s, args.tiny)
    sections["decode"] = section_decode(device, args.section_s, args.tiny)
    sections["step"] = section_memory_and_step(device, args.section_s, args.tiny, 150 if not args.tiny else 60,
                                               deterministic=False)
    if device.type == "cuda":
        sections["step"].update(_deterministic_subprocess(args, timeout_s=120))
    sections["packing"], results["packing"] = section_packing(device, args.section_s, args.tiny)
    results["wall_s"] = time.perf_counter() - t_start

    print(f"gpu_suite on {results['device']} (torch {results['torch']}{', tiny' if args.tiny else ''}), "
          f"chunk {chunk} images, {results['wall_s']:.0f} s")
    print(f"{'section':10s} {'measure':48s} {'value':>14s}")
    for section, rows in sections.items():
        for name, value in rows.items():
            if isinstance(value, dict):
                print(f"{section:10s} {name + ' images/s':48s} {value['images_per_s']:14,.0f}")
            else:
                print(f"{section:10s} {name:48s} {value:14,.1f}" if isinstance(value, float)
                      else f"{section:10s} {name:48s} {value!s:>14s}")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).parent / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_suite.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {out_dir / 'gpu_suite.json'}")
    return results


if __name__ == "__main__":
    main()
