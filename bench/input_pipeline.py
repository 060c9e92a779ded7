"""Input-pipeline throughput per CPU core, for each of Study L's 8 protocols: per-image vs batched.

The pipeline measured is what a training step consumes, two ways on the same
images and keys in one run:

* per-image (the reference, how the loop fed itself before the device input
  path): per-image transform (crop + flip [+ AutoAugment / ColorJitter])
  through `Augmented` with seeded keys, default collate;
* batched (what `trainables.data.inputs` does): `augment.draw` + `augment.apply`
  on chunks of `--chunk` images (default `augment.CHUNK_IMAGES`, the loop's);

each followed per batch by soft targets [+ CutMix] + normalise, all on one
thread. `ratio` = batched images/s per core / per-image images/s per core.
Beside it, in the same run, the Study L model's training step on CPU (forward +
backward + AdamW, batch 128) for scale. From the per-core rate follows how many
cores would feed one GPU at `--target` images/s (100,000 by default: roughly
what one GPU trains the 2.4M-parameter Study L model at).

Rates are images per CPU-second of this process (`time.process_time`), so
neighbours on a shared machine do not distort them; wall-clock rates are
printed too. Repeats alternate between protocols so drift hits all alike;
the median is reported.

    .venv/bin/python bench/input_pipeline.py                                   # shapes, 32 px, ~1 min
    .venv/bin/python bench/input_pipeline.py --cifar10-jpeg /tmp/data/cifar10-jpeg   # + real CIFAR-10
    .venv/bin/python bench/input_pipeline.py --img-size 64 --like tinyimagenet       # ColorJitter at 64 px

Writes bench/out/input_pipeline.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import default_collate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the per-image reference lives there
from reference import Augmented, SeededSampler, prepare_batch, train_transform  # noqa: E402

from trainables.data.augment import CHUNK_IMAGES, apply, augmentation, draw, item_keys  # noqa: E402
from trainables.data.datasets import load_dataset  # noqa: E402
from trainables.data.images import TensorImages  # noqa: E402
from trainables.data.protocols import PROTOCOLS  # noqa: E402
from trainables.data.shapes import make_shapes  # noqa: E402

PROTOCOL_NAMES = [n for n in PROTOCOLS if n != "modern"]


def time_pipeline(split, protocol_name: str, like: str, img_size: int, num_classes: int, mean, std,
                  images: int, batch_size: int, seed: int) -> dict[str, float]:
    """CPU and wall seconds for `images` images: per-image part and per-batch part separately."""
    protocol = PROTOCOLS[protocol_name]
    data = Augmented(split, train_transform(protocol, like, img_size))
    sampler = SeededSampler(len(data), seed=seed)
    sampler.set_epoch(seed)
    keys = list(sampler)
    keys = (keys * (1 + images // len(keys)))[:images]
    generator = torch.Generator().manual_seed(seed)
    per_image_cpu = per_batch_cpu = 0.0
    wall = time.perf_counter()
    for start in range(0, images, batch_size):
        c0 = time.process_time()
        images_u8, labels = default_collate([data[k] for k in keys[start:start + batch_size]])
        c1 = time.process_time()
        x, targets = prepare_batch(images_u8, labels, protocol, num_classes, mean, std, generator)
        c2 = time.process_time()
        per_image_cpu += c1 - c0
        per_batch_cpu += c2 - c1
    return {"cpu_s": per_image_cpu + per_batch_cpu, "per_image_cpu_s": per_image_cpu,
            "per_batch_cpu_s": per_batch_cpu, "wall_s": time.perf_counter() - wall}


def time_batched(split, protocol_name: str, like: str, img_size: int, num_classes: int, mean, std,
                 images: int, batch_size: int, seed: int, chunk: int) -> dict[str, float]:
    """The same images and keys as `time_pipeline`, augmented `chunk` images per call."""
    protocol = PROTOCOLS[protocol_name]
    spec = augmentation(protocol, like, img_size)
    sampler = SeededSampler(len(split), seed=seed)
    sampler.set_epoch(seed)
    order = [i for i, _ in sampler]
    order = np.array((order * (1 + images // len(order)))[:images])
    generator = torch.Generator().manual_seed(seed)
    per_image_cpu = per_batch_cpu = 0.0
    wall = time.perf_counter()
    for start in range(0, images, chunk):
        rows = order[start:start + chunk]
        c0 = time.process_time()
        augmented = apply(spec, split.images, draw(spec, item_keys(seed, seed, rows)), rows=rows)
        labels = split.labels[torch.from_numpy(rows)]
        c1 = time.process_time()
        for x_u8, y in zip(augmented.split(batch_size), labels.split(batch_size)):
            prepare_batch(x_u8, y, protocol, num_classes, mean, std, generator)
        c2 = time.process_time()
        per_image_cpu += c1 - c0
        per_batch_cpu += c2 - c1
    return {"cpu_s": per_image_cpu + per_batch_cpu, "per_image_cpu_s": per_image_cpu,
            "per_batch_cpu_s": per_batch_cpu, "wall_s": time.perf_counter() - wall}


def time_model_step(img_size: int, num_classes: int, batch_size: int, steps: int) -> dict[str, float] | None:
    """CPU seconds per image of the Study L training step, or None when trainables.model.vit is missing."""
    try:
        from trainables.model.vit import ViT
        from trainables.config.architecture import ViTConfig
    except ImportError:
        return None
    cfg = ViTConfig.preset("study_l", img_size=img_size, patch_size=img_size // 8, num_classes=num_classes)
    model = ViT(cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x = torch.randn(batch_size, 3, img_size, img_size)
    y = torch.randint(0, num_classes, (batch_size,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x).logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()  # warm-up
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    return {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, "images": steps * batch_size}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2048, help="images per protocol and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=CHUNK_IMAGES, help="images per batched augmentation call")
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("--like", default="cifar10", help="data-set name that picks the strong augmentation")
    parser.add_argument("--target", type=float, default=100_000, help="images/s one GPU consumes")
    parser.add_argument("--model-steps", type=int, default=3, help="0 skips the model column")
    parser.add_argument("--cifar10-jpeg", type=Path, default=None, help="unpacked cifar10-jpeg folder (optional)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "input_pipeline.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # per-core figures

    images, labels = make_shapes(4096, img_size=args.img_size, seed=0)
    sources = {f"shapes-{args.img_size}px": (TensorImages(images, labels), 10, (0.5,) * 3, (0.3,) * 3, args.like)}
    if args.cifar10_jpeg is not None:
        real = load_dataset("folder", args.cifar10_jpeg, holdout_fraction=0.0)
        sources["cifar10-jpeg"] = (real.train, real.num_classes, real.mean, real.std, "cifar10")

    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}, "pipelines": {}}
    print(f"torch {torch.__version__}, 1 thread; {args.images} images x {args.repeats} repeats per protocol; "
          f"batch {args.batch_size}; batched in chunks of {args.chunk}; target {args.target:,.0f} img/s per GPU")
    model = time_model_step(args.img_size, 10, args.batch_size, args.model_steps) if args.model_steps else None
    for source, (split, num_classes, mean, std, like) in sources.items():
        if not isinstance(split, TensorImages):  # decode once: the batched path indexes memory
            split = TensorImages(torch.stack([split[i][0] for i in range(min(len(split), 4096))]),
                                 split.labels[:min(len(split), 4096)])
        runs = {name: [] for name in PROTOCOL_NAMES}
        batched = {name: [] for name in PROTOCOL_NAMES}
        for repeat in range(args.repeats):
            order = PROTOCOL_NAMES if repeat % 2 == 0 else PROTOCOL_NAMES[::-1]
            for name in order:
                runs[name].append(time_pipeline(split, name, like, args.img_size, num_classes, mean, std,
                                                args.images, args.batch_size, seed=repeat))
                batched[name].append(time_batched(split, name, like, args.img_size, num_classes, mean, std,
                                                  args.images, args.batch_size, seed=repeat, chunk=args.chunk))
        print(f"\n{source} (strong augmentation as for {like!r})")
        print(f"{'protocol':36s} {'img/s/core':>10s} {'us/img':>7s} {'(per-image':>10s} {'batch)':>7s} "
              f"{'wall img/s':>10s} {'cores@target':>12s} {'batched/core':>12s} {'cores@target':>12s} "
              f"{'ratio':>6s} {'aug ratio':>9s}")
        table = {}
        for name in PROTOCOL_NAMES:
            cpu = statistics.median(r["cpu_s"] for r in runs[name])
            rate = args.images / cpu
            row = {
                "images_per_cpu_s": rate,
                "us_per_image": 1e6 / rate,
                "per_image_us": 1e6 * statistics.median(r["per_image_cpu_s"] for r in runs[name]) / args.images,
                "per_batch_us": 1e6 * statistics.median(r["per_batch_cpu_s"] for r in runs[name]) / args.images,
                "wall_images_per_s": args.images / statistics.median(r["wall_s"] for r in runs[name]),
                "cores_for_target": args.target / rate,
            }
            fast = args.images / statistics.median(r["cpu_s"] for r in batched[name])
            fast_aug_us = 1e6 * statistics.median(r["per_image_cpu_s"] for r in batched[name]) / args.images
            row.update(batched_images_per_cpu_s=fast, batched_augment_us=fast_aug_us,
                       batched_cores_for_target=args.target / fast, ratio=fast / rate,
                       augment_ratio=row["per_image_us"] / fast_aug_us)
            table[name] = row
            print(f"{name:36s} {rate:10,.0f} {row['us_per_image']:7.1f} {row['per_image_us']:10.1f} "
                  f"{row['per_batch_us']:7.1f} {row['wall_images_per_s']:10,.0f} {row['cores_for_target']:12.1f} "
                  f"{fast:12,.0f} {row['batched_cores_for_target']:12.1f} {row['ratio']:6.1f} "
                  f"{row['augment_ratio']:9.1f}")
        results["pipelines"][source] = table
    if model is not None:
        rate = model["images"] / model["cpu_s"]
        results["model_step"] = {"images_per_cpu_s": rate, "wall_images_per_s": model["images"] / model["wall_s"]}
        print(f"\nstudy_l training step (CPU, fp32, batch {args.batch_size}): {rate:,.0f} img/s per core "
              f"({model['images'] / model['wall_s']:,.0f} wall)")
    else:
        print("\nstudy_l training step: skipped (trainables.model.vit not importable or --model-steps 0)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return results


if __name__ == "__main__":
    main()
