"""Training input on the device: an epoch's augmented batches, chunk by chunk.

    source = TrainSource(split, spec, device=device)                     # in-memory: copied to the device once
    images, labels = source.batch(seeds, epoch, indices)                 # uint8 (n, 3, S, S), int64 (n,) on the device
    for images, labels in source.epoch(seed=0, epoch=1, batch_size=128): ...   # one step's batch at a time

`batch` is the per-step input as a pure function of (seed(s), epoch, image
indices): packed trials call it once for K members, concatenating their
indices and passing one seed per image. An epoch is augmented
`augment.CHUNK_IMAGES` (1,024) images per call, several steps at once;
since each image's draws are keyed by (seed, epoch, index) the chunk size
changes nothing but speed.

In-memory splits (`TensorImages`: CIFAR, Tiny-ImageNet, shapes, small
`folder` sets) live on the device as one uint8 (N, 3, S, S) tensor; a chunk
is an index into it, so no DataLoader, no worker and no host-to-device copy
of images per step. Folder-backed splits (`ImageFiles`: ImageNet-100, large
`folder` roots) are read by DataLoader workers that only read and decode
(plus the per-image random resized crop at native size, from the image's
key); on CUDA the workers only read the bytes and JPEGs are decoded on the
GPU (`decode_on_device`, with a CPU fallback for files nvjpeg rejects).
Either way flip and the strong augmentation run batched on the device.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torchvision.io
from torch.utils.data import DataLoader, Dataset

from trainables.augment import (
    CHUNK_IMAGES,
    Augmentation,
    apply,
    draw,
    item_keys,
    resized_crop,
    resized_crop_params,
)
from trainables.images import (
    ImageFiles,
    TensorImages,
    decode,
    eval_resize_size,
    resize_center_crop,
    to_device,
)
from trainables.protocols import epoch_order


def default_workers(requested: int = -1) -> int:
    """Decode workers: `requested` if >= 0, else the CPUs the trial holds less one (for the loop).
    Under Ray the trial's CPUs are OMP_NUM_THREADS (Ray sets it to the worker's CPU count)."""
    if requested >= 0:
        return requested
    held = int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
    return max(0, held - 1)


class TrainSource:
    """A training split plus its augmentation, feeding `device`. See the module docstring."""

    def __init__(self, split: Dataset, spec: Augmentation, *, device: torch.device | str = "cpu",
                 num_workers: int = -1, gpu_decode: bool | None = None):
        self.spec, self.device = spec, torch.device(device)
        self.split, self.length = split, len(split)
        self.in_memory = isinstance(split, TensorImages)
        if self.in_memory:
            self.images = split.images.to(self.device)
            self.labels = split.labels.to(self.device)
        elif not isinstance(split, ImageFiles):
            raise TypeError(f"TrainSource takes TensorImages or ImageFiles, got {type(split).__name__}")
        self.num_workers = default_workers(num_workers)
        self.gpu_decode = self.device.type == "cuda" if gpu_decode is None else gpu_decode

    def __len__(self) -> int:
        return self.length

    def with_spec(self, spec: Augmentation) -> TrainSource:
        """The same split, and its one device copy, under another augmentation (a pack member's protocol)."""
        other = copy.copy(self)
        other.spec = spec
        return other

    def batch(self, seeds, epoch: int, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Augmented images of `indices` (int array) for `seeds` (one int, or one per index):
        uint8 (n, 3, S, S) and labels int64 (n,) on the device. In-memory splits only."""
        if not self.in_memory:
            raise TypeError("batch() indexes in-memory splits; folder-backed splits stream through epoch()")
        indices = np.asarray(indices, dtype=np.int64)
        params = draw(self.spec, item_keys(seeds, epoch, indices))
        images = apply(self.spec, self.images, params, rows=indices)  # the indexing fused into the crop
        return images, self.labels[to_device(torch.from_numpy(indices), self.device)]

    def steps(self, batch_size: int, *, num_replicas: int = 1) -> int:
        return (self.length // num_replicas) // batch_size

    def epoch(self, *, seed: int, epoch: int, batch_size: int, num_replicas: int = 1, rank: int = 0,
              chunk_images: int = CHUNK_IMAGES) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's steps of `epoch`: (uint8 (B, 3, S, S), int64 (B,)) on the device, partial
        batches dropped; the order is `SeededSampler`'s, so it is the same as before chunking."""
        order = epoch_order(self.length, seed=seed, epoch=epoch, num_replicas=num_replicas, rank=rank,
                            drop_last=True).numpy()
        steps = len(order) // batch_size
        per_chunk = max(1, chunk_images // batch_size)
        if self.in_memory:
            for first in range(0, steps, per_chunk):
                count = min(per_chunk, steps - first)
                images, labels = self.batch(seed, epoch, order[first * batch_size:(first + count) * batch_size])
                yield from zip(images.split(batch_size), labels.split(batch_size))
            return
        yield from self._stream(seed, epoch, order[:steps * batch_size], batch_size, per_chunk)

    def _stream(self, seed: int, epoch: int, order: np.ndarray, batch_size: int, per_chunk: int):
        # Workers hand over one step's images at a time; the device augments per_chunk steps at once.
        keys = item_keys(seed, epoch, order)
        dataset = _EncodedFiles(self.split) if self.gpu_decode else _DecodedCrops(self.split, self.spec)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=list(zip(order.tolist(), keys.tolist())),
                            num_workers=self.num_workers, collate_fn=_collate, pin_memory=self.device.type == "cuda")
        buffer: list = []
        for batch_number, (batch_keys, images, labels) in enumerate(loader, 1):
            if self.gpu_decode:
                images = torch.stack(self._crop(decode_on_device(images, self.device), batch_keys))
            buffer.append((batch_keys, images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)))
            if len(buffer) == per_chunk or batch_number == len(loader):
                chunk_keys = np.concatenate([k for k, _, _ in buffer])
                images = apply(self.spec, torch.cat([i for _, i, _ in buffer]), draw(self.spec, chunk_keys))
                yield from zip(images.split(batch_size), torch.cat([y for _, _, y in buffer]).split(batch_size))
                buffer = []

    def _crop(self, decoded: list[torch.Tensor], keys: np.ndarray) -> list[torch.Tensor]:
        return [_train_crop(image, key, self.spec) for image, key in zip(decoded, keys)]


def _train_crop(image: torch.Tensor, key, spec: Augmentation) -> torch.Tensor:
    """The per-image stage at native size: the random resized crop (from LARGE_IMAGE_SIZE) or
    the resize + centre crop that smaller folder sets get when stored (ImageFiles' own rule)."""
    if not spec.resized_crop:
        return resize_center_crop(image, spec.img_size)
    h, w = image.shape[-2:]
    box = resized_crop_params(np.array([key], dtype=np.uint64), np.array([h]), np.array([w]))[0]
    return resized_crop(image, box, spec.img_size)


class _DecodedCrops(Dataset):
    """Worker side of a folder-backed split: read, decode, crop one image from its key."""

    def __init__(self, split: ImageFiles, spec: Augmentation):
        self.samples, self.spec = split.samples, spec

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, int]):
        index, key = item
        path, label = self.samples[index]
        return key, _train_crop(decode(path), key, self.spec), label


