"""Study L's headline on one GPU: baseline, CutMix, AutoAugment and modern, one seed, one pack.

    timeout -k 10 540 env PYTHONPATH=. python3 bench/gpu_study_l.py --data-root DATA/cifar10-jpeg \
        --out $OUT/results --storage /tmp/gpu-storage                              # a GPU, < 8 min
    PYTHONPATH=. python3 bench/gpu_study_l.py --tiny --out DIR                     # anywhere (CPU), seconds
    PYTHONPATH=. python3 bench/gpu_study_l.py --time-snapshot --out DIR            # one snapshot measurement, timed
    vitsweep report study_l_gpu --results DIR                                      # back here: the report

The tables are written under ``--out`` as the run goes (each file whole: written aside, then renamed):
every member's ``trials`` row ("running") before the first step and again when training ends, its
``epochs`` table after every epoch, one ``measurements`` file per snapshot as it is measured, the
final snapshots first (the headline's minimum MAD), then the others. A run killed at its ``timeout``
keeps what it had written; the checkpoints and snapshots go to ``--storage`` (default
``OUT/storage``), which a device tool's output folder should not hold (about 5 MB a snapshot).

Needs torch, torchvision, numpy, pandas and pyarrow (what a bare GPU machine's Python has); no Ray,
MLflow or Optuna: it calls the training loop (``trainables.loop.train.train_pack``) and the measurement
(``analysis.measuring.evaluate.evaluate_checkpoint``) directly and writes the project's ``trials``, ``epochs``
and ``measurements`` tables under ``--out`` (``records.tables``), which ``vitsweep report`` reads.
docs/operations.md says how to run it on a bare GPU machine and bring the tables back.

What it trains: Study L's model (preset ``study_l``: depth 8, dim 192, 8 heads, MLP ratio 2, ~2.4M
parameters, 8x8 patches of 4 px, APE) under Lee et al.'s recipe (``sweeps.studies.study_l.LEE_RECIPE``:
AdamW lr 1e-3, wd 0.05 on every parameter, pad-4 crop + flip, CutMix on half the batches, batch
128, cosine after a 10% warm-up) on all 50,000 training images of ``cifar10-jpeg`` (the ``folder``
data set), seed 0, the four protocols that decide Study L's headline (``PROTOCOLS``) packed on the
one device. After each epoch a fixed 1,000-image stratified subset of the test split is scored;
after the last, the whole split (``test_acc``). Every log-spaced snapshot (epochs 0, 1, 2, 4, ...,
last) is then measured on the whole test split: MAD, entropy and CLS mass per layer and head (and
accuracy, SSDC and dSSDC, which come with the same passes); the fragility and PE-scaling passes
are left out (``evaluate_checkpoint`` with no JPEG, blur or alpha levels).

Sizing, for 8 minutes of a GPU (``BUDGET_S``): ``START_S`` for the interpreter, CUDA and three
reads of the archive, ``MEASURE_S`` for the snapshots (an allowance never timed on a GPU:
bench/device_check.sh times one snapshot), the rest for training. bench/step_model.py estimates the
packed study_l APE step at K = 4 (eager, bf16, batch 128 per member) at 64,847 images/s for the pack
on an H100, the card a lent device machine gives first (77,773 on an H200;
``STEP_MODEL_IMAGES_PER_S`` takes the H100's): an epoch of the four members (200,000 images) in
3.1 s, so its estimate affords Lee's full 100 epochs in the 360 s of training. The step model
prices the step alone, not the augmentation (AutoAugment runs on the device), the input chunks or
the Python between kernels, so the script first trains 100 steps of the pack (``CALIBRATION_IMAGES``
per member) and trains the smaller of 100 and what that measured rate affords
(``affordable_epochs``); ``--epochs`` overrides both. The run prints the epochs it chose and why.

``--budget-s S`` with ``--epochs E`` sizes the training split instead (bench/device_check.sh's
two-epoch run): from a measured pack rate (``--images-per-s``, halved: the folder's JPEGs are decoded
by the CPU each epoch, which no GPU-only measurement saw) and a timed snapshot (``--snapshot-s``),
the images per member that E epochs, the evaluations and the snapshots' measurement fit in S seconds
(``images_for_budget``).
"""

from __future__ import annotations

import argparse
import datetime
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the repository's packages
    sys.path.insert(0, str(ROOT))

