"""The device half of the training step on fake CUDA tensors (tests/fake_cuda.py): device mistakes
fail on the CPU, and a steady-state step makes no blocking host-to-device copy and reads no device
value, for every protocol at K = 1 and K = 8, under CUDA autocast (bf16 logits). The whole step of
the real `train_pack` (forward, backward, optimiser, scheduler) reads no device value either
(`DeviceAudit` on CPU tensors: backward needs a real CUDA context)."""

from __future__ import annotations

import pytest
import torch
from fake_cuda import STRONG_AT, DeviceAudit, fake_cuda, member_configs, run_device_half
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           FakeTensorDeviceMismatchError)
from torch.utils._python_dispatch import TorchDispatchMode

from trainables.data.augment import StepDraws, step_batch
from trainables.data.protocols import PROTOCOLS
from trainables.loop import train
from trainables.config.run_config import RunConfig

# vmap's "no batching rule" performance warning for ops of the fake device; never autocast's "CUDA is
# not available": the harness turns CUDA autocast on.
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

STUDY_L = [name for name in PROTOCOLS if name != "modern"]  # the eight switch combinations


def test_the_harness_sees_device_mistakes_and_counts_syncs():
    with fake_cuda() as syncs:
        x = torch.ones(4, device="cuda")
        with pytest.raises(FakeTensorDeviceMismatchError):
            x + torch.ones(4)  # a CPU tensor mixed in: CUDA refuses, so does the harness
        torch.tensor([1.0, 2.0], device="cuda")  # from pageable host memory: a blocking copy
        torch.ones(3).to("cuda", non_blocking=True)  # non_blocking from pageable memory still blocks
        torch.ones(3).pin_memory().to("cuda", non_blocking=True)  # the one copy that does not
        assert syncs.blocking_copies == 2 and syncs.device_reads == 0, syncs.events
        float(x.sum())
        x[:1].tolist()  # (one read per element on fake tensors; one copy on CUDA)
        with pytest.raises(DynamicOutputShapeException):  # counted, then the size is unknowable
            x[x > 0]  # boolean-mask indexing: nonzero, a sync
        x[x > 0] = 0.0  # masked_fill_: no sync
        assert syncs.device_reads == 3, syncs.events
    with fake_cuda(strict=True), pytest.raises((AssertionError, DataDependentOutputException)):
        torch.ones(2, device="cuda").sum().item()


def _assert_no_syncs(result: dict) -> None:
    assert result["steps"] >= 2
    assert result["logits_dtypes"] == {torch.bfloat16}, result["logits_dtypes"]  # CUDA autocast was on
    assert result["step_copies"] == 0 and result["step_reads"] == 0, result["events"]
    (copies_2, reads_2), (copies_4, reads_4) = result["eval"]
    # Evaluation reads its sums once at the end: the count does not grow with the batches.
    assert copies_2 == copies_4 == 0 and reads_2 == reads_4, result["eval"]


@pytest.mark.parametrize("protocol", STUDY_L)
def test_a_lone_trial_step_never_syncs(protocol):
    with fake_cuda() as syncs:
        _assert_no_syncs(run_device_half(member_configs([protocol]), syncs))


@pytest.mark.parametrize("strong", ["color_jitter", "autoaugment_imagenet"])
def test_the_other_strong_augmentations_never_sync(strong):
    dataset, size = STRONG_AT[strong]
    with fake_cuda() as syncs:
        result = run_device_half(member_configs(["autoaugment+cutmix"], dataset=dataset, img_size=size), syncs,
                                 dataset=dataset, img_size=size)
    _assert_no_syncs(result)


@pytest.mark.parametrize("protocols", [STUDY_L, ["modern"] * 8], ids=["eight protocols", "one protocol"])
def test_a_pack_of_eight_step_never_syncs(protocols):
    with fake_cuda() as syncs:
        _assert_no_syncs(run_device_half(member_configs(protocols, rpt_per_image=True), syncs))


def test_cuda_autocast_is_on_under_fake_cuda():
    with fake_cuda():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.is_autocast_enabled("cuda")
            out = torch.ones(4, 4, device="cuda") @ torch.ones(4, 4, device="cuda")
        assert out.dtype == torch.bfloat16


