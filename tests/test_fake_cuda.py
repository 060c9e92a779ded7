"""The device half of the training step on fake CUDA tensors (tests/fake_cuda.py): device mistakes
fail on the CPU, and a steady-state step makes no blocking host-to-device copy and reads no device
value, for every protocol at K = 1 and K = 8."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorDeviceMismatchError,
)

from fake_cuda import STRONG_AT, fake_cuda, member_configs, run_device_half
from trainables.protocols import PROTOCOLS

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # "CUDA is not available" for autocast("cuda")

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