from analysis.measuring.evaluate import evaluate_checkpoint, evaluation_subset  # noqa: E402
from records import tables  # noqa: E402
from records.provenance import code_version  # noqa: E402
from records.vocab import MODERN  # noqa: E402
from sweeps.studies.study_l import LEE_RECIPE  # noqa: E402
from trainables.data.datasets import load_dataset  # noqa: E402
from trainables.loop import checkpoints  # noqa: E402
from trainables.loop.train import train_pack  # noqa: E402
from trainables.config.run_config import RunConfig  # noqa: E402

STUDY = "study_l_gpu"
PROTOCOLS = ("baseline", "cutmix", "autoaugment", MODERN)
BUDGET_S = 480.0  # 8 minutes of the GPU slot's 15: the rest starts the machine and copies files
START_S = 60.0
MEASURE_S = 60.0
STEP_MODEL_IMAGES_PER_S = 64_847  # bench/step_model.py --k 4 --pe ape: "after (eager)", H100, the whole pack
MAX_EPOCHS = 100  # Lee et al.'s
CALIBRATION_IMAGES = 12_800  # per member: 100 steps of batch 128
EPOCH_EVAL_IMAGES = 1_000
# --tiny: the same code at a size a CPU runs in seconds: a small folder of random images it writes
# itself (10 classes, TINY_IMAGES per class and split) and the tiny preset.
TINY = {"preset": "tiny", "epochs": 2, "batch_size": 16, "epoch_eval_images": 20, "device": "cpu", "num_workers": 0}
TINY_IMAGES, TINY_CALIBRATION_IMAGES = 8, 32


def affordable_epochs(train_s: float, images_per_s: float, train_images: int, members: int) -> int:
    """Epochs of ``members`` trials of ``train_images`` each that ``train_s`` seconds of training buy at
    ``images_per_s`` for the whole pack; at least 1, at most ``MAX_EPOCHS``."""
    return max(1, min(MAX_EPOCHS, math.floor(train_s * images_per_s / (train_images * members))))


def images_for_budget(budget_s: float, images_per_s: float, snapshot_s: float, epochs: int, members: int,
                      *, full: int = 50_000, minimum: int = 1_280) -> int:
    """Training images per member such that ``epochs`` epochs of the pack at half of ``images_per_s``
    (the whole pack's measured rate), ``START_S`` and every snapshot's measurement (``snapshot_s`` each)
    fit in ``budget_s``; at least ``minimum`` (ten steps), at most ``full``."""
    from trainables.loop.train import snapshot_epochs

    measure_s = members * len(snapshot_epochs(epochs)) * snapshot_s
    train_s = budget_s - START_S - measure_s
    return max(minimum, min(full, math.floor(train_s * images_per_s / 2 / (epochs * members))))


