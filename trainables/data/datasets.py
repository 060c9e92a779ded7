"""Data sets: one entry point (`load_dataset`), each set's loader its line in `trainables.data.formats.LOADERS`.

    splits = load_dataset("cifar100", "data", seed=0, holdout_fraction=0.05)
    image, label = splits.train[0]          # uint8 (3, 32, 32), int
    splits.num_classes, splits.patch_size   # 100, 4 (an 8x8 grid of patches)

Each set's classes, sizes, statistics, root layout and how to obtain it are its row in
`trainables.config.data_roots.DATASET_SPECS`: 32 px / patch 4 and 64 px / patch 8 give Study L's 8x8 grid,
224 px / patch 16 Study P's 14x14. Every split is a torch `Dataset` of (uint8 image (3, H, W), int
label). Small sets are decoded once into memory as `TensorImages` (at 32-64 px a whole training set is
150-600 MB, and decoding is then paid once per trial, not once per epoch); ImageNet-100 (and any large
`folder` set) stays on disk as `ImageFiles`, decoded per item in the DataLoader workers.

`holdout` is a seeded, class-stratified fraction of the official training set, removed from `train`,
for tuning without touching `test` (the official test split: CIFAR's test batch, Tiny-ImageNet's and
ImageNet's val); `capped_subset` draws a capped training set (`max_train_images`) the same way, so a cap
keeps every class. Images of at least `LARGE_IMAGE_SIZE` px are trained ImageNet-style: `train` yields
the decoded image at its native size and the protocol's random resized crop makes the 224 px view;
`holdout` and `test` are squashed to 224 x 224 when loaded (Study P's code: `images.eval_view`).
Smaller sets are stored at their final size and trained with pad-and-crop. A bad name raises
`ValueError` listing the names; a missing or malformed root `DataRootError` at once, naming the path,
what was expected there and how to obtain it.

Under Ray every Train worker is a fresh process that would decode its set again (the demo's 12,000
`shapes` images: ~1 s CPU; Tiny-ImageNet's 110,000 JPEGs: ~9 s at the subset's rate). With
`$VITSWEEP_DATA_SHARED` naming a folder (the Ray worker sets it to its node's session folder,
`trainables.trial.ray_trial`) the first process of a node decodes the in-memory splits once into it and
every process maps them (`shared_splits`): one copy per node.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from trainables.data import formats, images, shapes
from trainables.data.images import TensorImages
from trainables.config import data_roots
from trainables.config.data_roots import dataset_spec, patch_size_for

SPLIT_NAMES = ("train", "holdout", "test")
SHARED_ENV = "VITSWEEP_DATA_SHARED"  # a folder on this node for decoded in-memory sets (`shared_splits`)


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """A loaded data set. mean/std: per channel, for `images.normalize` on [0, 1] pixels. holdout_indices:
    int64, rows of the official training set that form `holdout` (ascending); `train` holds the others,
    in their original order."""

    name: str
    num_classes: int
    img_size: int
    patch_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    train: Dataset
    holdout: Dataset
    test: Dataset
    classes: tuple[str, ...] = ()
    holdout_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long), repr=False)

    def split(self, name: str) -> Dataset:
        if name not in SPLIT_NAMES:
            raise ValueError(f"unknown split {name!r}; valid: {list(SPLIT_NAMES)}")
        return getattr(self, name)


def prepare_root(name: str, root: str | os.PathLike | None = None) -> Path:
    """`data_roots.check_root`, then fetch what loading would download (CIFAR): the launcher calls it
    once per data set before any trial starts, so a missing download fails the launch
    there instead of in every Train worker (and every retry). Raises `DataRootError`."""
    path = data_roots.check_root(name, root)
    if name in formats.CIFAR_NAMES:
        formats.fetch_cifar(name, path)
    return path


def load_dataset(name: str, root: str | os.PathLike | None = None, *, seed: int = 0, holdout_fraction: float = 0.05,
                 img_size: int | None = None, download: bool = True) -> DatasetSplits:
    """Load `name` from `root` (default `$VITSWEEP_DATA_ROOT` or `./data`). seed: draws the holdout split
    (the `shapes` images themselves are fixed, like any downloaded set). holdout_fraction in [0, 1): share
    of each class of the training set moved to `holdout`. img_size: resize to this size (the native size
    by default). download: CIFAR only, fetch missing files. Through the node's shared copy when
    `$VITSWEEP_DATA_SHARED` names a folder (`shared_splits`)."""
    if not 0 <= holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must lie in [0, 1), got {holdout_fraction}")
    dataset_spec(name, root, img_size=img_size)  # a bad name, size or root fails here, before loading
    path = data_roots.check_root(name, root)

    def load() -> DatasetSplits:
        formats.check_loaders()  # a row added at run time needs its loader too
        loaded = formats.LOADERS[name](path, img_size=img_size, download=download)
        train_idx, holdout_idx = holdout_split(loaded.train.labels, holdout_fraction, seed=seed)
        return DatasetSplits(name, len(loaded.classes), loaded.img_size, patch_size_for(loaded.img_size), loaded.mean,
                             loaded.std, train=loaded.train.subset(train_idx) if len(holdout_idx) else loaded.train,
                             holdout=loaded.train.subset(holdout_idx, evaluation=True), test=loaded.test,
                             classes=loaded.classes, holdout_indices=holdout_idx)

    shared = os.environ.get(SHARED_ENV)
    if not shared:
        return load()
    # The loaders' own code is in the key too: a cluster's session outlives a launch, and the next one may
    # run other code.
    key = hashlib.sha1(json.dumps([name, str(path), img_size, seed, holdout_fraction]).encode())
    for module in (formats, shapes, images, data_roots, sys.modules[__name__]):
        key.update(Path(module.__file__).read_bytes())
    return shared_splits(Path(shared), f"{name}-{key.hexdigest()[:16]}", load)


def shared_splits(folder: Path, key: str, load: Callable[[], DatasetSplits]) -> DatasetSplits:
    """The splits `load()` gives, kept in `folder/key` and memory-mapped: the first process decodes and
    writes them (uint8 .npy files, written aside and renamed into place: a reader never sees half a set),
    then it and every later process map them copy-on-write, so a node's processes share one copy in the
    page cache and pay no decode. A process that comes while they are written waits for the writer (a
    lock file). A set whose folder is gone (its node lost, a cleaned temporary folder) or unreadable is
    built again; folder-backed splits (`ImageFiles`, decoded per item) and a folder that cannot be
    written (read-only, a full disk) leave the process its own `load()`."""
    place, unshared = folder / key, folder / f"{key}.unshared"
    if unshared.exists():  # folder-backed: nothing to share, so no process waits for another's load
        return load()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / f"{key}.lock", "w")  # noqa: SIM115 - closed by the with below
    except OSError:  # a folder this process cannot write: its own copy
        return load()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if place.is_dir():
            try:
                return _read_splits(place)
            except (OSError, ValueError, KeyError):  # truncated or half removed: built again
                shutil.rmtree(place, ignore_errors=True)
        data = load()
        if not all(isinstance(data.split(s), TensorImages) for s in SPLIT_NAMES):
            with contextlib.suppress(OSError):
                unshared.touch()
            return data
        try:
            _write_splits(data, place)
            return _read_splits(place)
        except OSError:  # a full disk, or the copy removed at once (``ray_trial.node_folder``): this one's own
            return data


def _write_splits(data: DatasetSplits, place: Path) -> None:
    aside = Path(tempfile.mkdtemp(dir=place.parent, prefix=f"{place.name}.writing-"))
    try:
        for name in SPLIT_NAMES:
            np.save(aside / f"{name}_images.npy", data.split(name).images.numpy())
            np.save(aside / f"{name}_labels.npy", data.split(name).labels.numpy())
        np.save(aside / "holdout_indices.npy", data.holdout_indices.numpy())
        meta = {"name": data.name, "num_classes": data.num_classes, "img_size": data.img_size,
                "patch_size": data.patch_size, "mean": data.mean, "std": data.std, "classes": data.classes}
        (aside / "meta.json").write_text(json.dumps(meta))
        aside.rename(place)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _read_splits(place: Path) -> DatasetSplits:
    def array(file: str) -> torch.Tensor:
        values = np.load(place / file, mmap_mode="c")  # copy-on-write: a write stays in this process
        return torch.from_numpy(values if values.size else np.array(values))

    meta = json.loads((place / "meta.json").read_text())
    splits = {name: TensorImages(array(f"{name}_images.npy"), array(f"{name}_labels.npy")) for name in SPLIT_NAMES}
    return DatasetSplits(meta["name"], meta["num_classes"], meta["img_size"], meta["patch_size"], tuple(meta["mean"]),
                         tuple(meta["std"]), **splits, classes=tuple(meta["classes"]),
                         holdout_indices=array("holdout_indices.npy"))


def input_record(data: DatasetSplits, train: Dataset, cfg: Any, device: Any) -> dict[str, Any]:
    """What a trial's MLflow run records as its input (``records.tracking.log_dataset_input``) and its
    device: the data set's name, where it was read, the sizes of the splits it trained and was scored
    on, and a digest of their labels and sizes (equal digests: the same images in the same order, for
    every data set this project loads deterministically)."""
    scored = data.test if cfg.eval_split == "test" else data.holdout
    sizes = {"train_images": len(train), "eval_images": len(scored), "eval_split": cfg.eval_split,
             "test_images": len(data.test), "holdout_images": len(data.holdout), "classes": data.num_classes,
             "img_size": data.img_size}
    digest = hashlib.sha1(json.dumps(sizes, sort_keys=True).encode())
    for split in (train, scored):
        digest.update(split.labels.to(torch.int64).numpy().tobytes())
    device_name = torch.cuda.get_device_name(device) if getattr(device, "type", "") == "cuda" else "cpu"
    return {"dataset": {"name": data.name, "digest": digest.hexdigest()[:12], "source": str(cfg.data_root), **sizes},
            "device": f"{device} ({device_name})" if device_name != "cpu" else str(device)}


def holdout_split(labels: torch.Tensor, fraction: float, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-stratified random split of rows: (train indices, holdout indices), both ascending.

    The holdout has round(fraction * N) rows; each class gives floor(fraction * n_c) and the remaining
    rows go to the classes with the largest remainders (ties in a seeded random order), so every class
    is within one image of its share."""
    n = labels.numel()
    total = round(fraction * n)
    g = torch.Generator().manual_seed(seed)
    classes, counts = labels.unique(return_counts=True)
    share = fraction * counts.double()
    quota = share.floor().long()
    missing = total - int(quota.sum())
    if missing > 0:
        tie_break = torch.rand(len(classes), generator=g, dtype=torch.float64) * 1e-6
        quota[torch.argsort(share - share.floor() + tie_break, descending=True)[:missing]] += 1
    order = torch.randperm(n, generator=g)
    holdout = torch.zeros(n, dtype=torch.bool)
    for c, q in zip(classes.tolist(), quota.tolist()):
        rows = order[labels[order] == c]  # this class's rows in a seeded random order
        holdout[rows[:q]] = True
    return (~holdout).nonzero().squeeze(1), holdout.nonzero().squeeze(1)


