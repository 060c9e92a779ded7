"""Data sets: the procedural `shapes` set, the loaders on small files in each official layout
(written here), the real CIFAR-10 / Tiny-ImageNet archives when ../shared/data has them,
holdout splits, and the errors a user sees."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.io import decode_image, write_jpeg, write_png

from trainables.data import shapes
from trainables.data.datasets import SHARED_ENV, capped_subset, holdout_split, load_dataset
from trainables.data.formats import IMAGENET100_WNIDS, LOADERS, link_imagenet100
from trainables.data.images import ImageFiles, TensorImages
from trainables.config.data_roots import DATASET_SPECS, DataRootError, check_root, dataset_spec, patch_size_for

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec (not a dependency yet):
# one warning per decoded file would make pytest record ~10^5 of them.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


# -- shapes ----------------------------------------------------------------------------------


def test_shapes_deterministic_per_seed_and_different_across_seeds():
    a_images, a_labels = shapes.make_shapes(200, seed=3)
    b_images, b_labels = shapes.make_shapes(200, seed=3)
    c_images, c_labels = shapes.make_shapes(200, seed=4)
    assert torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)
    assert not torch.equal(a_labels, c_labels)
    assert (a_images.float() - c_images.float()).abs().mean() > 10  # whole scenes differ, not a few pixels


@pytest.mark.parametrize("img_size", [32, 64])
def test_shapes_balanced_uint8_and_sized(img_size):
    images, labels = shapes.make_shapes(300, img_size=img_size, seed=0)
    assert images.dtype == torch.uint8 and images.shape == (300, 3, img_size, img_size)
    assert labels.dtype == torch.int64
    assert torch.bincount(labels, minlength=10).tolist() == [30] * 10
    assert images.min() < 40 and images.max() > 215  # the full range is used: real contrast


def test_shapes_objects_sit_where_their_class_says():
    """Class 1 (square near the centre) and 9 (square in a corner) differ only in position.
    Brute force over the rendered pixels: the object (pixels far from the image's median)
    has its centroid within ~3.6 px of the centre for 1 (jitter +-2.56 px per axis) and
    at least ~6 px away for 9 (edges at most 1 + 4 px from two borders, half-size <= 5.7 px)."""
    images, labels = shapes.make_shapes(400, seed=1)
    grey = images.float().mean(1)  # (N, S, S)
    median = grey.flatten(1).median(1).values.view(-1, 1, 1)
    mask = ((grey - median).abs() > 60).float()  # the object: >= 0.15 away from any background
    ys, xs = torch.meshgrid(torch.arange(32.0) + 0.5, torch.arange(32.0) + 0.5, indexing="ij")
    area = mask.sum((1, 2)).clamp(min=1)
    cy, cx = (mask * ys).sum((1, 2)) / area, (mask * xs).sum((1, 2)) / area
    offset = ((cy - 16) ** 2 + (cx - 16) ** 2).sqrt()
    assert offset[labels == 1].max() < 4.8 < offset[labels == 9].min()


def test_load_shapes_splits():
    data = load_dataset("shapes", holdout_fraction=0.05, seed=0)
    assert (data.num_classes, data.img_size, data.patch_size) == (10, 32, 4)
    assert (len(data.train), len(data.holdout), len(data.test)) == (9500, 500, 2000)
    assert isinstance(data.train, TensorImages) and data.train.images.dtype == torch.uint8
    image, label = data.test[0]
    assert image.shape == (3, 32, 32) and isinstance(label, int)
    assert all(0 < m < 1 for m in data.mean) and all(0 < s < 0.5 for s in data.std)
    assert data.classes == shapes.CLASSES
    assert data.split("holdout") is data.holdout
    with pytest.raises(ValueError, match="valid"):
        data.split("val")


# -- holdout -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.1, 0.37])
def test_holdout_disjoint_sized_and_stratified(fraction):
    labels = torch.arange(1003) % 7  # unequal class sizes: 144 or 143
    train, holdout = holdout_split(labels, fraction, seed=5)
    assert len(holdout) == round(fraction * len(labels))
    assert set(train.tolist()).isdisjoint(holdout.tolist())
    assert sorted(train.tolist() + holdout.tolist()) == list(range(len(labels)))
    per_class = torch.bincount(labels[holdout], minlength=7).double()
    assert ((per_class - fraction * torch.bincount(labels).double()).abs() < 1).all()


def test_holdout_seeded():
    labels = torch.arange(500) % 5
    assert torch.equal(holdout_split(labels, 0.1, seed=1)[1], holdout_split(labels, 0.1, seed=1)[1])
    assert not torch.equal(holdout_split(labels, 0.1, seed=1)[1], holdout_split(labels, 0.1, seed=2)[1])


def test_holdout_rows_are_removed_from_train(tmp_path):
    root = _write_folder(tmp_path / "f", classes=("a", "b"), per_class=10, size=16, fmt="png")
    full = load_dataset("folder", root, img_size=16, holdout_fraction=0.0)
    data = load_dataset("folder", root, img_size=16, holdout_fraction=0.2, seed=3)
    assert len(data.holdout) == 4 and len(data.train) == 16
    keep = sorted(set(range(20)) - set(data.holdout_indices.tolist()))
    assert torch.equal(data.holdout.images, full.train.images[data.holdout_indices])
    assert torch.equal(data.train.images, full.train.images[keep])


def test_capped_subset_keeps_every_class_of_a_class_ordered_split():
    # CIFAR-10's folder copy less a 5% holdout: 4,750 rows per class, in class order. The first
    # 20,000 rows would be classes 0-4 only; the cap must hold all ten, 2,000 each.
    labels = torch.arange(10).repeat_interleave(4750)
    rows = capped_subset(labels, 20_000, seed=0)
    assert len(rows) == 20_000 and torch.equal(rows, rows.sort().values) and rows.unique().numel() == 20_000
    assert torch.bincount(labels[rows], minlength=10).tolist() == [2000] * 10
    assert torch.equal(capped_subset(labels, 20_000, seed=0), rows)  # the same for every trial
    assert not torch.equal(capped_subset(labels, 20_000, seed=1), rows)
    uneven = torch.arange(1003) % 7
    per_class = torch.bincount(uneven[capped_subset(uneven, 100)], minlength=7).double()
    assert per_class.sum() == 100 and ((per_class - 100 / 1003 * torch.bincount(uneven)).abs() < 1).all()
    assert torch.equal(capped_subset(labels, 10**6), torch.arange(len(labels)))
    with pytest.raises(ValueError, match="max_images must be >= 1, got 0"):
        capped_subset(labels, 0)


def test_capped_subset_keeps_a_rare_class_or_refuses_a_cap_below_the_class_count():
    # 990 images of class 0, 10 of class 1: a 50-image cap's proportional share of class 1 is 0.5, which
    # the largest-remainder rounding alone may give none. Every class keeps at least one image.
    rare = torch.cat([torch.zeros(990, dtype=torch.long), torch.ones(10, dtype=torch.long)])
    for seed in range(6):
        rows = capped_subset(rare, 50, seed=seed)
        assert len(rows) == 50 and rows.unique().numel() == 50 and torch.equal(rows, rows.sort().values)
        assert torch.bincount(rare[rows], minlength=2).tolist() == [49, 1]
    # 200 classes of 5 images: a 150 cap gives 150 classes one each by share; a 300 cap covers all of them.
    many = torch.arange(200).repeat_interleave(5)
    assert torch.bincount(many[capped_subset(many, 300)], minlength=200).min() >= 1
    with pytest.raises(ValueError, match="max_images=150 is below the 200 classes.*max_train_images >= 200"):
        capped_subset(many, 150)


# -- errors ------------------------------------------------------------------------------------


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="cifar100.*folder|folder.*cifar100"):
        load_dataset("cifar1000")
    with pytest.raises(ValueError, match="tinyimagenet"):
        dataset_spec("imagenet")


@pytest.mark.parametrize("name", ["tinyimagenet", "imagenet100", "folder"])
def test_missing_root_fails_at_once_naming_path(name, tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(DataRootError, match=re.escape(str(root))) as err:
        load_dataset(name, root)
    assert isinstance(err.value, ValueError) and isinstance(err.value, FileNotFoundError)
    assert "xpected" in str(err.value)  # says what it expected there
    with pytest.raises(DataRootError, match=re.escape(str(root))):
        check_root(name, root)


def test_cifar_missing_without_download_names_root_files_and_url(tmp_path):
    with pytest.raises(DataRootError) as err:
        load_dataset("cifar100", tmp_path, download=False)
    message = str(err.value)
    assert str(tmp_path / "cifar-100-python") in message and "train" in message and "meta" in message
    assert "cifar-100-python.tar.gz" in message


def test_cifar_malformed_file_is_named(tmp_path):
    folder = _write_cifar(tmp_path, "cifar100", n_train=10, n_test=5)
    (folder / "test").write_bytes(b"not a pickle")
    with pytest.raises(DataRootError, match=re.escape(str(folder / "test"))):
        load_dataset("cifar100", tmp_path)


def test_bad_img_size_and_fraction():
    with pytest.raises(ValueError, match="multiple of 8"):
        load_dataset("shapes", img_size=36)
    with pytest.raises(ValueError, match="holdout_fraction"):
        load_dataset("shapes", holdout_fraction=1.0)


def test_tinyimagenet_annotation_with_unknown_wnid(tmp_path):
    root = _write_tinyimagenet(tmp_path, wnids=("n01", "n02"), per_class=2, val_per_class=1)
    with open(root / "val" / "val_annotations.txt", "a") as fh:
        fh.write("val_99.JPEG\tn99\t0\t0\t1\t1\n")
    with pytest.raises(DataRootError, match="val_annotations.txt:3"):
        load_dataset("tinyimagenet", root)


# -- registry ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,size,patch,classes", [
    ("shapes", 32, 4, 10), ("cifar10", 32, 4, 10), ("cifar100", 32, 4, 100),
    ("tinyimagenet", 64, 8, 200), ("imagenet100", 224, 16, 100),
])
def test_registry_gives_the_studies_grids(name, size, patch, classes):
    info = dataset_spec(name)
    assert (info.img_size, info.patch_size, info.num_classes) == (size, patch, classes)
    assert info.grid == (14 if size == 224 else 8)


def test_folder_info_reads_root(tmp_path):
    root = _write_folder(tmp_path / "f", classes=("x", "y", "z"), per_class=2, size=24, fmt="png")
    with pytest.raises(ValueError, match="needs a root"):
        dataset_spec("folder")
    info = dataset_spec("folder", root)
    assert (info.num_classes, info.img_size, info.patch_size) == (3, 24, 3)
    assert set(LOADERS) == set(DATASET_SPECS) == {"shapes", "cifar10", "cifar100", "tinyimagenet", "imagenet100",
                                                  "folder"}


def test_patch_size_rule():
    assert [patch_size_for(s) for s in (32, 64, 128, 224)] == [4, 8, 16, 16]


def test_imagenet100_list_is_cmc():
    assert len(IMAGENET100_WNIDS) == len(set(IMAGENET100_WNIDS)) == 100
    assert IMAGENET100_WNIDS[0] == "n02869837" and IMAGENET100_WNIDS[-1] == "n02090622"


# -- loaders on small files in each official layout --------------------------------------------


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_pickles(name, tmp_path):
    folder = _write_cifar(tmp_path, name, n_train=30, n_test=12)
    data = load_dataset(name, tmp_path, holdout_fraction=0.0)
    written = _read_written(folder, name)
    num_classes = 10 if name == "cifar10" else 100
    assert data.num_classes == num_classes and len(data.classes) == num_classes
    assert data.classes[3] == f"class_{3}"
    assert torch.equal(data.train.images, written["train"][0]) and torch.equal(data.train.labels, written["train"][1])
    assert torch.equal(data.test.images, written["test"][0]) and torch.equal(data.test.labels, written["test"][1])
    assert data.mean == DATASET_SPECS[name].mean
    resized = load_dataset(name, tmp_path, holdout_fraction=0.0, img_size=64)
    assert resized.train.images.shape[1:] == (3, 64, 64) and resized.patch_size == 8


def test_a_node_shared_copy_is_decoded_once_mapped_by_every_load_and_rebuilt_when_gone(tmp_path, monkeypatch):
    """With $VITSWEEP_DATA_SHARED the first load decodes and writes the splits, later loads map them
    (no decode) and get the same images; a copy that is gone or cut short is decoded again. ~0.1 s."""
    _write_cifar(tmp_path / "root", "cifar10", n_train=40, n_test=10)
    own = load_dataset("cifar10", tmp_path / "root", holdout_fraction=0.25)
    shared = tmp_path / "node"
    monkeypatch.setenv(SHARED_ENV, str(shared))
    decodes = []
    loader = LOADERS["cifar10"]
    monkeypatch.setitem(LOADERS, "cifar10", lambda *a, **kw: decodes.append(1) or loader(*a, **kw))

    def load():
        return load_dataset("cifar10", tmp_path / "root", holdout_fraction=0.25)

    def same(a, b):
        return (all(torch.equal(a.split(s).images, b.split(s).images) and torch.equal(a.split(s).labels,
                                                                                    b.split(s).labels)
                    for s in ("train", "holdout", "test"))
                and (a.classes, a.mean, a.std, a.img_size) == (b.classes, b.mean, b.std, b.img_size)
                and torch.equal(a.holdout_indices, b.holdout_indices))

    first, second = load(), load()
    assert len(decodes) == 1 and same(first, own) and same(second, own)
    (place,) = [p for p in shared.iterdir() if p.is_dir()]
    assert _mapped_from(second.train.images) == place / "train_images.npy"  # the node's file, not a copy
    other = load_dataset("cifar10", tmp_path / "root", holdout_fraction=0.5)  # another holdout: another copy
    assert len(decodes) == 2 and len(other.holdout) == 20
    shutil.rmtree(place)  # its node lost, or its temporary folder cleaned
    assert same(load(), own) and len(decodes) == 3
    (place / "train_images.npy").write_bytes(b"cut short")
    assert same(load(), own) and len(decodes) == 4


@pytest.mark.parametrize("use_parent", [True, False])
def test_tinyimagenet_layout(tmp_path, use_parent):
    wnids = ("n03", "n01", "n02")  # wnids.txt order is not sorted: classes must be
    folder = _write_tinyimagenet(tmp_path, wnids=wnids, per_class=4, val_per_class=2, grey_first=True)
    root = tmp_path if use_parent else folder
    data = load_dataset("tinyimagenet", root, holdout_fraction=0.25)
    assert data.classes == ("n01", "n02", "n03")
    assert (len(data.train), len(data.holdout), len(data.test)) == (9, 3, 6)
    assert data.train.images.shape[1:] == (3, 64, 64) and data.patch_size == 8
    # val order follows val_annotations.txt; labels are sorted-wnid indices
    expected = [sorted(wnids).index(w) for w in wnids for _ in range(2)]
    assert data.test.labels.tolist() == expected
    # greyscale JPEG (n01_0, the first training file) -> three equal channels; a colour one is not
    full = load_dataset("tinyimagenet", root, holdout_fraction=0.0)
    grey, colour = full.train.images[0], full.train.images[1]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    assert not torch.equal(colour[0], colour[1])


def test_folder_in_memory_exact_pixels(tmp_path):
    root = _write_folder(tmp_path / "f", classes=("b", "a"), per_class=3, size=32, fmt="png", test_dir="val")
    data = load_dataset("folder", root, holdout_fraction=0.0)
    assert isinstance(data.train, TensorImages) and data.classes == ("a", "b")
    first = decode_image(str(root / "train" / "a" / "0.png"))
    assert torch.equal(data.train.images[0], first)
    assert data.train.labels.tolist() == [0, 0, 0, 1, 1, 1] and len(data.test) == 6
    assert data.img_size == 32 and data.patch_size == 4


def test_folder_large_is_lazy(tmp_path, monkeypatch):
    root = _write_folder(tmp_path / "f", classes=("a", "b"), per_class=3, size=(150, 200), fmt="jpg")
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "node"))  # a node's workers: nothing of it is shared...
    data = load_dataset("folder", root, img_size=128, holdout_fraction=0.34)
    assert isinstance(data.train, ImageFiles) and isinstance(data.test, ImageFiles)
    assert [p.suffix for p in (tmp_path / "node").iterdir()].count(".unshared") == 1  # ...said once, for the next
    assert data.train[0][0].shape == (3, 150, 200)  # native size: the protocol crops it
    assert data.holdout[0][0].shape == (3, 128, 128) and data.test[0][0].shape == (3, 128, 128)
    assert data.mean == (0.485, 0.456, 0.406)


def test_imagenet100_via_symlinks(tmp_path):
    wnids = IMAGENET100_WNIDS[:3]
    imagenet = tmp_path / "imagenet"
    for split, n in (("train", 3), ("val", 2)):
        for k, w in enumerate((*wnids, "n99999999")):  # an extra class that must not be linked
            _write_images(imagenet / split / w, n, size=(260, 300), fmt="jpg", seed=k)
    root = link_imagenet100(imagenet, tmp_path / "in100", wnids=wnids)
    assert sorted(p.name for p in (root / "train").iterdir()) == sorted(wnids)
    with pytest.warns(UserWarning, match="not the CMC"):
        data = load_dataset("imagenet100", root, holdout_fraction=0.0)
    assert (data.num_classes, data.img_size, data.patch_size) == (3, 224, 16)
    assert len(data.train) == 9 and len(data.test) == 6
    assert data.train[0][0].shape == (3, 260, 300) and data.test[0][0].shape == (3, 224, 224)
    with pytest.raises(DataRootError, match="missing"):
        link_imagenet100(imagenet, tmp_path / "other")  # the full list is not there


# -- real archives (../shared/data), unpacked once per session ------------------------------------


@pytest.fixture(scope="session")
def real_data(tmp_path_factory):
    archives = [SHARED_DATA / "cifar10-jpeg.tar.gz", SHARED_DATA / "tiny-imagenet-200-subset.tar.gz"]
    if not all(a.is_file() for a in archives):
        pytest.skip(f"real-data archives not found under {SHARED_DATA} (only on the dev machines; see its README)")
    # 72k small files: on a busy disk unpacking takes ~50 s, in RAM (tmpfs) ~1 s.
    shm = Path("/dev/shm")
    in_ram = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2**30
    out = Path(tempfile.mkdtemp(prefix="vitsweep-real-data-", dir=shm)) if in_ram else tmp_path_factory.mktemp("real")
    try:
        for archive in archives:
            if shutil.which("tar"):  # GNU tar is ~20x faster than Python's tarfile on many small files
                subprocess.run(["tar", "xzf", str(archive), "-C", str(out)], check=True)
            else:
                with tarfile.open(archive) as tar:
                    tar.extractall(out, filter="data")
        yield out
    finally:
        if in_ram:
            shutil.rmtree(out, ignore_errors=True)


def test_real_cifar10_jpeg_as_folder(real_data):
    data = load_dataset("folder", real_data / "cifar10-jpeg", holdout_fraction=0.0)
    assert data.classes == CIFAR10_CLASSES  # sorted folder names = CIFAR-10's official order
    assert (len(data.train), len(data.test), data.img_size) == (50_000, 10_000, 32)
    assert torch.bincount(data.train.labels).tolist() == [5000] * 10
    assert torch.bincount(data.test.labels).tolist() == [1000] * 10
    assert data.train.labels[:5000].eq(0).all() and data.train.labels[-5000:].eq(9).all()
    # Class-ordered: a cap of the first 20,000 rows would hold 4 classes; the stratified cap holds all 10.
    assert data.train.labels[:20_000].unique().tolist() == [0, 1, 2, 3]
    assert torch.bincount(data.train.labels[capped_subset(data.train.labels, 20_000)]).tolist() == [2000] * 10
    assert abs(data.mean[0] - DATASET_SPECS["cifar10"].mean[0]) < 0.01  # JPEG copy, same statistics


def test_real_tinyimagenet_subset(real_data):
    data = load_dataset("tinyimagenet", real_data, holdout_fraction=0.05, seed=0)
    wnids = sorted((real_data / "tiny-imagenet-200" / "wnids.txt").read_text().split())
    assert data.classes == tuple(wnids) and data.num_classes == 200
    assert (len(data.train) + len(data.holdout), len(data.holdout), len(data.test)) == (10_000, 500, 2_000)
    assert data.train.images.shape[1:] == (3, 64, 64)
    first = (real_data / "tiny-imagenet-200" / "val" / "val_annotations.txt").read_text().splitlines()[0].split("\t")
    assert data.test.labels[0].item() == wnids.index(first[1])
    assert torch.bincount(data.test.labels, minlength=200).tolist() == [10] * 200


# -- writers for the official layouts ----------------------------------------------------------------


def _mapped_from(tensor: torch.Tensor) -> Path | None:
    """The file whose memory mapping holds the tensor's data (Linux: /proc/self/maps), or None."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)  # address range, perms, offset, device, inode[, path]
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end:
            return Path(fields[5]) if len(fields) == 6 else None
    return None


def _random_image(size, seed: int, grey: bool = False) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (1 if grey else 3, h, w), dtype=torch.uint8, generator=g)
    return image