def configs(*, data_root: str, epochs: int, tiny: bool, device: str, **extra) -> list[RunConfig]:
    base = dict(TINY) if tiny else {"preset": "study_l", "epoch_eval_images": EPOCH_EVAL_IMAGES, "device": device}
    preset = base.pop("preset")
    base.update(epochs=epochs, **extra)
    return [RunConfig.for_dataset("folder", preset=preset, **{
        **LEE_RECIPE, **base, "study": STUDY, "data_root": data_root, "pe": "ape", "protocol": protocol, "seed": 0,
        "warmup_epochs": max(1, epochs // 10) if epochs > 1 else 0,
        "checkpoint_every": epochs})  # one resumable checkpoint, at the end: nothing here resumes
        for protocol in PROTOCOLS]


def tiny_folder(root: Path) -> str:
    """A train/<class>/ + test/<class>/ folder of random 32 px PNGs, as cifar10-jpeg lays them out."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in range(10):
            (root / split / f"class{c}").mkdir(parents=True, exist_ok=True)
            for i in range(TINY_IMAGES):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / f"class{c}" / f"{i}.png")
    return str(root)


def calibrate(args: argparse.Namespace) -> float:
    """Training images/s of the whole pack, from one short epoch of the real loop (a warm-up
    included, so it errs low)."""
    images = TINY_CALIBRATION_IMAGES if args.tiny else CALIBRATION_IMAGES
    cfgs = configs(data_root=args.data_root, epochs=1, tiny=args.tiny, device=args.device, max_train_images=images,
                   epoch_eval_images=0)
    scratch = Path(tempfile.mkdtemp(prefix="gpu_study_l_calibration-"))
    try:
        finals = train_pack(cfgs, [scratch / c.trial_id for c in cfgs], log=lambda line: None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return sum(f["images_per_s"] for f in finals)


def choose_epochs(args: argparse.Namespace, train_images: int) -> int:
    if args.epochs:
        print(f"epochs: {args.epochs} (--epochs)")
        return args.epochs
    train_s = BUDGET_S - START_S - MEASURE_S
    estimated = affordable_epochs(train_s, STEP_MODEL_IMAGES_PER_S, train_images, len(PROTOCOLS))
    t0 = time.perf_counter()
    rate = calibrate(args)
    train_s -= time.perf_counter() - t0
    measured = affordable_epochs(train_s, rate, train_images, len(PROTOCOLS))
    if args.tiny:  # the sizing ran; the epochs stay tiny
        print(f"epochs: {TINY['epochs']} (--tiny; the budget would afford {min(estimated, measured)})")
        return TINY["epochs"]
    print(f"epochs: {min(estimated, measured)} = min(step model {estimated} at {STEP_MODEL_IMAGES_PER_S:,} img/s, "
          f"measured {measured} at {rate:,.0f} img/s for the pack) in {train_s:.0f} s of training", flush=True)
    return min(estimated, measured)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def run(args: argparse.Namespace) -> list[dict]:
    out, version, started = str(Path(args.out).resolve()), args.code_version or code_version(), now()
    train_images = 10 * TINY_IMAGES if args.tiny else 50_000
    extra = {}
    if args.budget_s:
        extra["max_train_images"] = images_for_budget(args.budget_s, args.images_per_s, args.snapshot_s, args.epochs,
                                                      len(PROTOCOLS), full=train_images,
                                                      minimum=min(train_images, 1_280))
        print(f"training images per member: {extra['max_train_images']:,} of {train_images:,} (--budget-s "
              f"{args.budget_s:.0f} at half of {args.images_per_s:,.0f} img/s, {args.snapshot_s:.1f} s a snapshot)",
              flush=True)
    epochs = choose_epochs(args, train_images)
    cfgs = configs(data_root=args.data_root, epochs=epochs, tiny=args.tiny, device=args.device, **extra)
    storage = Path(args.storage).resolve() if args.storage else Path(out) / "storage"
    workdirs = [storage / STUDY / c.trial_id for c in cfgs]
    histories: dict[str, list[dict]] = {c.trial_id: [] for c in cfgs}

    def row(cfg, workdir, status, final=None):  # a trials row: "running" before training, final after
        final = final or {}
        return {"trial_id": cfg.trial_id, "study": STUDY, "status": status,
                **{k: final.get(k) for k in ("epochs_completed", "train_loss", "train_acc", "eval_loss", "eval_acc",
                                             "test_acc", "did_not_learn", "wall_time_s", "error")},
                "checkpoint_path": str(checkpoints.local_checkpoint(workdir).parent),
                "snapshot_dir": str(workdir / checkpoints.SNAPSHOT_DIR), "code_version": version,
                "pack": f"{STUDY}-pack", "started_at": started, "ended_at": None if status == "running" else now()}

    for cfg, workdir in zip(cfgs, workdirs):  # a run killed in training still names its trials
        tables.write_trial(out, STUDY, cfg.to_flat(), row(cfg, workdir, "running"))

    def report(members):  # each epoch: every member's row, its epochs table rewritten
        for trial_id, metrics, _ in members:
            histories[trial_id].append(metrics)
            tables.write_epochs(out, STUDY, trial_id, histories[trial_id])

    t0 = time.perf_counter()
    finals = train_pack(cfgs, workdirs, report=report)
    print(f"trained {len(cfgs)} x {epochs} epochs in {time.perf_counter() - t0:.0f} s", flush=True)
    for cfg, workdir, final in zip(cfgs, workdirs, finals):
        tables.write_trial(out, STUDY, cfg.to_flat(), row(cfg, workdir, "failed" if final["error"] else "finished",
                                                          final))
    return measure(out, cfgs, workdirs, args)


def measure(out: str, cfgs: list[RunConfig], workdirs: list[Path], args: argparse.Namespace) -> list[dict]:
    """Every snapshot of every member on the whole test split: the attention passes only; every member's
    final snapshot first (the headline), then the others by epoch. One status dict per snapshot."""
    import torch

    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    data = load_dataset(cfgs[0].dataset, cfgs[0].data_root, seed=0)
    images, labels = evaluation_subset(data.test, seed=0)
    snapshots = []  # (not the member's last, epoch, member, cfg, path): the finals first, then by epoch
    for member, (cfg, workdir) in enumerate(zip(cfgs, workdirs)):
        paths = {checkpoints.snapshot_epoch(path.name): path for path in checkpoints.local_snapshots(workdir)}
        snapshots += [(epoch != max(paths), epoch, member, cfg, path) for epoch, path in paths.items()]
    statuses, t0 = [], time.perf_counter()
    for *_, cfg, path in sorted(snapshots, key=lambda item: item[:3]):
        model, _, epoch = checkpoints.load_model(path, map_location=device)
        rows = measure_snapshot(model, images, labels, data, cfg, device)
        tables.write_measurements(out, STUDY, cfg.trial_id, epoch, rows)
        statuses.append({"trial_id": cfg.trial_id, "epoch": epoch, "rows": len(rows)})
    print(f"measured {len(statuses)} snapshots on {len(labels):,} test images in {time.perf_counter() - t0:.0f} s; "
          f"the report: vitsweep report {STUDY} --results {out}", flush=True)
    return statuses


def measure_snapshot(model, images, labels, data, cfg: RunConfig, device) -> list[dict]:
    """One snapshot's measurement as ``measure`` runs it: the attention passes, no fragility or PE scaling."""
    return evaluate_checkpoint(model, images, labels, mean=data.mean, std=data.std, grid=cfg.model.grid,
                               jpeg_levels=(), blur_levels=(), alphas=(), device=device, batch_size=500)


def time_snapshot(args: argparse.Namespace) -> dict:
    """One snapshot measurement timed, as ``measure`` runs it, on a fresh model of the run's shape and
    random images the size of the CIFAR-10 test split (10,000; 80 with --tiny): its seconds size the
    snapshots' allowance. Written to OUT/snapshot_timing.json."""
    import json

    import torch

    from trainables.model.packed import init_member

    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    # CIFAR-10's shapes (32 px, 10 classes): the folder data set would want its folder to exist
    cfg = RunConfig.for_dataset("cifar10", preset=TINY["preset"] if args.tiny else "study_l", pe="ape",
                                data_root="/unused", device=str(device))
    n = 10 * TINY_IMAGES if args.tiny else 10_000
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    data = argparse.Namespace(mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26))
    model = init_member(cfg).to(device).eval()
    timing = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "preset": cfg.preset, "images": n}
    for name in ("first_s", "snapshot_s"):  # the first pays the one-off costs (kernels chosen, caches)
        t0 = time.perf_counter()
        rows = measure_snapshot(model, images, labels, data, cfg, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timing[name] = time.perf_counter() - t0
    timing["rows"] = len(rows)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "snapshot_timing.json").write_text(json.dumps(timing, indent=2))
    print(f"one snapshot measurement: {timing['snapshot_s']:.2f} s ({timing['first_s']:.2f} s the first), "
          f"{n:,} images, {timing['device']}", flush=True)
    return timing


