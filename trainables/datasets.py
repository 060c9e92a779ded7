"""Data sets: one registry (`DATASETS`), one entry point (`load_dataset`).

    splits = load_dataset("cifar100", "data", seed=0, holdout_fraction=0.05)
    image, label = splits.train[0]          # uint8 (3, 32, 32), int
    splits.num_classes, splits.patch_size   # 100, 4 (an 8x8 grid of patches)

Every split is a torch `Dataset` of (uint8 image (3, H, W), int label).
Small sets are decoded once into memory as `TensorImages` (uint8 (N, 3, H, W)
plus int64 labels): at 32-64 px a whole training set is 150-600 MB and
decoding is then paid once per trial, not once per epoch. ImageNet-100 (and
any large `folder` set) stays on disk as `ImageFiles`, decoded per item in
the DataLoader workers.

| name | root layout | size | classes | in memory |
| ---- | ----------- | ---- | ------- | --------- |
| shapes | none (procedural, `trainables/shapes.py`) | 32 (64 via img_size) | 10 | yes |
| cifar10, cifar100 | torchvision's `cifar-10-batches-py/`, `cifar-100-python/` (downloaded) | 32 | 10 / 100 | yes |
| tinyimagenet | official `tiny-imagenet-200/` (root = it or its parent) | 64 | 200 | yes |
| imagenet100 | `train/<wnid>/`, `val/<wnid>/` (see `link_imagenet100`) | 224 | 100 | no |
| folder | any `train/<class>/` + `test/<class>/` (or `val/`) | first image's | from folders | <= 64 px, <= 200k |

Image sizes and patch sizes give the studies' grids: 32 px / patch 4 and
64 px / patch 8 -> 8x8 (Study L), 224 px / patch 16 -> 14x14 (Study P).

`holdout` is a seeded, class-stratified fraction of the official training
set, removed from `train`, for tuning without touching `test` (the official
test split: CIFAR's test batch, Tiny-ImageNet's and ImageNet's val).

Images at least `LARGE_IMAGE_SIZE` px are trained ImageNet-style: the
`train` split yields the decoded image at its native size and the protocol's
random resized crop makes the 224 px view; `holdout` and `test` are resized
(shorter side to 256 for 224) and centre-cropped when loaded. Smaller sets
are stored at their final size and trained with pad-and-crop.

A bad name raises `ValueError` listing the names; a missing or malformed
root raises `DataRootError` (a `FileNotFoundError` and a `ValueError`) at
once, naming the path, what was expected there and how to obtain it.
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torchvision
import torchvision.transforms.v2.functional as TF
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset
from torchvision.io import ImageReadMode, decode_image, read_file

from trainables import shapes

# torchvision 0.29 deprecates torchvision.io's image codecs for TorchCodec's (not a dependency
# yet); the warning would fire once per decoded file under `-W default`.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)

DEFAULT_DATA_ROOT = os.environ.get("VITSWEEP_DATA_ROOT", "data")
LARGE_IMAGE_SIZE = 128  # from this size on: random resized crops from the full image (ImageNet practice)
IN_MEMORY_MAX_SIZE = 64  # `folder` sets up to this size ...
IN_MEMORY_MAX_IMAGES = 200_000  # ... and this many images are decoded into memory (<= 2.5 GB)
SPLIT_NAMES = ("train", "holdout", "test")

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# ImageNet-100 as in CMC (Tian, Krishnan & Isola 2019, "Contrastive Multiview
# Coding"), github.com/HobbitLong/CMC/blob/master/imagenet100.txt, in that file's order.
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


class DataRootError(FileNotFoundError, ValueError):
    """A data root is missing or malformed. The message names the path, what was
    expected there and how to obtain it. Both a `FileNotFoundError` (it is about
    files) and a `ValueError` (a bad configuration value, caught as such by
    config validation)."""


# -- geometry --------------------------------------------------------------------------------


def patch_size_for(img_size: int) -> int:
    """The studies' patch size: an 8x8 grid up to 64 px (Study L), patch 16 from 128 px (Study P)."""
    if img_size >= LARGE_IMAGE_SIZE:
        if img_size % 16:
            raise ValueError(f"img_size={img_size} must be a multiple of 16 (patch 16, Study P); e.g. 224")
        return 16
    if img_size % 8 or img_size < 8:
        raise ValueError(f"img_size={img_size} must be a multiple of 8 (an 8x8 patch grid, Study L); e.g. 32 or 64")
    return img_size // 8