def capped_subset(labels: torch.Tensor, max_images: int, *, seed: int = 0) -> torch.Tensor:
    """Rows of a class-stratified random subset of ``max_images`` images (ascending int64 indices).

    For ``max_train_images``: the first N rows of a class-ordered split (folder, Tiny-ImageNet,
    ImageNet-100) hold a few classes only, so a cap samples every class in proportion (within one image
    of its share, as ``holdout_split`` draws the holdout) and keeps at least one image of every class: a
    class whose share rounds to none gets one, taken from the class furthest above its share (a cap
    below the number of classes is refused). Seeded and a function of the labels only, so every trial of
    a data set trains on the same images. ``max_images`` >= len(labels) keeps all."""
    n = labels.numel()
    if max_images < 1:
        raise ValueError(f"max_images must be >= 1, got {max_images}")
    if max_images >= n:
        return torch.arange(n)
    classes, counts = labels.unique(return_counts=True)
    if max_images < len(classes):
        raise ValueError(f"max_images={max_images} is below the {len(classes)} classes of this training split: a cap "
                         f"keeps at least one image of every class, so use max_train_images >= {len(classes)} "
                         "(or 0 for the whole split)")
    rows = holdout_split(labels, max_images / n, seed=seed)[1]
    keep = torch.zeros(n, dtype=torch.bool)
    keep[rows] = True
    class_of = torch.searchsorted(classes, labels)  # (n,) class number of every row
    share = max_images * counts.double() / n
    g = torch.Generator().manual_seed(seed)
    for c in (torch.bincount(class_of[rows], minlength=len(classes)) == 0).nonzero().squeeze(1).tolist():
        own = (class_of == c).nonzero().squeeze(1)
        keep[own[torch.randint(len(own), (1,), generator=g)]] = True
        taken = torch.bincount(class_of[keep], minlength=len(classes))
        surplus = torch.where(taken >= 2, taken - share, torch.tensor(-math.inf, dtype=torch.float64))
        donor = ((class_of == int(surplus.argmax())) & keep).nonzero().squeeze(1)
        keep[donor[torch.randint(len(donor), (1,), generator=g)]] = False
    return keep.nonzero().squeeze(1)