def run_tiny(args: argparse.Namespace) -> list[dict]:
    scratch = Path(tempfile.mkdtemp(prefix="gpu_study_l_tiny-"))
    try:
        args.data_root = tiny_folder(scratch)
        return run(args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the results folder: tables under OUT/study_l_gpu/")
    parser.add_argument("--data-root", default="data/cifar10-jpeg",
                        help="cifar10-jpeg unpacked: a folder of train/<class>/ and test/<class>/ (not with --tiny)")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU, a tiny folder of random images it writes, the tiny model: seconds")
    parser.add_argument("--epochs", type=int, default=0, help="epochs (default: what the budget affords)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--code-version", help="the git commit the copy was made from (default: this checkout's)")
    parser.add_argument("--storage", help="checkpoints and snapshots (default OUT/storage): keep them out of a "
                                          "device tool's output folder")
    parser.add_argument("--time-snapshot", action="store_true",
                        help="time one snapshot measurement (OUT/snapshot_timing.json) and stop; "
                             "with --tiny on the CPU")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="with --epochs: the training images per member that fit this many seconds")
    parser.add_argument("--images-per-s", type=float, default=STEP_MODEL_IMAGES_PER_S,
                        help="with --budget-s: the pack's measured training images/s (default the step model's)")
    parser.add_argument("--snapshot-s", type=float, default=MEASURE_S / 32,
                        help="with --budget-s: seconds to measure one snapshot (default MEASURE_S / 32)")
    args = parser.parse_args(argv)
    if args.epochs < 0:
        parser.error(f"--epochs must be >= 1 (0: what the budget affords), got {args.epochs}")
    if args.budget_s and not args.epochs:
        parser.error("--budget-s sizes the training split for a given --epochs")
    if args.time_snapshot:
        return time_snapshot(args)
    if not args.tiny and not (Path(args.data_root) / "train").is_dir():
        parser.error(f"--data-root {args.data_root!r} has no train/ folder: unpack cifar10-jpeg.tar.gz and name "
                     "its cifar10-jpeg/ folder")
    return run_tiny(args) if args.tiny else run(args)


if __name__ == "__main__":
    main()
