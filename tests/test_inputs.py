"""Training input (trainables/data/inputs.py): epochs chunked on the device, folder streaming, GPU-decode fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.io
from reference import SeededSampler
from torch.utils.data import DataLoader

from trainables.data.augment import Augmentation
from trainables.data.images import ImageFiles, TensorImages, decode
from trainables.data.inputs import EvalSource, TrainSource, decode_on_device, default_workers
from trainables.data.shapes import make_shapes

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


@pytest.fixture(scope="module")
def split() -> TensorImages:
    images, labels = make_shapes(96, seed=0)
    return TensorImages(images, labels)


def _epoch(source, **kw):
    images, labels = zip(*source.epoch(**kw))
    return torch.cat(images), torch.cat(labels)


def test_epoch_does_not_depend_on_chunk_size_or_ranks_and_resumes(split):
    source = TrainSource(split, Augmentation(32, "autoaugment_cifar10"))
    whole, labels = _epoch(source, seed=3, epoch=2, batch_size=16)
    assert whole.shape == (96, 3, 32, 32) and whole.dtype == torch.uint8
    small, _ = _epoch(source, seed=3, epoch=2, batch_size=16, chunk_images=16)
    assert torch.equal(whole, small)
    # The order is SeededSampler's, and labels follow their images.
    sampler = SeededSampler(96, seed=3, drop_last=True)
    sampler.set_epoch(2)
    order = [i for i, _ in sampler]
    assert torch.equal(labels, split.labels[order])
    # A fresh source (a resumed run) draws the same; another epoch draws differently.
    again, _ = _epoch(TrainSource(split, Augmentation(32, "autoaugment_cifar10")), seed=3, epoch=2, batch_size=16)
    assert torch.equal(again, whole)
    assert not torch.equal(_epoch(source, seed=3, epoch=3, batch_size=16)[0], whole)
    # Under DDP each rank's image i is augmented exactly as in a single-process run.
    position = {index: k for k, index in enumerate(order)}
    for rank in (0, 1):
        images, _ = _epoch(source, seed=3, epoch=2, batch_size=8, num_replicas=2, rank=rank)
        sampler_r = SeededSampler(96, seed=3, num_replicas=2, rank=rank, drop_last=True)
        sampler_r.set_epoch(2)
        rank_order = [i for i, _ in sampler_r]
        assert torch.equal(images, whole[[position[i] for i in rank_order]])


def test_batch_takes_one_seed_per_image_for_packed_members(split):
    source = TrainSource(split, Augmentation(32, "autoaugment_cifar10"))
    index = np.arange(20)
    a, _ = source.batch(1, 4, index)
    b, _ = source.batch(2, 4, index)
    packed, labels = source.batch(np.repeat([1, 2], 20), 4, np.tile(index, 2))
    assert torch.equal(packed, torch.cat([a, b])) and torch.equal(labels, split.labels[np.tile(index, 2)])


def _jpeg_folder(tmp_path, images: torch.Tensor) -> list[tuple[str, int]]:
    samples = []
    for i, image in enumerate(images):
        path = tmp_path / f"{i:03d}.jpg"
        torchvision.io.write_jpeg(image, str(path), quality=90)
        samples.append((str(path), i % 3))
    return samples


def test_folder_backed_split_streams_what_memory_would_hold(tmp_path, split, monkeypatch):
    """Decode workers + batched augmentation on the device give what the in-memory path gives
    for the same decoded images (2 workers, chunks of 2 steps), alone or packed."""
    samples = _jpeg_folder(tmp_path, split.images[:40])
    files = ImageFiles(samples, 32, evaluation=False)
    memory = TensorImages(torch.stack([decode(p) for p, _ in samples]), files.labels)
    spec = Augmentation(32, "autoaugment_cifar10")
    streamed, labels = _epoch(TrainSource(files, spec, num_workers=2), seed=1, epoch=1, batch_size=8, chunk_images=16)
    held, held_labels = _epoch(TrainSource(memory, spec), seed=1, epoch=1, batch_size=8)
    assert torch.equal(streamed, held) and torch.equal(labels, held_labels)
    # The GPU-decode path (here with the CPU as its "device") reads bytes in workers, decodes in the loop.
    gpu_path, _ = _epoch(TrainSource(files, spec, num_workers=0, gpu_decode=True), seed=1, epoch=1, batch_size=8)
    assert torch.equal(gpu_path, held)
    # A pack streams each member's own order and draws, augmented per protocol group, through one set
    # of the trial's workers (2 here), not one per member.
    from trainables.data import inputs

    loaders = []
    monkeypatch.setattr(inputs, "DataLoader",
                        lambda *a, **kw: loaders.append(kw["num_workers"]) or DataLoader(*a, **kw))
    folder = TrainSource(files, spec, num_workers=2)
    members = [folder, folder.with_spec(Augmentation(32)), folder]
    steps = list(inputs.pack_epoch(members, [1, 2, 3], epoch=1, batch_size=8, chunk_images=16))
    assert loaders == [2]
    for k, seed in enumerate([1, 2, 3]):
        alone, _ = _epoch(TrainSource(memory, members[k].spec), seed=seed, epoch=1, batch_size=8)
        assert torch.equal(torch.cat([batches[k][0] for batches in steps]), alone), k


def test_gpu_decode_falls_back_to_the_cpu_for_files_nvjpeg_rejects(tmp_path, split):
    samples = _jpeg_folder(tmp_path, split.images[:4])
    encoded = [torchvision.io.read_file(p) for p, _ in samples]
    png = torchvision.io.encode_png(split.images[4])
    calls = []

    def fake_nvjpeg(datas, mode, device):  # rejects the batch that holds file 2, and file 2 alone
        calls.append(len(datas))
        if any(torch.equal(d, encoded[2]) for d in datas):
            raise RuntimeError("nvjpeg failed: unsupported JPEG (CMYK)")
        return [torchvision.io.decode_jpeg(d, mode=mode).to(device) for d in datas]

    out = decode_on_device([*encoded, png], "cpu", gpu_decoder=fake_nvjpeg)
    assert calls == [4, 1, 1, 1, 1]  # one batched call, then each JPEG alone; the PNG never goes to nvjpeg
    expected = [decode(p) for p, _ in samples] + [split.images[4]]
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def test_eval_source_keeps_order_and_pads_shards(split):
    source = EvalSource(split, 32, device="cpu")
    images, labels = zip(*source.batches(40))
    assert torch.equal(torch.cat(images), split.images) and torch.equal(torch.cat(labels), split.labels)
    shards = [torch.cat([y for _, y in source.batches(40, num_replicas=5, rank=r)]) for r in range(5)]
    assert all(len(s) == 20 for s in shards)  # 96 images padded to 100 by repetition


def test_default_workers_follow_the_cpus_the_trial_holds(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "6")  # what Ray sets in a worker holding 6 CPUs
    assert default_workers() == 5 and default_workers(2) == 2 and default_workers(0) == 0


def test_large_images_get_their_resized_crop_at_native_size_then_batched_flip_and_autoaugment(tmp_path):
    """From LARGE_IMAGE_SIZE: each file is decoded at its own size and cropped from its key in
    the worker; flip and AutoAugment (ImageNet policy) then run on the chunk from the same keys."""
    from trainables.data.augment import apply, draw, item_keys, resized_crop, resized_crop_params

    g = torch.Generator().manual_seed(0)
    raw = [torch.randint(0, 256, (3, 130 + 9 * i, 150 - 4 * i), dtype=torch.uint8, generator=g) for i in range(12)]
    samples = _jpeg_folder(tmp_path, raw)
    files = ImageFiles(samples, 128, evaluation=False)
    spec = Augmentation(128, "autoaugment_imagenet")
    streamed, _ = _epoch(TrainSource(files, spec, num_workers=1), seed=2, epoch=1, batch_size=4)
    sampler = SeededSampler(12, seed=2, drop_last=True)
    sampler.set_epoch(1)
    order = np.array([i for i, _ in sampler])
    keys = item_keys(2, 1, order)
    crops = []
    for index, key in zip(order, keys):
        image = decode(samples[index][0])
        box = resized_crop_params(np.array([key]), np.array([image.shape[1]]), np.array([image.shape[2]]))[0]
        crops.append(resized_crop(image, box, 128))
    assert torch.equal(streamed, apply(spec, torch.stack(crops), draw(spec, keys)))


def test_a_pack_is_augmented_in_one_call_per_protocol_group(split, monkeypatch):
    """Four members, two protocols: per chunk one `apply` per protocol, and each member gets
    exactly the batches it would get alone (its own order and draws)."""
    from trainables.data import inputs

    specs = [Augmentation(32, "autoaugment_cifar10"), Augmentation(32, None)]
    base = TrainSource(split, specs[0])
    sources = [base.with_spec(specs[k % 2]) for k in range(4)]
    seeds = [3, 4, 5, 6]
    calls = []
    real_apply = inputs.apply
    monkeypatch.setattr(inputs, "apply", lambda spec, images, params, rows=None: calls.append(
        (spec, len(params))) or real_apply(spec, images, params, rows))
    steps = list(inputs.pack_epoch(sources, seeds, epoch=2, batch_size=16, chunk_images=32))
    assert len(steps) == 96 // 16 and all(len(batches) == 4 for batches in steps)
    assert len(calls) == 2 * 3 and {n for _, n in calls} == {2 * 2 * 16}  # 3 chunks x 2 groups, 2 members each
    for k, (source, seed) in enumerate(zip(sources, seeds)):
        alone, alone_labels = _epoch(source, seed=seed, epoch=2, batch_size=16, chunk_images=32)
        packed = torch.cat([batches[k][0] for batches in steps])
        assert torch.equal(packed, alone) and torch.equal(torch.cat([b[k][1] for b in steps]), alone_labels)
    with pytest.raises(ValueError, match="one seed per source"):
        next(inputs.pack_epoch(sources, seeds[:2], epoch=1, batch_size=16))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_gpu_decoded_images_are_synchronised_before_use_and_cpu_decoding_is_the_default(tmp_path, split, monkeypatch):
    """nvjpeg writes from its own stream: decode_on_device waits for the device before the GPU decode
    (queued kernels may still read the memory it is given) and after it (before any CPU-fallback
    copy), on fake CUDA tensors; TrainSource decodes on the CPU unless the run config asks."""
    from fake_cuda import fake_cuda

    samples = _jpeg_folder(tmp_path, split.images[:3])
    encoded = [torchvision.io.read_file(p) for p, _ in samples]
    png = torchvision.io.encode_png(split.images[4])
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", str(device))))

    def fake_nvjpeg(datas, mode, device):
        events.append(("decode", len(datas)))
        return [torchvision.io.decode_jpeg(d, mode=mode).to(device) for d in datas]

    with fake_cuda():
        out = decode_on_device([*encoded, png], "cuda", gpu_decoder=fake_nvjpeg)
        assert all(image.device.type == "cuda" and image.shape == (3, 32, 32) for image in out)
    assert events == [("sync", "cuda"), ("decode", 3), ("sync", "cuda")]
    events.clear()
    decode_on_device(encoded, "cpu", gpu_decoder=fake_nvjpeg)
    assert events == [("decode", 3)]  # no wait off CUDA
    from trainables.loop.train import pack_inputs
    from trainables.config.run_config import RunConfig

    root = tmp_path / "root"  # 128 px: folder-backed (ImageFiles), like ImageNet-100
    for i, image in enumerate(torch.randint(0, 256, (4, 3, 128, 128), dtype=torch.uint8)):
        for split_dir in ("train", "test"):
            (root / split_dir / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            torchvision.io.write_jpeg(image, str(root / split_dir / f"c{i % 2}" / f"{i}.jpg"))
    cfgs = [RunConfig.for_dataset("folder", preset="study_l", data_root=str(root), holdout_fraction=0.0, **extra)
            for extra in ({}, {"gpu_decode": True})]
    sources = [pack_inputs([cfg], torch.device("cpu"))[1][0] for cfg in cfgs]  # the run config reaches the source
    assert [source.gpu_decode for source in sources] == [False, True]
    with pytest.raises(ValueError, match="gpu_decode decodes .* on CUDA, and device is 'cpu'"):
        RunConfig.for_dataset("folder", preset="study_l", data_root=str(root), gpu_decode=True, device="cpu")