def eval_resize_size(img_size: int) -> int:
    """Shorter side before the centre crop at evaluation: 256 for 224 (ImageNet practice), else no margin."""
    return round(img_size * 256 / 224) if img_size >= LARGE_IMAGE_SIZE else img_size


def resize_center_crop(images: torch.Tensor, size: int, *, resize_to: int | None = None) -> torch.Tensor:
    """Resize the shorter side to `resize_to` (default `size`), then centre-crop to (size, size).

    images: uint8 (3, h, w) or (B, 3, h, w). Returns the input itself when it already has that size.
    """
    resize_to = resize_to or size
    h, w = images.shape[-2:]
    if h == w == size:
        return images
    if min(h, w) != resize_to:
        images = TF.resize(images, [resize_to], antialias=True)
    return TF.center_crop(images, [size, size])


# -- splits ----------------------------------------------------------------------------------


class TensorImages(Dataset):
    """An in-memory split. images: uint8 (N, 3, H, W); labels: int64 (N,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be uint8 (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must be ({images.shape[0]},), got {tuple(labels.shape)}")
        self.images, self.labels = images, labels.long()

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])

    def subset(self, indices: torch.Tensor, *, evaluation: bool = False) -> TensorImages:
        """A new split of the rows `indices` (a copy, so the parent can be freed). `evaluation` is
        accepted for symmetry with `ImageFiles`: stored images are final, eval or not."""
        return TensorImages(self.images[indices], self.labels[indices])


class ImageFiles(Dataset):
    """A lazy split: (path, label) samples decoded per item with `torchvision.io.decode_image` (RGB).

    `evaluation=False` (a train split): below `LARGE_IMAGE_SIZE` every image is
    resized and centre-cropped to `img_size`; from it on the image keeps its
    native size for the protocol's random resized crop. `evaluation=True`:
    resize the shorter side to `eval_resize_size(img_size)` (256 for 224), then
    centre-crop to `img_size`.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], img_size: int, *, evaluation: bool):
        self.samples, self.img_size, self.evaluation = list(samples), img_size, evaluation
        self.labels = torch.tensor([label for _, label in self.samples], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        image = _decode(path)
        if self.evaluation:
            image = resize_center_crop(image, self.img_size, resize_to=eval_resize_size(self.img_size))
        elif self.img_size < LARGE_IMAGE_SIZE:
            image = resize_center_crop(image, self.img_size)
        return image, label

    def subset(self, indices: torch.Tensor, *, evaluation: bool = False) -> ImageFiles:
        return ImageFiles([self.samples[i] for i in indices.tolist()], self.img_size, evaluation=evaluation)


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """A loaded data set. mean/std: per channel, for `protocols.normalize` on [0, 1] pixels.

    holdout_indices: int64, rows of the official training set that form `holdout`
    (ascending); `train` holds the others, in their original order.
    """

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


# -- registry --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loaded:
    classes: tuple[str, ...]
    train: TensorImages | ImageFiles
    test: TensorImages | ImageFiles
    img_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


@dataclass(frozen=True)
class DatasetInfo:
    """What is known about a data set without loading it (for configs, dry runs and checks).

    num_classes/img_size are None only for `folder` before a root is inspected
    (`dataset_info("folder", root)` fills them in); mean/std are None where they
    are computed from the loaded training images.
    """

    name: str
    num_classes: int | None
    img_size: int | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    in_memory: bool
    description: str
    obtain: str  # how to get the files, quoted in root errors
    load: Callable[..., _Loaded] = field(repr=False, compare=False, default=None)
    check: Callable[[Path], Path] = field(repr=False, compare=False, default=None)

    @property
    def patch_size(self) -> int | None:
        return None if self.img_size is None else patch_size_for(self.img_size)

    @property
    def grid(self) -> int | None:
        return None if self.img_size is None else self.img_size // self.patch_size


def dataset_info(name: str, root: str | os.PathLike | None = None, *, img_size: int | None = None) -> DatasetInfo:
    """The registry entry of `name`, with `img_size` applied; for `folder`, read from `root`."""
    info = _info(name)
    if name == "folder":
        if root is None:
            raise ValueError("data set 'folder' needs a root to read its classes and image size from")
        path = info.check(Path(root))
        classes, _ = find_classes(path / "train")
        size = img_size or _first_image_size(path / "train")
        return replace(info, num_classes=len(classes), img_size=size, in_memory=_folder_in_memory(size))
    if img_size is not None:
        patch_size_for(img_size)  # raises on a size without the studies' grid
        info = replace(info, img_size=img_size)
    return info


def check_root(name: str, root: str | os.PathLike | None = None) -> Path:
    """Resolve and validate a data root without loading anything; raises `DataRootError`.

    For CIFAR a missing folder is fine (it is downloaded into it)."""
    info = _info(name)
    return info.check(_root(root))


def load_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    seed: int = 0,
    holdout_fraction: float = 0.05,
    img_size: int | None = None,
    download: bool = True,
) -> DatasetSplits:
    """Load `name` from `root` (default `$VITSWEEP_DATA_ROOT` or `./data`).

    seed: draws the holdout split (the `shapes` images themselves are fixed,
    like any downloaded set). holdout_fraction in [0, 1): share of each class of
    the training set moved to `holdout`. img_size: resize to this size (the
    native size by default). download: CIFAR only, fetch missing files.
    """
    info = _info(name)
    if not 0 <= holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must lie in [0, 1), got {holdout_fraction}")
    if img_size is not None:
        patch_size_for(img_size)
    path = info.check(_root(root)) if name != "shapes" else None
    loaded = info.load(path, img_size=img_size, download=download)
    train_idx, holdout_idx = holdout_split(loaded.train.labels, holdout_fraction, seed=seed)
    return DatasetSplits(
        name=name,
        num_classes=len(loaded.classes),
        img_size=loaded.img_size,
        patch_size=patch_size_for(loaded.img_size),
        mean=loaded.mean,
        std=loaded.std,
        train=loaded.train.subset(train_idx) if len(holdout_idx) else loaded.train,
        holdout=loaded.train.subset(holdout_idx, evaluation=True),
        test=loaded.test,
        classes=loaded.classes,
        holdout_indices=holdout_idx,
    )


