"""Each data set as one row (`DATASET_SPECS`), without torch: classes, split sizes, image and patch
size, normalisation statistics, how to obtain its files and how its root is checked.

The loading (`trainables.data.datasets`, each set's loader in `formats.LOADERS`), the planning (a trial's model
shape, the dry run's GPU-hours) and the report (the n behind an accuracy) read these rows; a launch
refuses a missing or malformed root (`check_root`) and plans a `folder` sweep (`dataset_spec`) before
torch is imported. A new data set is one row here (its key is its name, for every reader) and one loader
(a function in `trainables/data/formats.py` and its line in `formats.LOADERS`). Class folders are listed
as torchvision's `find_classes` lists them and image sizes read from the file header (PIL), as
decoding would give.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from PIL import Image, UnidentifiedImageError

DEFAULT_DATA_ROOT = os.environ.get("VITSWEEP_DATA_ROOT", "data")
LARGE_IMAGE_SIZE = 128  # from this size on: random resized crops from the full image (ImageNet practice)
IN_MEMORY_MAX_SIZE = 64  # `folder` sets up to this size ...
IN_MEMORY_MAX_IMAGES = 200_000  # ... and this many images are decoded into memory (<= 2.5 GB)
# torchvision.datasets.folder.IMG_EXTENSIONS (trainables/data/images.py checks they agree).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ILSVRC-2012's, [0, 1] scale
_CIFAR_OBTAIN = ("torchvision downloads it into the root when the machine has network access; otherwise fetch "
                 "https://www.cs.toronto.edu/~kriz/{}-python.tar.gz elsewhere and unpack it into the root (tar xzf).")


class DataRootError(FileNotFoundError, ValueError):
    """A data root is missing or malformed. The message names the path, what was expected there and how
    to obtain it. Both a `FileNotFoundError` (it is about files) and a `ValueError` (a bad configuration
    value, caught as such by config validation)."""


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


def folder_in_memory(img_size: int, count: int | None = None) -> bool:
    return img_size <= IN_MEMORY_MAX_SIZE and (count is None or count <= IN_MEMORY_MAX_IMAGES)


# -- class folders and image sizes -----------------------------------------------------------------


def find_classes(directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
    """Sorted class folder names and name -> index, as torchvision's `find_classes`."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {name: i for i, name in enumerate(classes)}


def first_image_size(folder: Path) -> int:
    """The shorter side (px) of the first image of the first class folder, from its header."""
    classes, _ = find_classes(folder)
    first = Path(folder) / classes[0]
    for dirpath, _, files in sorted(os.walk(first)):
        for name in sorted(files):
            if name.lower().endswith(IMG_EXTENSIONS):
                path = os.path.join(dirpath, name)
                try:
                    with Image.open(path) as image:
                        return min(image.size)
                except (UnidentifiedImageError, OSError) as err:
                    raise DataRootError(f"cannot decode image {path}: {err}") from err
    raise DataRootError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {first}")


def folder_size(root: str | os.PathLike | None) -> tuple[int, int]:
    """(classes, image size) of a `folder` root, checked (`check_folder`); raises `DataRootError`."""
    if root is None:
        raise ValueError("data set 'folder' needs a root to read its classes and image size from")
    path = check_folder(Path(root))
    classes, _ = find_classes(path / "train")
    return len(classes), first_image_size(path / "train")


# -- root checks -----------------------------------------------------------------------------------


def check_root(name: str, root: str | os.PathLike | None = None) -> Path:
    """Resolve and validate a data root without loading anything; raises `DataRootError`.

    For CIFAR a missing folder is fine (it is downloaded into it); an unknown name raises ValueError."""
    return _row(name).check(Path(root if root is not None else DEFAULT_DATA_ROOT).expanduser())


def check_cifar(name: str) -> Callable[[Path], Path]:
    def check(root: Path) -> Path:
        if root.exists() and not root.is_dir():
            raise DataRootError(f"{name} root {root} is a file; expected a folder. {DATASET_SPECS[name].obtain}")
        return root

    return check


def check_tinyimagenet(root: Path) -> Path:
    folder = root / "tiny-imagenet-200" if (root / "tiny-imagenet-200").is_dir() else root
    expected = [folder / "train", folder / "val" / "images", folder / "val" / "val_annotations.txt"]
    missing = [str(p) for p in expected if not p.exists()]
    if missing:
        raise DataRootError(f"tinyimagenet: no Tiny-ImageNet under {root} (looked in {folder}); missing {missing}. "
                            f"Expected the official layout tiny-imagenet-200/{{train/<wnid>/images/*.JPEG, "
                            f"val/images/*.JPEG, val/val_annotations.txt}}. {DATASET_SPECS['tinyimagenet'].obtain}")
    return folder