def test_the_audit_counts_reads_of_device_tensors_only():
    audit = DeviceAudit()
    weights, host = torch.ones(3), torch.ones(3)
    audit.mark(weights)
    with audit:
        made = torch.zeros(2, device="cpu")  # an explicit device: where the GPU run puts it
        float(host.sum())  # a host draw's read: no sync
        float((weights * 2).sum())
        made[0].item()
        weights[weights > 0]
    assert len(audit.reads) == 3, audit.reads  # 2 x .item(), the boolean mask


def _audited_train_pack(tmp_path, monkeypatch, cfgs, extra_read: bool = False) -> tuple[int, list[str]]:
    """The real `train_pack` on the CPU, every step after the first of each epoch (its caches and the
    optimiser's state built) under `DeviceAudit`: the loop body from a batch's arrival to the next's
    request (pack_step: forward, backward, AdamW; scheduler.step; the device-side sums)."""
    audit = DeviceAudit()
    real_epoch, real_step = train.pack_epoch, train.pack_step
    counted = []

    def audited_epoch(*args, **kwargs):
        for step, batches in enumerate(real_epoch(*args, **kwargs)):
            if step == 0:
                yield batches
                continue
            audit.mark(batches)
            counted.append(step)
            with audit:
                yield batches

    def registering(pack, optimizer, *args, **kwargs):
        audit.mark_pack(pack, optimizer)
        losses, correct = real_step(pack, optimizer, *args, **kwargs)
        if extra_read:
            float(losses.sum())
        return losses, correct

    monkeypatch.setattr(train, "pack_epoch", audited_epoch)
    monkeypatch.setattr(train, "pack_step", registering)
    train.train_pack(cfgs, [tmp_path / c.trial_id for c in cfgs], log=lambda line: None)
    return len(counted), audit.reads


@pytest.mark.parametrize("k", [1, 2])
def test_a_steady_step_of_the_real_train_pack_reads_no_device_tensor(k, tmp_path, monkeypatch):
    base = {"epochs": 2, "warmup_epochs": 1, "batch_size": 16, "max_train_images": 64, "lr": 1e-3}
    protocols = ["autoaugment+cutmix", "baseline"]
    cfgs = [RunConfig.for_dataset("shapes", preset="tiny", seed=seed, protocol=protocols[seed], rpt=seed == 1,
                                  pe="rope2d_mixed", **base) for seed in range(k)]
    steps, reads = _audited_train_pack(tmp_path / "a", monkeypatch, cfgs)
    assert steps >= 4 and reads == [], reads
    # The audit would see one: a read of the losses added to the step is counted once per step.
    steps, reads = _audited_train_pack(tmp_path / "b", monkeypatch, cfgs, extra_read=True)
    assert len(reads) == steps and all("_local_scalar_dense" in r for r in reads), reads


class _Copies(TorchDispatchMode):
    """Host-to-device copies, blocking or not (`SyncCounter` counts the blocking ones)."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.copies += func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu" and \
            kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda"
        return func(*args, **kwargs)


def test_a_packs_step_batch_copies_once_and_launches_alike_for_any_k():
    """Per member, the step used to copy its CutMix partners and its RPT permutation and run its own
    CutMix and normalisation; batched, every member's host numbers travel in one pinned copy, and the
    kernels do not grow with K (0.5 s)."""
    counts = {}
    g = torch.Generator().manual_seed(0)
    for k in (2, 8):
        draws = [StepDraws(*((4, 20, 2, 30), torch.randperm(16, generator=g)) if m % 2 else (None, None),
                           torch.randperm(64, generator=g) if m % 3 else None) for m in range(k)]
        with fake_cuda() as syncs, _Copies() as h2d:
            batches = [(torch.zeros(16, 3, 32, 32, dtype=torch.uint8, device="cuda"),
                        torch.zeros(16, dtype=torch.long, device="cuda")) for _ in range(k)]
            step_batch(batches, draws, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3)  # constants built
            syncs.reset()
            h2d.copies = 0
            x, target, perms = step_batch(batches, draws, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3)
            assert x.is_cuda and target.shape == (k, 16, 10) and perms.shape == (k, 16, 64) and perms.is_cuda
            assert syncs.blocking_copies == syncs.device_reads == 0, syncs.events
            counts[k] = (h2d.copies, syncs.device_ops)
    assert counts[2] == counts[8] and counts[8][0] == 1, counts
