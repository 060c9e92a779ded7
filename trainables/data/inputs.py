"""Training input on the device: an epoch's augmented batches, chunk by chunk.

    source = TrainSource(split, spec, device=device)                     # in-memory: copied to the device once
    images, labels = source.batch(seeds, epoch, indices)                 # uint8 (n, 3, S, S), int64 (n,) on the device
    for images, labels in source.epoch(seed=0, epoch=1, batch_size=128): ...   # one step's batch at a time
    for batches in pack_epoch(sources, seeds, epoch=1, batch_size=128): ...    # a pack: [(images, labels)] * K

`batch` is the per-step input as a pure function of (seed(s), epoch, image indices): `pack_epoch` calls
it once per protocol group of a pack's members, concatenating their indices and passing one seed per
image. An epoch is augmented `augment.CHUNK_IMAGES` (1,024) images per call, several steps at once;
since each image's draws are keyed by (seed, epoch, index) the chunk size changes nothing but speed.

In-memory splits (`TensorImages`: CIFAR, Tiny-ImageNet, shapes, small `folder` sets) live on the device
as one uint8 (N, 3, S, S) tensor; a chunk is an index into it, so no DataLoader, no worker and no
host-to-device copy of images per step. Folder-backed splits (`ImageFiles`: ImageNet-100, large
`folder` roots) are read by DataLoader workers that read and decode (plus the per-image random resized
crop at native size, from the image's key); with `gpu_decode` (the run config's, for CUDA) the
workers only read the bytes and JPEGs are decoded on the GPU (`decode_on_device`). Either way flip
and the strong augmentation run batched on the device. A pack's members share one set of workers:
the trial's CPUs, not K times them.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torchvision.io
from torch.utils.data import DataLoader, Dataset

from trainables.data.augment import (CHUNK_IMAGES, Augmentation, apply, draw, item_keys, resized_crop,
                                     resized_crop_params)
from trainables.data.datasets import capped_subset
from trainables.data.images import ImageFiles, TensorImages, decode, eval_view, resize_center_crop, to_device


def default_workers(requested: int = -1) -> int:
    """Decode workers: `requested` if >= 0, else the CPUs the trial holds less one (for the loop).
    Under Ray the trial's CPUs are OMP_NUM_THREADS (Ray sets it to the worker's CPU count)."""
    if requested >= 0:
        return requested
    held = int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
    return max(0, held - 1)


def epoch_order(length: int, *, seed: int, epoch: int, shuffle: bool = True, num_replicas: int = 1, rank: int = 0,
                drop_last: bool = False) -> torch.Tensor:
    """This rank's image indices of `epoch`, int64: the shuffle from (seed, epoch) (seeded by index -1's key),
    sharded like DistributedSampler (padded by repetition so every rank gets the same count, or the tail dropped)."""
    g = torch.Generator().manual_seed(int(item_keys(seed, epoch, -1)))
    order = torch.randperm(length, generator=g) if shuffle else torch.arange(length)
    per_rank = length // num_replicas if drop_last else -(-length // num_replicas)
    total = per_rank * num_replicas
    if total > length:
        order = order.repeat(1 + total // max(length, 1))
    return order[:total][rank::num_replicas]


class TrainSource:
    """A training split plus its augmentation, feeding `device`. See the module docstring."""

    def __init__(self, split: Dataset, spec: Augmentation, *, device: torch.device | str = "cpu",
                 num_workers: int = -1, gpu_decode: bool = False):
        self.spec, self.device = spec, torch.device(device)
        self.split, self.length = split, len(split)
        self.in_memory = isinstance(split, TensorImages)
        if self.in_memory:
            self.images = split.images.to(self.device)
            self.labels = split.labels.to(self.device)
        elif not isinstance(split, ImageFiles):
            raise TypeError(f"TrainSource takes TensorImages or ImageFiles, got {type(split).__name__}")
        self.num_workers = default_workers(num_workers)
        # GPU decoding costs two host syncs per step (`decode_on_device`): CPU workers decode by default.
        self.gpu_decode = gpu_decode

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
        batches dropped; the order is `SeededSampler`'s, so it is the same as before chunking.
        A pack of one of `pack_epoch`."""
        for batches in pack_epoch([self], [seed], epoch=epoch, batch_size=batch_size, num_replicas=num_replicas,
                                  rank=rank, chunk_images=chunk_images):
            yield batches[0]

    def order(self, seed: int, epoch: int, num_replicas: int = 1, rank: int = 0) -> np.ndarray:
        """This rank's image indices of `epoch` (`epoch_order`, the tail dropped), int64 (n,)."""
        return epoch_order(self.length, seed=seed, epoch=epoch, num_replicas=num_replicas, rank=rank,
                           drop_last=True).numpy()

    def loader(self, orders: Sequence[np.ndarray], keys: Sequence[np.ndarray], batch_size: int) -> DataLoader:
        """Folder-backed splits: ONE set of workers for a whole pack (the trial's CPUs, not K times
        them), reading (and, unless decoding on the GPU, decoding and cropping) one step of every
        member at a time: K x batch_size items, member by member, each member's in its `order` with
        its key. Yields (keys, images, labels) of the K x batch_size items."""
        steps = len(orders[0]) // batch_size

        def by_step(per_member: Sequence[np.ndarray]) -> list:  # step-major, then member, then position
            return np.stack([m[:steps * batch_size].reshape(steps, batch_size) for m in per_member], 1).ravel().tolist()

        dataset = _WorkerFiles(self.split, None if self.gpu_decode else self.spec)
        sampler = list(zip(by_step(orders), by_step(keys)))
        return DataLoader(dataset, batch_size=len(orders) * batch_size, sampler=sampler, num_workers=self.num_workers,
                          collate_fn=_collate, pin_memory=self.device.type == "cuda")