def holdout_split(labels: torch.Tensor, fraction: float, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-stratified random split of rows: (train indices, holdout indices), both ascending.

    The holdout has round(fraction * N) rows; each class gives floor(fraction * n_c)
    and the remaining rows go to the classes with the largest remainders (ties in
    a seeded random order), so every class is within one image of its share.
    """
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


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 (N, 3, H, W) images on the [0, 1] scale."""
    total = torch.zeros(3, dtype=torch.float64)
    squares = torch.zeros(3, dtype=torch.float64)
    for chunk in images.split(4096):
        x = chunk.transpose(0, 1).reshape(3, -1).double()  # float64: sums of ~1e8 squares stay exact enough
        total += x.sum(1)
        squares += (x * x).sum(1)
    count = images.numel() / 3
    mean = total / count
    std = (squares / count - mean**2).clamp(min=0).sqrt()
    return tuple((mean / 255).tolist()), tuple((std / 255).tolist())


def _info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; valid: {sorted(DATASETS)}")
    return DATASETS[name]


def _root(root: str | os.PathLike | None) -> Path:
    return Path(root if root is not None else DEFAULT_DATA_ROOT).expanduser()


# -- decoding --------------------------------------------------------------------------------


def _decode(path: str) -> torch.Tensor:
    """uint8 (3, h, w) RGB; greyscale and palette images are converted."""
    try:
        return decode_image(read_file(path), mode=ImageReadMode.RGB)
    except RuntimeError as err:
        raise DataRootError(f"cannot decode image {path}: {err}") from err


def _decode_all(paths: Sequence[str], img_size: int) -> torch.Tensor:
    """Decode `paths` into uint8 (N, 3, S, S), resizing and centre-cropping any image of another size.

    A small thread pool: torchvision's decoders release the GIL, so this scales with cores."""
    out = torch.empty(len(paths), 3, img_size, img_size, dtype=torch.uint8)

    def work(start: int) -> None:
        for i in range(start, min(start + 512, len(paths))):
            out[i] = resize_center_crop(_decode(paths[i]), img_size)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(work, range(0, len(paths), 512)))
    return out


