"""Image containers, geometry and decoding shared by every data set format.

`TensorImages` is an in-memory split (uint8 (N, 3, H, W) + int64 labels); `ImageFiles` a lazy one
decoded per item. The geometry helpers give the evaluation resize; `trainables.data.formats` reads each
format into these containers, `trainables.data.datasets` is the registry.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torchvision.transforms.v2.functional as TF
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS as _TORCHVISION_EXTENSIONS
from torchvision.datasets.folder import make_dataset
from torchvision.io import ImageReadMode, decode_image, read_file

from trainables.config.data_roots import IMG_EXTENSIONS, LARGE_IMAGE_SIZE, DataRootError

if tuple(_TORCHVISION_EXTENSIONS) != IMG_EXTENSIONS:  # the torch-free copy lists what make_dataset accepts
    raise ValueError(f"trainables.config.data_roots.IMG_EXTENSIONS {IMG_EXTENSIONS} differ from torchvision's "
                     f"{_TORCHVISION_EXTENSIONS}")

# torchvision 0.29 deprecates torchvision.io's image codecs for TorchCodec's (not a dependency yet); the
# warning would fire once per decoded file under `-W default`.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)


# -- geometry --------------------------------------------------------------------------------


def resize_center_crop(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize the shorter side of uint8 (3, h, w) or (B, 3, h, w) `images` to `size`, then centre-crop to
    (size, size); the input itself when it already has that size."""
    h, w = images.shape[-2:]
    if h == w == size:
        return images
    if min(h, w) != size:
        images = TF.resize(images, [size], antialias=True)
    return TF.center_crop(images, [size, size])


def eval_view(images: torch.Tensor, size: int) -> torch.Tensor:
    """The evaluation view (holdout, test, the analysis set): uint8 (3, h, w) or (B, 3, h, w) -> (.., size, size).
    From `LARGE_IMAGE_SIZE` (Study P's 224 px), Study P's code: the whole image squashed to size x size
    (`T.Resize((224, 224))`, no crop), so nothing is cut off and the aspect ratio is not kept. Below it,
    `resize_center_crop` (smaller sets are stored at their size: the identity)."""
    h, w = images.shape[-2:]
    if h == w == size:
        return images
    if size >= LARGE_IMAGE_SIZE:
        return TF.resize(images, [size, size], antialias=True)
    return resize_center_crop(images, size)


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A small host tensor (indices, draws) to `device` without stalling the host: to CUDA through pinned
    memory, asynchronously (a copy from pageable memory would wait for the device to finish its queued
    work: a host sync per step). On the CPU: itself."""
    device = torch.device(device)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


_DEVICE_CONSTANTS: dict = {}


def device_constant(key, build: Callable[[], torch.Tensor]):
    """A constant of the step (normalisation stats, AutoAugment's sampling grids, a blur kernel), built by
    `build()` on first use and kept per `key` (which names the device): building it per step from host
    numbers would be a blocking host-to-device copy each time."""
    if key not in _DEVICE_CONSTANTS:
        _DEVICE_CONSTANTS[key] = build()
    return _DEVICE_CONSTANTS[key]


def _pixel_stats(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> torch.Tensor:
    # (2, 3, 1, 1): mean and std on the 0-255 scale; built once per device (`device_constant`).
    stats = torch.tensor([mean, std], dtype=torch.float32).mul(255).view(2, 3, 1, 1)
    return to_device(stats, device)


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 (B, 3, S, S) or (3, S, S) -> float32 (x / 255 - mean) / std, on the images' device."""
    mean, std = tuple(map(float, mean)), tuple(map(float, std))
    m, s = device_constant(("pixel_stats", mean, std, images.device),
                           lambda: _pixel_stats(mean, std, images.device)).unbind(0)
    return images.float().sub_(m).div_(s)


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
    `evaluation=False` (a train split): below `LARGE_IMAGE_SIZE` every image is resized and centre-cropped
    to `img_size`; from it on the image keeps its native size for the protocol's random resized crop.
    `evaluation=True`: `eval_view` (from `LARGE_IMAGE_SIZE`: squashed to `img_size` x `img_size`)."""

    def __init__(self, samples: Sequence[tuple[str, int]], img_size: int, *, evaluation: bool):
        self.samples, self.img_size, self.evaluation = list(samples), img_size, evaluation
        self.labels = torch.tensor([label for _, label in self.samples], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        image = decode(path)
        if self.evaluation:
            image = eval_view(image, self.img_size)
        elif self.img_size < LARGE_IMAGE_SIZE:
            image = resize_center_crop(image, self.img_size)
        return image, label

    def subset(self, indices: torch.Tensor, *, evaluation: bool = False) -> ImageFiles:
        return ImageFiles([self.samples[i] for i in indices.tolist()], self.img_size, evaluation=evaluation)


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 (N, 3, H, W) images on the [0, 1] scale."""
    total, squares = torch.zeros(2, 3, dtype=torch.float64)
    for chunk in images.split(4096):
        x = chunk.transpose(0, 1).reshape(3, -1).double()  # float64: sums of ~1e8 squares stay exact enough
        total += x.sum(1)
        squares += (x * x).sum(1)
    count = images.numel() / 3
    mean = total / count
    std = (squares / count - mean**2).clamp(min=0).sqrt()
    return tuple((mean / 255).tolist()), tuple((std / 255).tolist())


# -- decoding --------------------------------------------------------------------------------


def decode(path: str) -> torch.Tensor:
    """uint8 (3, h, w) RGB; greyscale and palette images are converted."""
    try:
        return decode_image(read_file(path), mode=ImageReadMode.RGB)
    except RuntimeError as err:
        raise DataRootError(f"cannot decode image {path}: {err}") from err


def decode_all(paths: Sequence[str], img_size: int) -> torch.Tensor:
    """Decode `paths` into uint8 (N, 3, S, S), resizing and centre-cropping any image of another size, in a
    small thread pool: torchvision's decoders release the GIL, so this scales with cores."""
    out = torch.empty(len(paths), 3, img_size, img_size, dtype=torch.uint8)

    def work(start: int) -> None:
        for i in range(start, min(start + 512, len(paths))):
            out[i] = resize_center_crop(decode(paths[i]), img_size)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(work, range(0, len(paths), 512)))
    return out


def list_images(folder: Path, class_to_idx: dict[str, int], obtain: str) -> list[tuple[str, int]]:
    try:
        return make_dataset(str(folder), class_to_idx, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as err:  # a class folder without images
        raise DataRootError(f"{err}. Expected image files in every class folder under {folder}. {obtain}") from err