class _EncodedFiles(Dataset):
    """Worker side for GPU decoding: the file's bytes only."""

    def __init__(self, split: ImageFiles):
        self.samples = split.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, int]):
        index, key = item
        path, label = self.samples[index]
        return key, torchvision.io.read_file(path), label


def _collate(items):
    # Decoded crops stack into (B, 3, S, S); file bytes (1-D, varying length) stay a list.
    keys, images, labels = zip(*items)
    images = torch.stack(images) if images[0].dim() == 3 else list(images)
    return np.array(keys, dtype=np.uint64), images, torch.tensor(labels, dtype=torch.long)


def decode_on_device(encoded: Sequence[torch.Tensor], device: torch.device | str,
                     gpu_decoder: Callable = torchvision.io.decode_jpeg) -> list[torch.Tensor]:
    """Decode file bytes (uint8 1-D tensors) to uint8 (3, h, w) RGB images on `device`.

    JPEGs go to `gpu_decoder` (torchvision's nvjpeg `decode_jpeg`, which takes a list) in
    one call; if that call fails, each file is retried alone, and the files it still
    rejects (CMYK JPEGs exist in ImageNet; PNGs are no JPEGs) are decoded on the CPU
    and moved to the device. Returns the images in input order."""
    device = torch.device(device)
    rgb = torchvision.io.ImageReadMode.RGB
    out: list[torch.Tensor | None] = [None] * len(encoded)
    jpeg = [i for i, data in enumerate(encoded) if len(data) > 2 and int(data[0]) == 0xFF and int(data[1]) == 0xD8]
    try:
        decoded = gpu_decoder([encoded[i] for i in jpeg], mode=rgb, device=device) if jpeg else []
        for i, image in zip(jpeg, decoded):
            out[i] = image
    except RuntimeError:
        for i in jpeg:
            try:
                out[i] = gpu_decoder([encoded[i]], mode=rgb, device=device)[0]
            except RuntimeError:
                pass  # the CPU decoder below
    for i, image in enumerate(out):
        if image is None:
            out[i] = torchvision.io.decode_image(encoded[i], mode=rgb).to(device)
    return out


# -- evaluation ------------------------------------------------------------------------------


class EvalSource:
    """An evaluation split feeding `device`, never augmented: in-memory splits are copied to
    the device once; folder-backed ones are decoded (and centre-cropped) by workers."""

    def __init__(self, split: Dataset, img_size: int, *, device: torch.device | str, num_workers: int = -1):
        self.split, self.img_size, self.device = split, img_size, torch.device(device)
        self.num_workers = default_workers(num_workers)
        if isinstance(split, TensorImages):
            self.images, self.labels = split.images.to(self.device), split.labels.to(self.device)

    def batches(self, batch_size: int, *, num_replicas: int = 1, rank: int = 0):
        """This rank's shard in order (padded by repetition under DDP, like `SeededSampler`):
        (uint8 (B, 3, S, S), int64 (B,)) on the device."""
        order = epoch_order(len(self.split), seed=0, epoch=0, shuffle=False, num_replicas=num_replicas, rank=rank)
        if isinstance(self.split, TensorImages):
            size, resize_to = self.img_size, eval_resize_size(self.img_size)
            for rows in to_device(order, self.device).split(batch_size):
                yield resize_center_crop(self.images[rows], size, resize_to=resize_to), self.labels[rows]
            return
        loader = DataLoader(self.split, batch_size=batch_size, sampler=order.tolist(), num_workers=self.num_workers,
                            pin_memory=self.device.type == "cuda")
        for images, labels in loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
