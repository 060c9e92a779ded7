"""What a data root must hold, checked without torch: the root checks, the studies' patch grid and
what a `folder` root says about itself (classes, image size).

`trainables.formats` (the loaders) and `trainables.images` re-export these names; they live apart
so that a launch refuses a missing or malformed root (`check_root`) and plans a `folder` sweep
(`folder_size`) before torch is imported. Class folders are listed as torchvision's
`find_classes` lists them and image sizes read from the file header (PIL), as decoding would give.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from records import vocab

DEFAULT_DATA_ROOT = os.environ.get("VITSWEEP_DATA_ROOT", "data")
LARGE_IMAGE_SIZE = 128  # from this size on: random resized crops from the full image (ImageNet practice)
IN_MEMORY_MAX_SIZE = 64  # `folder` sets up to this size ...
IN_MEMORY_MAX_IMAGES = 200_000  # ... and this many images are decoded into memory (<= 2.5 GB)
# torchvision.datasets.folder.IMG_EXTENSIONS (trainables/images.py checks they agree).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/{}-python.tar.gz"

# How to obtain each set's files: quoted in every root error (and in the registry).
OBTAIN = {
    "shapes": "Nothing to obtain: generated in memory.",
    "cifar10": "torchvision downloads it into the root when the machine has network access; otherwise fetch "
    f"{_CIFAR_URL.format('cifar-10')} elsewhere and unpack it into the root (tar xzf).",
    "cifar100": "torchvision downloads it into the root when the machine has network access; otherwise fetch "
    f"{_CIFAR_URL.format('cifar-100')} elsewhere and unpack it into the root (tar xzf).",
    "tinyimagenet": "Download http://cs231n.stanford.edu/tiny-imagenet-200.zip and unzip it into the root "
    "(the root may be tiny-imagenet-200/ itself or its parent).",
    "imagenet100": "Obtain ILSVRC-2012 from image-net.org (registration required), sort val into class folders, "
    "then build the root with trainables.formats.link_imagenet100(IMAGENET_ROOT, ROOT).",
    "folder": "Put one folder per class of image files under train/ and test/ (or val/) in the root.",
}


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


def folder_in_memory(img_size: int, count: int | None = None) -> bool:
    return img_size <= IN_MEMORY_MAX_SIZE and (count is None or count <= IN_MEMORY_MAX_IMAGES)


# -- class folders and image sizes -----------------------------------------------------------------


def find_classes(directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
    """Sorted class folder names and name -> index, as torchvision's `find_classes`."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {name: i for i, name in enumerate(classes)}


def first_image_size(folder: Path) -> int:
    """The shorter side (px) of the first image of the first class folder, from its header."""
    from PIL import Image, UnidentifiedImageError

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
    if name not in CHECKS:
        raise ValueError(f"unknown data set {name!r}; valid: {sorted(CHECKS)}")
    return CHECKS[name](Path(root if root is not None else DEFAULT_DATA_ROOT).expanduser())


def check_cifar(name: str) -> Callable[[Path], Path]:
    def check(root: Path) -> Path:
        if root.exists() and not root.is_dir():
            raise DataRootError(f"{name} root {root} is a file; expected a folder. {OBTAIN[name]}")
        return root

    return check


def check_tinyimagenet(root: Path) -> Path:
    folder = root / "tiny-imagenet-200" if (root / "tiny-imagenet-200").is_dir() else root
    expected = [folder / "train", folder / "val" / "images", folder / "val" / "val_annotations.txt"]
    missing = [str(p) for p in expected if not p.exists()]
    if missing:
        raise DataRootError(
            f"tinyimagenet: no Tiny-ImageNet under {root} (looked in {folder}); missing {missing}. Expected the "
            f"official layout tiny-imagenet-200/{{train/<wnid>/images/*.JPEG, val/images/*.JPEG, "
            f"val/val_annotations.txt}}. {OBTAIN['tinyimagenet']}"
        )
    return folder


def check_imagenet100(root: Path) -> Path:
    obtain = OBTAIN["imagenet100"]
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
    obtain = OBTAIN["folder"]
    if not (root / "train").is_dir() or folder_test_dir(root) is None:
        raise DataRootError(f"folder: expected {root / 'train'} and {root / 'test'} (or {root / 'val'}) with one "
                            f"sub-folder of images per class. {obtain}")
    train_classes, _ = find_classes(root / "train")
    test_classes, _ = find_classes(folder_test_dir(root))
    if train_classes != test_classes:
        raise DataRootError(f"folder: class folders differ between {root / 'train'} and {folder_test_dir(root)}: "
                            f"{train_classes[:5]}... vs {test_classes[:5]}...")
    return root


# Each set's root check, in the registry's order (`trainables.datasets.DATASETS` uses these).
CHECKS: dict[str, Callable[[Path], Path]] = {
    "shapes": lambda root: root,
    "cifar10": check_cifar("cifar10"),
    "cifar100": check_cifar("cifar100"),
    "tinyimagenet": check_tinyimagenet,
    "imagenet100": check_imagenet100,
    "folder": check_folder,
}
vocab.check_registry("trainables.data_roots.CHECKS", CHECKS, vocab.DATASETS, "DATASETS")
vocab.check_registry("trainables.data_roots.OBTAIN", OBTAIN, vocab.DATASETS, "DATASETS")