def pack_epoch(sources: Sequence[TrainSource], seeds: Sequence[int], *, epoch: int, batch_size: int,
               num_replicas: int = 1, rank: int = 0,
               chunk_images: int = CHUNK_IMAGES) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The steps of `epoch` for every member of a pack: member k reads `sources[k]` (one split,
    each member its own augmentation: `TrainSource.with_spec`) in its own order from `seeds[k]`.
    Yields per step [(uint8 (B, 3, S, S), int64 (B,)) per member], each exactly what
    `sources[k].epoch(seed=seeds[k], ...)` yields alone.

    Members with equal augmentations (a protocol group) are augmented together: per chunk of
    `chunk_images // batch_size` steps, ONE `draw` + `apply` covers all their images (each
    image's draws stay its own: its key is (its member's seed, epoch, index)), so a pack of K
    pays the kernel launches of one call per group, not of K calls."""
    if len(sources) != len(seeds) or not sources:
        raise ValueError(f"pack_epoch needs one seed per source, got {len(sources)} sources and {len(seeds)} seeds")
    first = sources[0]
    if any(s.split is not first.split or s.device != first.device for s in sources):
        raise ValueError("pack members read one split on one device (TrainSource.with_spec); got different ones")
    orders = [first.order(seed, epoch, num_replicas, rank) for seed in seeds]
    steps = len(orders[0]) // batch_size
    orders = [order[:steps * batch_size] for order in orders]
    per_chunk = max(1, chunk_images // batch_size)
    groups: dict[Augmentation, list[int]] = {}
    for k, source in enumerate(sources):
        groups.setdefault(source.spec, []).append(k)
    if not first.in_memory:
        yield from _stream_pack(first, groups, seeds, epoch, orders, batch_size, per_chunk)
        return
    for start in range(0, steps, per_chunk):
        count = min(per_chunk, steps - start)
        rows = slice(start * batch_size, (start + count) * batch_size)
        chunk: list = [None] * len(sources)
        for members in groups.values():
            indices = np.concatenate([orders[k][rows] for k in members])
            member_seeds = np.repeat(np.asarray([seeds[k] for k in members], dtype=np.int64), count * batch_size)
            images, labels = sources[members[0]].batch(member_seeds, epoch, indices)  # one call per group
            parts = zip(members, images.split(count * batch_size), labels.split(count * batch_size))
            for k, part, part_labels in parts:
                chunk[k] = (part.split(batch_size), part_labels.split(batch_size))
        for step in range(count):
            yield [(images[step], labels[step]) for images, labels in chunk]


def _stream_pack(source: TrainSource, groups: dict[Augmentation, list[int]], seeds: Sequence[int], epoch: int,
                 orders: list[np.ndarray], batch_size: int, per_chunk: int):
    # Folder-backed: the pack's workers hand over one step of every member at a time (each in its
    # own order); the device augments per_chunk steps of a protocol group in one call.
    keys = [item_keys(seed, epoch, order) for seed, order in zip(seeds, orders)]
    total = len(orders[0]) // batch_size
    buffer: list[list] = [[] for _ in orders]
    for step_number, (step_keys, images, labels) in enumerate(source.loader(orders, keys, batch_size), 1):
        if source.gpu_decode:
            decoded = decode_on_device(images, source.device)
            images = torch.stack([_train_crop(image, key, source.spec) for image, key in zip(decoded, step_keys)])
        images = images.to(source.device, non_blocking=True)
        labels = labels.to(source.device, non_blocking=True)
        for k, rows in enumerate(range(0, len(orders) * batch_size, batch_size)):
            buffer[k].append((step_keys[rows:rows + batch_size], images[rows:rows + batch_size],
                              labels[rows:rows + batch_size]))
        if len(buffer[0]) == per_chunk or step_number == total:
            count = len(buffer[0])
            chunk: list = [None] * len(orders)
            for spec, members in groups.items():
                chunk_keys = np.concatenate([k for m in members for k, _, _ in buffer[m]])
                images = apply(spec, torch.cat([i for m in members for _, i, _ in buffer[m]]), draw(spec, chunk_keys))
                for m, part in zip(members, images.split(count * batch_size)):
                    chunk[m] = (part.split(batch_size), [y for _, _, y in buffer[m]])
            for step in range(count):
                yield [(images[step], labels[step]) for images, labels in chunk]
            buffer = [[] for _ in orders]


def _train_crop(image: torch.Tensor, key, spec: Augmentation) -> torch.Tensor:
    """The per-image stage at native size: the random resized crop (from LARGE_IMAGE_SIZE) or
    the resize + centre crop that smaller folder sets get when stored (ImageFiles' own rule)."""
    if not spec.resized_crop:
        return resize_center_crop(image, spec.img_size)
    h, w = image.shape[-2:]
    box = resized_crop_params(np.array([key], dtype=np.uint64), np.array([h]), np.array([w]))[0]
    return resized_crop(image, box, spec.img_size)


class _WorkerFiles(Dataset):
    """Worker side of a folder-backed split: read, decode and crop one image from its key; with no
    ``spec`` (GPU decoding) the file's bytes only."""

    def __init__(self, split: ImageFiles, spec: Augmentation | None):
        self.samples, self.spec = split.samples, spec

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, int]):
        index, key = item
        path, label = self.samples[index]
        if self.spec is None:
            return key, torchvision.io.read_file(path), label
        return key, _train_crop(decode(path), key, self.spec), label


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
    and moved to the device. Returns the images in input order.

    On CUDA the device is synchronised before and after the GPU decode: torchvision's nvjpeg path
    writes from a stream of its own that the caller's stream does not wait for, nor it for the
    caller's (a known, unmerged upstream report of corrupted images). Before: its output may be
    memory the caching allocator freed from tensors that kernels queued on the caller's stream still
    read. After: without it the augmentation kernels could read half-written pixels. Two host syncs
    per decoded step, which is why the run config's `gpu_decode` is off by default (bench/gpu_suite.py
    compares GPU-decoded pixels with CPU-decoded ones)."""
    device = torch.device(device)
    rgb = torchvision.io.ImageReadMode.RGB
    out: list[torch.Tensor | None] = [None] * len(encoded)
    jpeg = [i for i, data in enumerate(encoded) if len(data) > 2 and int(data[0]) == 0xFF and int(data[1]) == 0xD8]
    if jpeg and device.type == "cuda":
        torch.cuda.synchronize(device)  # nothing queued still reads memory the decoder may be given (see above)
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
    if jpeg and device.type == "cuda":
        torch.cuda.synchronize(device)  # the decoder's own stream has finished writing (see above)
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
            for rows in to_device(order, self.device).split(batch_size):
                yield eval_view(self.images[rows], self.img_size), self.labels[rows]
            return
        loader = DataLoader(self.split, batch_size=batch_size, sampler=order.tolist(), num_workers=self.num_workers,
                            pin_memory=self.device.type == "cuda")
        for images, labels in loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


class EpochEval:
    """What the loop scores after each epoch: a fixed class-stratified subset of ``images`` images of
    ``split`` (``capped_subset``, seeded: the same images every epoch and in every trial) after every
    epoch but the last, the whole split after the last, so a run's final score is on the whole split
    while its per-epoch curve costs a fraction of it. ``images`` 0 (or >= the split): the whole split
    every epoch."""

    def __init__(self, split: Dataset, images: int, img_size: int, *, device: torch.device | str,
                 num_workers: int = -1):
        self.whole = EvalSource(split, img_size, device=device, num_workers=num_workers)
        self.subset = self.whole
        if 0 < images < len(split):
            rows = capped_subset(split.labels, images)
            self.subset = EvalSource(split.subset(rows, evaluation=True), img_size, device=device,
                                     num_workers=num_workers)

    def source(self, epoch: int, epochs: int) -> EvalSource:
        return self.whole if epoch == epochs else self.subset