def _write_images(folder: Path, n: int, *, size, fmt: str, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        image = _random_image(size, seed * 1000 + i)
        (write_png if fmt == "png" else write_jpeg)(image, str(folder / f"{i}.{fmt}"))


def _write_folder(root: Path, *, classes, per_class: int, size, fmt: str, test_dir: str = "test") -> Path:
    for split in ("train", test_dir):
        for k, c in enumerate(classes):
            _write_images(root / split / c, per_class, size=size, fmt=fmt, seed=k + (7 if split != "train" else 0))
    return root


def _write_cifar(root: Path, name: str, *, n_train: int, n_test: int) -> Path:
    """Small files in torchvision's CIFAR format (pickled dicts, 'data' (N, 3072) uint8 rows of R, G, B planes)."""
    ten = name == "cifar10"
    folder = root / ("cifar-10-batches-py" if ten else "cifar-100-python")
    folder.mkdir(parents=True)
    num_classes, label_key = (10, "labels") if ten else (100, "fine_labels")
    rng = np.random.default_rng(0)
    train_files = [f"data_batch_{i}" for i in range(1, 6)] if ten else ["train"]
    sizes = [n_train // len(train_files)] * len(train_files)
    for fname, n in [*zip(train_files, sizes), ("test_batch" if ten else "test", n_test)]:
        entry = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 label_key: rng.integers(0, num_classes, n).tolist(), "batch_label": fname}
        if not ten:
            entry["coarse_labels"] = rng.integers(0, 20, n).tolist()
        with open(folder / fname, "wb") as fh:
            pickle.dump(entry, fh)
    meta = {("label_names" if ten else "fine_label_names"): [f"class_{i}" for i in range(num_classes)]}
    with open(folder / ("batches.meta" if ten else "meta"), "wb") as fh:
        pickle.dump(meta, fh)
    return folder


def _read_written(folder: Path, name: str) -> dict:
    ten = name == "cifar10"
    files = {"train": [f"data_batch_{i}" for i in range(1, 6)] if ten else ["train"],
             "test": ["test_batch" if ten else "test"]}
    out = {}
    for split, names in files.items():
        entries = [pickle.loads((folder / n).read_bytes()) for n in names]
        images = torch.from_numpy(np.concatenate([e["data"] for e in entries]).reshape(-1, 3, 32, 32))
        labels = torch.tensor([lab for e in entries for lab in e["labels" if ten else "fine_labels"]])
        out[split] = (images, labels)
    return out


def _write_tinyimagenet(parent: Path, *, wnids, per_class: int, val_per_class: int, grey_first: bool = False) -> Path:
    folder = parent / "tiny-imagenet-200"
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for k, w in enumerate(wnids):
        images = folder / "train" / w / "images"
        images.mkdir(parents=True)
        (folder / "train" / w / f"{w}_boxes.txt").write_text("")
        for i in range(per_class):
            grey = grey_first and w == min(wnids) and i == 0
            write_jpeg(_random_image(64, k * 100 + i, grey=grey), str(images / f"{w}_{i}.JPEG"))
    lines, v = [], 0
    for w in wnids:
        for _ in range(val_per_class):
            write_jpeg(_random_image(64, 5000 + v), str(folder / "val" / "images" / f"val_{v}.JPEG"))
            lines.append(f"val_{v}.JPEG\t{w}\t0\t0\t63\t63")
            v += 1
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return folder