def check_imagenet100(root: Path) -> Path:
    obtain = DATASET_SPECS["imagenet100"].obtain
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


def folder_test_dir(root: Path) -> Path | None:
    # A real test/ wins over val/: with both present, val/ is usually a tuning split.
    return next((root / s for s in ("test", "val") if (root / s).is_dir()), None)


def check_folder(root: Path) -> Path:
    obtain = DATASET_SPECS["folder"].obtain
    if not (root / "train").is_dir() or (test_dir := folder_test_dir(root)) is None:
        raise DataRootError(f"folder: expected {root / 'train'} and {root / 'test'} (or {root / 'val'}) with one "
                            f"sub-folder of images per class. {obtain}")
    train_classes, _ = find_classes(root / "train")
    test_classes, _ = find_classes(test_dir)
    if train_classes != test_classes:
        raise DataRootError(f"folder: class folders differ between {root / 'train'} and {test_dir}: "
                            f"{train_classes[:5]}... vs {test_classes[:5]}...")
    return root


# -- the rows --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataSpec:
    """One data set. None: read from the root (`folder`, by `dataset_spec`) or, for mean/std, computed
    from the training images. train_images: the official training split before any holdout;
    test_images: the official test split (the n behind test_acc; the official val split where it
    stands in for it: tinyimagenet, imagenet100). mean/std: published per-channel statistics on the [0, 1] scale."""

    source: str
    num_classes: int | None
    img_size: int | None
    train_images: int | None
    test_images: int | None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    in_memory: bool = True  # decoded once into memory (else decoded per item by the DataLoader workers)
    obtain: str = "Nothing to obtain: generated in memory."  # quoted in every root error
    check: Callable[[Path], Path] = field(default=lambda root: root, repr=False, compare=False)

    @property
    def patch_size(self) -> int | None:
        return None if self.img_size is None else patch_size_for(self.img_size)

    @property
    def grid(self) -> int | None:
        return None if self.img_size is None else self.img_size // patch_size_for(self.img_size)


DATASET_SPECS: dict[str, DataSpec] = {
    "shapes": DataSpec("procedural shapes and layouts (trainables/data/shapes.py)", 10, 32, 10_000, 2_000),
    "cifar10": DataSpec("CIFAR-10", 10, 32, 50_000, 10_000, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
                        obtain=_CIFAR_OBTAIN.format("cifar-10"), check=check_cifar("cifar10")),
    "cifar100": DataSpec("CIFAR-100 (fine labels)", 100, 32, 50_000, 10_000, (0.5071, 0.4865, 0.4409),
                         (0.2673, 0.2564, 0.2762), obtain=_CIFAR_OBTAIN.format("cifar-100"),
                         check=check_cifar("cifar100")),
    "tinyimagenet": DataSpec(
        "Tiny-ImageNet", 200, 64, 100_000, 10_000, (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821),
        obtain="Download http://cs231n.stanford.edu/tiny-imagenet-200.zip and unzip it into the root "
        "(the root may be tiny-imagenet-200/ itself or its parent).", check=check_tinyimagenet),
    "imagenet100": DataSpec(
        "ImageNet-100 (CMC's 100 ILSVRC-2012 classes)", 100, 224, 126_689, 5_000, IMAGENET_MEAN, IMAGENET_STD,
        in_memory=False, check=check_imagenet100,
        obtain="Obtain ILSVRC-2012 from image-net.org (registration required), sort val into class folders, "
        "then build the root with trainables.data.formats.link_imagenet100(IMAGENET_ROOT, ROOT)."),
    "folder": DataSpec(
        "any ImageFolder root: train/<class>/*, test/<class>/* (or val/); size from the first image",
        None, None, None, None, check=check_folder,
        obtain="Put one folder per class of image files under train/ and test/ (or val/) in the root."),
}


def dataset_spec(name: str, root: str | os.PathLike | None = None, *, img_size: int | None = None) -> DataSpec:
    """The row of `name`, with `img_size` applied; a set whose classes the row leaves open (`folder`)
    reads them and its image size from `root`. An unknown name raises ValueError listing the names."""
    spec = _row(name)
    if spec.num_classes is None:
        num_classes, first_size = folder_size(root)
        size = img_size or first_size
        return replace(spec, num_classes=num_classes, img_size=size, in_memory=folder_in_memory(size))
    if img_size is not None:
        patch_size_for(img_size)  # raises on a size without the studies' grid
        spec = replace(spec, img_size=img_size)
    return spec


def _row(name: str) -> DataSpec:
    if name not in DATASET_SPECS:
        raise ValueError(f"unknown data set {name!r}; valid: {sorted(DATASET_SPECS)}")
    return DATASET_SPECS[name]