def _first_image_size(folder: Path) -> int:
    classes, class_to_idx = find_classes(folder)
    first = Path(folder) / classes[0]
    for dirpath, _, files in sorted(os.walk(first)):
        for name in sorted(files):
            if name.lower().endswith(IMG_EXTENSIONS):
                h, w = _decode(os.path.join(dirpath, name)).shape[-2:]
                return min(h, w)
    raise DataRootError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {first}")


def _list_images(folder: Path, class_to_idx: dict[str, int], obtain: str) -> list[tuple[str, int]]:
    try:
        return make_dataset(str(folder), class_to_idx, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as err:  # a class folder without images
        raise DataRootError(f"{err}. Expected image files in every class folder under {folder}. {obtain}") from err


# -- shapes ----------------------------------------------------------------------------------


def _load_shapes(root: Path | None, *, img_size: int | None, download: bool) -> _Loaded:
    size = img_size or 32
    # Data seed 0: the images are fixed like any downloaded set's; `seed` varies the holdout only.
    train_images, train_labels = shapes.make_shapes(shapes.TRAIN_SIZE, img_size=size,
                                                    seed=shapes.split_seed(0, "train"))
    test_images, test_labels = shapes.make_shapes(shapes.TEST_SIZE, img_size=size, seed=shapes.split_seed(0, "test"))
    mean, std = channel_stats(train_images)
    return _Loaded(shapes.CLASSES, TensorImages(train_images, train_labels), TensorImages(test_images, test_labels),
                   size, mean, std)


# -- CIFAR -----------------------------------------------------------------------------------

_CIFAR = {
    "cifar10": dict(
        torchvision_class=torchvision.datasets.CIFAR10,
        folder="cifar-10-batches-py",
        train=[f"data_batch_{i}" for i in range(1, 6)],
        test=["test_batch"],
        meta="batches.meta",
        label_key="labels",
        names_key="label_names",
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    ),
    "cifar100": dict(
        torchvision_class=torchvision.datasets.CIFAR100,
        folder="cifar-100-python",
        train=["train"],
        test=["test"],
        meta="meta",
        label_key="fine_labels",
        names_key="fine_label_names",
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    ),
}


def _cifar_files(name: str) -> list[str]:
    spec = _CIFAR[name]
    return [spec["meta"], *spec["train"], *spec["test"]]


def _check_cifar(name: str) -> Callable[[Path], Path]:
    def check(root: Path) -> Path:
        if root.exists() and not root.is_dir():
            raise DataRootError(f"{name} root {root} is a file; expected a folder. {DATASETS[name].obtain}")
        return root

    return check


def _load_cifar(name: str) -> Callable[..., _Loaded]:
    """torchvision downloads and verifies (md5) the official archive when files are missing; the
    pickled batches are then read here, straight into uint8 (N, 3, 32, 32) tensors. Reading them
    ourselves (a few lines) skips torchvision's NHWC numpy copy and its md5 check of files that are
    already present, which also lets tests use small files in the official format."""
    spec = _CIFAR[name]

    def load(root: Path, *, img_size: int | None, download: bool) -> _Loaded:
        folder = root / spec["folder"]
        missing = [f for f in _cifar_files(name) if not (folder / f).is_file()]
        if missing:
            if not download:
                raise DataRootError(_cifar_missing(name, folder, missing, "download=False"))
            try:
                spec["torchvision_class"](str(root), train=True, download=True)
            except (OSError, RuntimeError) as err:  # URLError is an OSError: no network
                raise DataRootError(_cifar_missing(name, folder, missing, f"the download failed ({err})")) from err
        with open(folder / spec["meta"], "rb") as fh:
            classes = tuple(_unpickle(fh, folder / spec["meta"])[spec["names_key"]])
        train = _read_cifar(folder, spec["train"], spec["label_key"], len(classes))
        test = _read_cifar(folder, spec["test"], spec["label_key"], len(classes))
        size = img_size or 32
        if size != 32:
            train = TensorImages(TF.resize(train.images, [size, size], antialias=True), train.labels)
            test = TensorImages(TF.resize(test.images, [size, size], antialias=True), test.labels)
        info = DATASETS[name]
        return _Loaded(classes, train, test, size, info.mean, info.std)

    return load


def _cifar_missing(name: str, folder: Path, missing: list[str], why: str) -> str:
    return (f"{name}: files {missing} are missing in {folder} and {why}. "
            f"Expected {_cifar_files(name)} there. {DATASETS[name].obtain}")


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


def _check_tinyimagenet(root: Path) -> Path:
    folder = root / "tiny-imagenet-200" if (root / "tiny-imagenet-200").is_dir() else root
    expected = [folder / "train", folder / "val" / "images", folder / "val" / "val_annotations.txt"]
    missing = [str(p) for p in expected if not p.exists()]
    if missing:
        raise DataRootError(
            f"tinyimagenet: no Tiny-ImageNet under {root} (looked in {folder}); missing {missing}. Expected the "
            f"official layout tiny-imagenet-200/{{train/<wnid>/images/*.JPEG, val/images/*.JPEG, "
            f"val/val_annotations.txt}}. {DATASETS['tinyimagenet'].obtain}"
        )
    return folder


def _load_tinyimagenet(folder: Path, *, img_size: int | None, download: bool) -> _Loaded:
    obtain = DATASETS["tinyimagenet"].obtain
    classes, class_to_idx = find_classes(folder / "train")  # sorted wnids
    train = _list_images(folder / "train", class_to_idx, obtain)
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
    info = DATASETS["tinyimagenet"]
    return _Loaded(tuple(classes), _in_memory(train, size), _in_memory(test, size), size, info.mean, info.std)


def _in_memory(samples: list[tuple[str, int]], img_size: int) -> TensorImages:
    labels = torch.tensor([label for _, label in samples], dtype=torch.long)
    return TensorImages(_decode_all([path for path, _ in samples], img_size), labels)


# -- ImageNet-100 ----------------------------------------------------------------------------


def link_imagenet100(imagenet_root: str | os.PathLike, out_root: str | os.PathLike,
                     wnids: Sequence[str] = IMAGENET100_WNIDS) -> Path:
    """Build the ImageNet-100 root from an ImageNet root, with one symlink per class folder.

    imagenet_root must hold ILSVRC-2012 in ImageFolder layout, `train/<wnid>/*.JPEG`
    and `val/<wnid>/*.JPEG` (the official val images sorted into class folders, e.g.
    with the widely used `valprep.sh`). Shell equivalent:

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


def _check_imagenet100(root: Path) -> Path:
    obtain = DATASETS["imagenet100"].obtain
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise DataRootError(f"imagenet100: no folder {root / split}; expected train/<wnid>/ and val/<wnid>/ "
                                f"under {root}. {obtain}")
    train_classes, _ = find_classes(root / "train")
    val_classes, _ = find_classes(root / "val")
    if train_classes != val_classes:
        raise DataRootError(f"imagenet100: class folders differ between {root / 'train'} and {root / 'val'} "
                            f"(only in train: {sorted(set(train_classes) - set(val_classes))[:5]}, only in val: "
                            f"{sorted(set(val_classes) - set(train_classes))[:5]})")
    return root


def _load_imagenet100(root: Path, *, img_size: int | None, download: bool) -> _Loaded:
    obtain = DATASETS["imagenet100"].obtain
    classes, class_to_idx = find_classes(root / "train")
    if set(classes) != set(IMAGENET100_WNIDS):
        warnings.warn(f"imagenet100 at {root} has {len(classes)} classes that are not the CMC ImageNet-100 list "
                      f"(IMAGENET100_WNIDS); results will not compare with Study P's", stacklevel=3)
    size = img_size or 224
    train = ImageFiles(_list_images(root / "train", class_to_idx, obtain), size, evaluation=False)
    test = ImageFiles(_list_images(root / "val", class_to_idx, obtain), size, evaluation=True)
    return _Loaded(tuple(classes), train, test, size, IMAGENET_MEAN, IMAGENET_STD)


# -- any ImageFolder -------------------------------------------------------------------------


def _folder_test_dir(root: Path) -> Path | None:
    # A real test/ wins over val/: with both present, val/ is usually a tuning split.
    return next((root / s for s in ("test", "val") if (root / s).is_dir()), None)


def _check_folder(root: Path) -> Path:
    obtain = DATASETS["folder"].obtain
    if not (root / "train").is_dir() or _folder_test_dir(root) is None:
        raise DataRootError(f"folder: expected {root / 'train'} and {root / 'test'} (or {root / 'val'}) with one "
                            f"sub-folder of images per class. {obtain}")
    train_classes, _ = find_classes(root / "train")
    test_classes, _ = find_classes(_folder_test_dir(root))
    if train_classes != test_classes:
        raise DataRootError(f"folder: class folders differ between {root / 'train'} and {_folder_test_dir(root)}: "
                            f"{train_classes[:5]}... vs {test_classes[:5]}...")
    return root


def _folder_in_memory(img_size: int, count: int | None = None) -> bool:
    return img_size <= IN_MEMORY_MAX_SIZE and (count is None or count <= IN_MEMORY_MAX_IMAGES)


def _load_folder(root: Path, *, img_size: int | None, download: bool) -> _Loaded:
    obtain = DATASETS["folder"].obtain
    classes, class_to_idx = find_classes(root / "train")
    train = _list_images(root / "train", class_to_idx, obtain)
    test = _list_images(_folder_test_dir(root), class_to_idx, obtain)
    size = img_size or _first_image_size(root / "train")
    patch_size_for(size)  # raises early for a size without the studies' grid
    if _folder_in_memory(size, len(train) + len(test)):
        train_set, test_set = _in_memory(train, size), _in_memory(test, size)
        mean, std = channel_stats(train_set.images)
    else:
        # Statistics of 1M lazily decoded images would cost a pass over the data: ImageNet's stand in.
        train_set = ImageFiles(train, size, evaluation=False)
        test_set = ImageFiles(test, size, evaluation=True)
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    return _Loaded(tuple(classes), train_set, test_set, size, mean, std)


DATASETS: dict[str, DatasetInfo] = {
    "shapes": DatasetInfo(
        "shapes", shapes.NUM_CLASSES, 32, None, None, True,
        "procedural shapes and layouts, 10 classes, 10,000 train / 2,000 test (trainables/shapes.py)",
        "Nothing to obtain: generated in memory.",
        load=_load_shapes, check=lambda root: root,
    ),
    "cifar10": DatasetInfo(
        "cifar10", 10, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), True,
        "CIFAR-10, 50,000 train / 10,000 test, 32 px",
        "torchvision downloads it into the root when the machine has network access; otherwise fetch "
        f"{_CIFAR['cifar10']['url']} elsewhere and unpack it into the root (tar xzf).",
        load=_load_cifar("cifar10"), check=_check_cifar("cifar10"),
    ),
    "cifar100": DatasetInfo(
        "cifar100", 100, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), True,
        "CIFAR-100 (fine labels), 50,000 train / 10,000 test, 32 px",
        "torchvision downloads it into the root when the machine has network access; otherwise fetch "
        f"{_CIFAR['cifar100']['url']} elsewhere and unpack it into the root (tar xzf).",
        load=_load_cifar("cifar100"), check=_check_cifar("cifar100"),
    ),
    "tinyimagenet": DatasetInfo(
        "tinyimagenet", 200, 64, (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821), True,
        "Tiny-ImageNet, 200 classes, 100,000 train / 10,000 val (used as test), 64 px",
        "Download http://cs231n.stanford.edu/tiny-imagenet-200.zip and unzip it into the root "
        "(the root may be tiny-imagenet-200/ itself or its parent).",
        load=_load_tinyimagenet, check=_check_tinyimagenet,
    ),
    "imagenet100": DatasetInfo(
        "imagenet100", 100, 224, IMAGENET_MEAN, IMAGENET_STD, False,
        "ImageNet-100 (CMC's 100 ILSVRC-2012 classes), ~126,000 train / 5,000 val (used as test), 224 px",
        "Obtain ILSVRC-2012 from image-net.org (registration required), sort val into class folders, then "
        "build the root with trainables.datasets.link_imagenet100(IMAGENET_ROOT, ROOT).",
        load=_load_imagenet100, check=_check_imagenet100,
    ),
    "folder": DatasetInfo(
        "folder", None, None, None, None, True,
        "any ImageFolder root: train/<class>/*, test/<class>/* (or val/); size from the first image",
        "Put one folder per class of image files under train/ and test/ (or val/) in the root.",
        load=_load_folder, check=_check_folder,
    ),
}
