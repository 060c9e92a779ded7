"""The data set formats: for each, a loader into `trainables.data.images` containers.

Each loader returns a `Loaded` (classes, train and test splits, size, channel statistics) and has its line
in `LOADERS`, keyed by the set's name: its torch-free row's key in `trainables.config.data_roots.DATASET_SPECS`
(sizes, published statistics, how to obtain it, its root check), checked at import and at each load.
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision
import torchvision.transforms.v2.functional as TF

from trainables.data import shapes
from trainables.data.images import ImageFiles, TensorImages, channel_stats, decode_all, list_images
from trainables.config.data_roots import (DATASET_SPECS, IMAGENET_MEAN, IMAGENET_STD, DataRootError, find_classes,
                                        first_image_size, folder_in_memory, folder_test_dir, patch_size_for)

# ImageNet-100 as in CMC (Tian, Krishnan & Isola 2019, "Contrastive Multiview Coding"),
# github.com/HobbitLong/CMC/blob/master/imagenet100.txt, in that file's order.
IMAGENET100_WNIDS = (
    "n02869837", "n01749939", "n02488291", "n02107142", "n13037406", "n02091831", "n04517823", "n04589890",
    "n03062245", "n01773797", "n01735189", "n07831146", "n07753275", "n03085013", "n04485082", "n02105505",
    "n01983481", "n02788148", "n03530642", "n04435653", "n02086910", "n02859443", "n13040303", "n03594734",
    "n02085620", "n02099849", "n01558993", "n04493381", "n02109047", "n04111531", "n02877765", "n04429376",
    "n02009229", "n01978455", "n02106550", "n01820546", "n01692333", "n07714571", "n02974003", "n02114855",
    "n03785016", "n03764736", "n03775546", "n02087046", "n07836838", "n04099969", "n04592741", "n03891251",
    "n02701002", "n03379051", "n02259212", "n07715103", "n03947888", "n04026417", "n02326432", "n03637318",
    "n01980166", "n02113799", "n02086240", "n03903868", "n02483362", "n04127249", "n02089973", "n03017168",
    "n02093428", "n02804414", "n02396427", "n04418357", "n02172182", "n01729322", "n02113978", "n03787032",
    "n02089867", "n02119022", "n03777754", "n04238763", "n02231487", "n03032252", "n02138441", "n02104029",
    "n03837869", "n03494278", "n04136333", "n03794056", "n03492542", "n02018207", "n04067472", "n03930630",
    "n03584829", "n02123045", "n04229816", "n02100583", "n03642806", "n04336792", "n03259280", "n02116738",
    "n02108089", "n03424325", "n01855672", "n02090622",
)


# -- what a loader returns ------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    classes: tuple[str, ...]
    train: TensorImages | ImageFiles
    test: TensorImages | ImageFiles
    img_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


# -- shapes ----------------------------------------------------------------------------------


def load_shapes(root: Path | None, *, img_size: int | None, download: bool) -> Loaded:
    row = DATASET_SPECS["shapes"]
    size = img_size or row.img_size
    # Data seed 0: the images are fixed like any downloaded set's; `seed` varies the holdout only.
    train_images, train_labels = shapes.make_shapes(row.train_images, img_size=size, seed=shapes.split_seed(0, "train"))
    test_images, test_labels = shapes.make_shapes(row.test_images, img_size=size, seed=shapes.split_seed(0, "test"))
    mean, std = channel_stats(train_images)
    return Loaded(shapes.CLASSES, TensorImages(train_images, train_labels), TensorImages(test_images, test_labels),
                   size, mean, std)


# -- CIFAR -----------------------------------------------------------------------------------

_CIFAR = {
    "cifar10": dict(torchvision_class=torchvision.datasets.CIFAR10, folder="cifar-10-batches-py",
                    train=[f"data_batch_{i}" for i in range(1, 6)], test=["test_batch"], meta="batches.meta",
                    label_key="labels", names_key="label_names"),
    "cifar100": dict(torchvision_class=torchvision.datasets.CIFAR100, folder="cifar-100-python", train=["train"],
                     test=["test"], meta="meta", label_key="fine_labels", names_key="fine_label_names"),
}
CIFAR_NAMES = tuple(_CIFAR)

def _cifar_files(name: str) -> list[str]:
    spec = _CIFAR[name]
    return [spec["meta"], *spec["train"], *spec["test"]]


def load_cifar(name: str) -> Callable[..., Loaded]:
    """torchvision downloads and verifies (md5) the official archive when files are missing; the
    pickled batches are then read here, straight into uint8 (N, 3, 32, 32) tensors. Reading them
    ourselves (a few lines) skips torchvision's NHWC numpy copy and its md5 check of files that are
    already present, which also lets tests use small files in the official format."""
    spec = _CIFAR[name]

    def load(root: Path, *, img_size: int | None, download: bool) -> Loaded:
        folder = fetch_cifar(name, root, download=download)
        with open(folder / spec["meta"], "rb") as fh:
            classes = tuple(_unpickle(fh, folder / spec["meta"])[spec["names_key"]])
        train = _read_cifar(folder, spec["train"], spec["label_key"], len(classes))
        test = _read_cifar(folder, spec["test"], spec["label_key"], len(classes))
        size = img_size or DATASET_SPECS[name].img_size
        if size != DATASET_SPECS[name].img_size:
            train = TensorImages(TF.resize(train.images, [size, size], antialias=True), train.labels)
            test = TensorImages(TF.resize(test.images, [size, size], antialias=True), test.labels)
        return Loaded(classes, train, test, size, DATASET_SPECS[name].mean, DATASET_SPECS[name].std)

    return load


def fetch_cifar(name: str, root: Path, *, download: bool = True) -> Path:
    """The folder of the pickled batches under ``root``, downloaded (and md5-verified by torchvision) when
    files are missing; raises DataRootError when they cannot be had."""
    spec = _CIFAR[name]
    folder = root / spec["folder"]
    missing = [f for f in _cifar_files(name) if not (folder / f).is_file()]
    if missing:
        if not download:
            raise DataRootError(_cifar_missing(name, folder, missing, "download=False"))
        try:
            spec["torchvision_class"](str(root), train=True, download=True)
        except (OSError, RuntimeError) as err:  # URLError is an OSError: no network
            raise DataRootError(_cifar_missing(name, folder, missing, f"the download failed ({err})")) from err
    return folder


def _cifar_missing(name: str, folder: Path, missing: list[str], why: str) -> str:
    return (f"{name}: files {missing} are missing in {folder} and {why}. "
            f"Expected {_cifar_files(name)} there. {DATASET_SPECS[name].obtain}")


def _unpickle(fh, path: Path) -> dict:
    try:
        entry = pickle.load(fh, encoding="latin1")
    except Exception as err:  # truncated or foreign file: any unpickling error
        raise DataRootError(f"{path} is not a CIFAR python pickle ({type(err).__name__}: {err})") from err
    if not isinstance(entry, dict):
        raise DataRootError(f"{path} is not a CIFAR python pickle (holds a {type(entry).__name__}, not a dict)")
    return entry


def _read_cifar(folder: Path, files: list[str], label_key: str, num_classes: int) -> TensorImages:
    images, labels = [], []
    for name in files:
        path = folder / name
        with open(path, "rb") as fh:
            entry = _unpickle(fh, path)
        try:
            data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)  # rows are R, G, B planes
            lab = np.asarray(entry[label_key], dtype=np.int64)
        except (KeyError, ValueError) as err:
            raise DataRootError(f"{path} lacks CIFAR fields 'data' (N, 3072) and {label_key!r}: {err}") from err
        if len(lab) != len(data) or (len(lab) and not 0 <= lab.min() <= lab.max() < num_classes):
            raise DataRootError(f"{path}: {len(data)} images but {len(lab)} labels, "
                                f"or labels outside 0..{num_classes - 1}")
        images.append(torch.from_numpy(data))
        labels.append(torch.from_numpy(lab))
    return TensorImages(torch.cat(images), torch.cat(labels))


# -- Tiny-ImageNet ---------------------------------------------------------------------------


def load_tinyimagenet(folder: Path, *, img_size: int | None, download: bool) -> Loaded:
    obtain = DATASET_SPECS["tinyimagenet"].obtain
    classes, class_to_idx = find_classes(folder / "train")  # sorted wnids
    train = list_images(folder / "train", class_to_idx, obtain)
    test = []
    annotations = folder / "val" / "val_annotations.txt"
    for line_no, line in enumerate(annotations.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2 or parts[1] not in class_to_idx:
            raise DataRootError(f"{annotations}:{line_no}: expected '<file>\\t<wnid of a train class>\\t...', "
                                f"got {line!r}")
        test.append((str(folder / "val" / "images" / parts[0]), class_to_idx[parts[1]]))
    size = img_size or 64
    return Loaded(tuple(classes), _in_memory(train, size), _in_memory(test, size), size,
                   DATASET_SPECS["tinyimagenet"].mean, DATASET_SPECS["tinyimagenet"].std)


def _in_memory(samples: list[tuple[str, int]], img_size: int) -> TensorImages:
    labels = torch.tensor([label for _, label in samples], dtype=torch.long)
    return TensorImages(decode_all([path for path, _ in samples], img_size), labels)


# -- ImageNet-100 ----------------------------------------------------------------------------


def link_imagenet100(imagenet_root: str | os.PathLike, out_root: str | os.PathLike,
                     wnids: Sequence[str] = IMAGENET100_WNIDS) -> Path:
    """Build the ImageNet-100 root from an ImageNet root, with one symlink per class folder. imagenet_root
    must hold ILSVRC-2012 in ImageFolder layout, `train/<wnid>/*.JPEG` and `val/<wnid>/*.JPEG` (the
    official val images sorted into class folders, e.g. with the widely used `valprep.sh`). Shell equivalent:

        for s in train val; do mkdir -p OUT/$s
          for w in $(cat imagenet100.txt); do ln -s IMAGENET/$s/$w OUT/$s/$w; done; done
    """
    src, out = Path(imagenet_root).expanduser().resolve(), Path(out_root).expanduser()
    missing = [f"{s}/{w}" for s in ("train", "val") for w in wnids if not (src / s / w).is_dir()]
    if missing:
        raise DataRootError(f"{len(missing)} class folders missing under {src}, e.g. {missing[:3]}; "
                            f"expected ImageNet in ImageFolder layout train/<wnid>/, val/<wnid>/")
    for s in ("train", "val"):
        (out / s).mkdir(parents=True, exist_ok=True)
        for w in wnids:
            if not (out / s / w).exists():
                (out / s / w).symlink_to(src / s / w, target_is_directory=True)
    return out


def load_imagenet100(root: Path, *, img_size: int | None, download: bool) -> Loaded:
    obtain = DATASET_SPECS["imagenet100"].obtain
    classes, class_to_idx = find_classes(root / "train")
    if set(classes) != set(IMAGENET100_WNIDS):
        warnings.warn(f"imagenet100 at {root} has {len(classes)} classes that are not the CMC ImageNet-100 list "
                      f"(IMAGENET100_WNIDS); results will not compare with Study P's", stacklevel=3)
    size = img_size or 224
    train = ImageFiles(list_images(root / "train", class_to_idx, obtain), size, evaluation=False)
    test = ImageFiles(list_images(root / "val", class_to_idx, obtain), size, evaluation=True)
    return Loaded(tuple(classes), train, test, size, DATASET_SPECS["imagenet100"].mean,
                  DATASET_SPECS["imagenet100"].std)


# -- any ImageFolder -------------------------------------------------------------------------


def load_folder(root: Path, *, img_size: int | None, download: bool) -> Loaded:
    obtain = DATASET_SPECS["folder"].obtain
    classes, class_to_idx = find_classes(root / "train")
    train = list_images(root / "train", class_to_idx, obtain)
    test = list_images(folder_test_dir(root), class_to_idx, obtain)
    size = img_size or first_image_size(root / "train")
    patch_size_for(size)  # raises early for a size without the studies' grid
    if folder_in_memory(size, len(train) + len(test)):
        train_set, test_set = _in_memory(train, size), _in_memory(test, size)
        mean, std = channel_stats(train_set.images)
    else:
        # Statistics of 1M lazily decoded images would cost a pass over the data: ImageNet's stand in.
        train_set = ImageFiles(train, size, evaluation=False)
        test_set = ImageFiles(test, size, evaluation=True)
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    return Loaded(tuple(classes), train_set, test_set, size, mean, std)


# -- the loaders, by data set ---------------------------------------------------------------------
LOADERS: dict[str, Callable[..., Loaded]] = {
    "shapes": load_shapes, "cifar10": load_cifar("cifar10"), "cifar100": load_cifar("cifar100"),
    "tinyimagenet": load_tinyimagenet, "imagenet100": load_imagenet100, "folder": load_folder,
}


def check_loaders() -> None:
    """Raise ValueError naming a data set with a row (`DATASET_SPECS`) but no loader here, or the reverse."""
    for name in sorted(DATASET_SPECS.keys() ^ LOADERS.keys()):
        has, lacks = ("a loader in LOADERS", "row") if name in LOADERS else ("a row in DATASET_SPECS", "loader")
        raise ValueError(f"data set {name!r} has {has} but no {lacks}: a data set is one row in "
                         "trainables.config.data_roots.DATASET_SPECS and one loader in trainables.data.formats.LOADERS")


check_loaders()
