"""Fake CUDA on a CPU-only build: run the device half of a training step on tensors that claim
device "cuda", and count what would stall the host on a real GPU.

    with fake_cuda() as syncs:              # torch.device("cuda") works inside, no GPU needed
        ...build sources, model on "cuda"; warm up...
        syncs.reset()
        ...steady-state steps...
    assert syncs.blocking_copies == syncs.device_reads == 0, syncs.events

Two modes, stacked:

* `FakeTensorMode` (torch._subclasses.fake_tensor) computes shapes, dtypes and devices only:
  an op mixing a CPU tensor into CUDA ones raises FakeTensorDeviceMismatchError, as CUDA would;
* `SyncCounter`, a TorchDispatchMode over it, sees every op first. Ops that touch no fake
  tensor and create nothing on CUDA (host draws: generators, numpy-backed index arrays) run
  for real, so the host half of the step keeps its values. It counts

  - blocking host-to-device copies: `_to_copy` / `copy_` from a CPU tensor to CUDA that is
    not both `non_blocking` and from pinned memory (a pageable copy waits for the device),
    which includes `torch.tensor(data, device="cuda")` (lift_fresh + a blocking copy);
  - device reads: `.item()` / `float()` / `bool()` (`_local_scalar_dense`), device-to-host
    copies (`.cpu()`, `.tolist()`), and ops whose output size depends on device values
    (nonzero, boolean-mask indexing, unique, ...): each waits for the device.

  A read returns a dummy value (0, or zeros from a copy) so a count can be taken on code
  that still syncs; `strict=True` raises instead. Ops with data-dependent output sizes are
  counted, then fail (DynamicOutputShapeException: the fake mode cannot know their size).

The CPU build has no pinned memory: `pin_memory()` is stubbed (the tensor itself, marked
pinned). CUDA autocast is on: `torch.autocast("cuda")` disables itself when it finds no CUDA,
so inside the mode it is told CUDA (with bf16) is there, and the step runs in bf16 as on a GPU.
Backward needs a CUDA context (hasPrimaryContext), so fake-CUDA steps stop at the loss; the whole
step (backward, optimiser, scheduler) is audited on CPU tensors by `DeviceAudit` instead.
Cached device constants (`images.device_constant`) are cleared on entry and exit, so no fake
tensor outlives the mode.

`DeviceAudit`, a TorchDispatchMode for real CPU tensors, knows which of them would live on the
GPU: those it is told about (`mark`: parameters, optimiser state, the batches), those a factory
makes without a generator (a generator's draws are the host's), and every output of an op with
such an input. A host read of
one (`.item()`, `float()`, data-dependent sizes, boolean-mask indexing) is counted; reads of host
tensors (CutMix and RPT draws, a foreach optimiser's step counters, which PyTorch keeps on the
host) are not, nor the range checks that a few CPU kernels make on the host where CUDA's do not
(`HOST_CHECKS_ON_CPU_ONLY`). (`.tolist()` of a CPU tensor reads memory without dispatching: `SyncCounter` on
fake CUDA sees it, this audit does not.)
"""

from __future__ import annotations

import contextlib
import weakref
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

# Ops whose output size (or value on the host) depends on device data: each waits for the device.
_DATA_DEPENDENT = {
    aten.nonzero.default, aten.nonzero_static.default, aten.masked_select.default, aten._unique2.default,
    aten.unique_dim.default, aten.unique_consecutive.default, aten.bincount.default, aten.equal.default,
    aten.is_nonzero.default, aten.repeat_interleave.Tensor,
}


def _is_cuda(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cuda"


def _target(kwargs) -> torch.device | None:
    device = kwargs.get("device")
    return None if device is None else torch.device(device)


class SyncCounter(TorchDispatchMode):
    """Counts blocking host-to-device copies and device reads (see the module docstring);
    `ops`: every op dispatched; `device_ops`: the aten ops that compute on CUDA (no views, no
    metadata queries such as prim.device): a proxy for kernel launches."""

    def __init__(self, strict: bool = False):
        super().__init__()
        self.strict = strict
        self.blocking_copies = self.device_reads = self.ops = self.device_ops = 0
        self.events: list[str] = []
        self._pinned = weakref.WeakValueDictionary()  # id -> tensor (tensors compare by value, not identity)

    def reset(self) -> None:
        self.blocking_copies = self.device_reads = self.ops = self.device_ops = 0
        self.events = []

    def _copy_event(self, what: str, src: torch.Tensor, non_blocking: bool) -> None:
        pinned = self._pinned.get(id(src)) is src
        if non_blocking and pinned:
            return
        self.blocking_copies += 1
        self.events.append(f"blocking copy: {what} {tuple(src.shape)} "
                           f"({'non_blocking=False' if pinned else 'pageable'})")

    def _read(self, what: str):
        self.device_reads += 1
        self.events.append(f"device read: {what}")
        if self.strict:
            raise AssertionError(f"a host read of a device tensor: {what}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        on_cuda = any(_is_cuda(t) for t in tensors)
        target = _target(kwargs)
        self.ops += 1
        self.device_ops += (on_cuda or (target is not None and target.type == "cuda")) and not func.is_view and \
            func.namespace == "aten"  # not prim.device: a query of a tensor's device, no kernel
        if func is aten._pin_memory.default:
            self._pinned[id(args[0])] = args[0]
            return args[0]
        if func is aten.is_pinned.default:
            return self._pinned.get(id(args[0])) is args[0]
        # -- host-to-device copies
        if func is aten._to_copy.default and not _is_cuda(args[0]) and target is not None and target.type == "cuda":
            self._copy_event("to(cuda)", args[0], bool(kwargs.get("non_blocking", False)))
        if func is aten.copy_.default and _is_cuda(args[0]) and not _is_cuda(args[1]) and args[1].dim() > 0:
            self._copy_event("copy_ into cuda", args[1], bool(args[2] if len(args) > 2 else kwargs.get("non_blocking")))
        # -- device reads
        if func is aten._local_scalar_dense.default and on_cuda:
            self._read(f"item() of {tuple(args[0].shape)}")
            return False if args[0].dtype == torch.bool else 0
        if func is aten._to_copy.default and _is_cuda(args[0]) and target is not None and target.type == "cpu":
            self._read(f"to(cpu) of {tuple(args[0].shape)}")
            with unset_fake_temporarily():
                return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        if func is aten.copy_.default and not _is_cuda(args[0]) and _is_cuda(args[1]):
            self._read(f"copy_ to cpu of {tuple(args[1].shape)}")
            return args[0]
        if func in _DATA_DEPENDENT and on_cuda:
            self._read(str(func))
        if func in (aten.index.Tensor, aten.index_put_.default, aten._index_put_impl_.default) and on_cuda:
            indices = args[1]
            masks = [i for i in indices if i is not None and i.dtype in (torch.bool, torch.uint8)]
            # x[mask] = scalar runs as masked_fill_ (no sync); any other boolean index calls nonzero.
            fill = func is not aten.index.Tensor and len(indices) == 1 and args[2].numel() == 1 and \
                not _is_cuda(args[2]) and not (len(args) > 3 and args[3])
            if masks and not fill:
                self._read(f"{func} with a boolean mask")
        if not on_cuda and not any(isinstance(t, FakeTensor) for t in tensors) and \
                (target is None or target.type != "cuda"):
            with unset_fake_temporarily():  # host work: real values
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def clear_device_constants() -> None:
    from trainables.data import images

    # Every cached device constant (`images.device_constant`) goes; a checkout from before the
    # registry has none (bench/host_syncs.py measures such a baseline).
    getattr(images, "_DEVICE_CONSTANTS", {}).clear()


@contextlib.contextmanager
def fake_cuda(strict: bool = False):
    """FakeTensorMode + SyncCounter, CUDA autocast on; yields the counter. See the module docstring."""
    clear_device_constants()
    counter = SyncCounter(strict=strict)
    try:
        with mock.patch.object(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False), \
                mock.patch.object(torch.cuda, "is_bf16_supported", lambda *a, **kw: True), \
                FakeTensorMode(allow_non_fake_inputs=True), counter:
            yield counter
    finally:
        clear_device_constants()


# Functions whose CPU kernel reads its input on the host to check it and whose CUDA kernel does not
# (one_hot with num_classes: CUDA relies on a device assert in its scatter).
HOST_CHECKS_ON_CPU_ONLY = {torch.nn.functional.one_hot}


class _CpuOnlyChecks(TorchFunctionMode):
    """Runs `HOST_CHECKS_ON_CPU_ONLY` with the audit off; their outputs are device tensors when an input is."""

    def __init__(self, audit: DeviceAudit):
        super().__init__()
        self.audit = audit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in HOST_CHECKS_ON_CPU_ONLY:
            return func(*args, **kwargs)
        with _disable_current_modes():
            out = func(*args, **kwargs)
        if any(self.audit.on_device(t) for t in tree_flatten((args, kwargs))[0]):
            self.audit.mark(out)
        return out


class DeviceAudit(TorchDispatchMode):
    """Host reads of would-be device tensors, on real CPU tensors (see the module docstring).
    `reads`: one line per read; `ops`: ops seen while on."""

    def __init__(self):
        super().__init__()
        self._device: dict[int, weakref.ref] = {}  # id -> tensor (tensors compare by value, not identity)
        self.reads: list[str] = []
        self.ops = 0

    def __enter__(self):
        self._checks = _CpuOnlyChecks(self)
        self._checks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._checks.__exit__(*exc)

    def mark(self, *tensors) -> None:
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                self._device[id(t)] = weakref.ref(t)

    def mark_pack(self, pack, optimizer) -> None:
        """The pack's parameters and buffers, and the optimiser's state: moments always, `step` where
        the optimiser keeps it with the parameters (fused or capturable; foreach keeps it on the host)."""
        module = pack.module
        self.mark(list(pack.params.values()), list(pack.buffers.values()),
                  [] if module is None else [*module.parameters(), *module.buffers()])
        for group in optimizer.param_groups:
            on_device = group.get("fused") or group.get("capturable")
            for p in group["params"]:
                self.mark([v for key, v in optimizer.state.get(p, {}).items() if key != "step" or on_device])

    def on_device(self, t) -> bool:
        ref = self._device.get(id(t)) if isinstance(t, torch.Tensor) else None
        return ref is not None and ref() is t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        device = any(self.on_device(t) for t in tree_flatten((args, kwargs))[0])
        if device and (func is aten._local_scalar_dense.default or func in _DATA_DEPENDENT):
            self.reads.append(f"{func} of {tuple(args[0].shape)}")
        if device and func is aten.index.Tensor and any(
                i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            self.reads.append(f"{func} with a boolean mask")
        out = func(*args, **kwargs)
        # A factory is a device tensor unless it draws from a generator: the step's host draws (CutMix,
        # RPT) use CPU generators. (The dispatcher fills in `device` whether the caller passed it or not.)
        made = not any(isinstance(t, torch.Tensor) for t in tree_flatten(args)[0]) and \
            kwargs.get("device") is not None and kwargs.get("generator") is None
        if device or made:
            self.mark(out)
        return out


# -- the device half of the training step, on fake CUDA ------------------------------------------

# What a protocol's step does on the device, per strong augmentation: (data set name, image side).
STRONG_AT = {"autoaugment_cifar10": ("cifar10", 32), "color_jitter": ("tinyimagenet", 64),
             "autoaugment_imagenet": ("imagenet100", 128)}


def member_configs(protocols, *, dataset: str = "cifar10", img_size: int = 32, batch_size: int = 16,
                   rpt_per_image: bool = False, preset: str = "tiny", rpt: bool | None = None):
    """RunConfigs, one per protocol name (seeds 0, 1, ...); RPT on every other member (rpt=None) or all/none."""
    from trainables.config.architecture import ViTConfig
    from trainables.config.run_config import RunConfig
    from trainables.config.switches import Protocol

    model = ViTConfig.preset(preset, img_size=img_size, patch_size=img_size // 8, num_classes=10)
    cfgs = []
    for seed, name in enumerate(protocols):
        p = Protocol.from_name(name)
        cfgs.append(RunConfig(dataset=dataset, preset=preset, model=model, batch_size=batch_size, seed=seed,
                              autoaugment=p.autoaugment, cutmix=p.cutmix, label_smoothing=p.label_smoothing,
                              rpt=seed % 2 == 1 if rpt is None else rpt, rpt_per_image=rpt_per_image,
                              device="cuda"))
    return cfgs


def _step_losses(pack, cfgs, batches, *, use_amp, **draws):
    """The device half of `train.pack_step` up to the loss: its inputs, then the losses. Nothing here
    reads a device value."""
    from trainables.loop import train

    x, target, perms = train.step_inputs(cfgs, batches, **draws)
    return train.member_losses(pack, x, target, perms, use_amp=use_amp)


def run_device_half(cfgs, counter: SyncCounter, *, dataset: str = "cifar10", img_size: int = 32,
                    images: int = 96, chunk_images: int = 32, warmup_chunks: int = 1, step_losses=None,
                    stream=None) -> dict:
    """The loop's device half for a pack of `cfgs` on "cuda" (inside `fake_cuda()`): one epoch of
    `pack_epoch` input (batched augmentation per protocol group), then per step CutMix,
    normalisation, RPT, the forward (packed for K > 1, the plain module for K = 1) and the loss;
    then the evaluation pass. The counter is reset after `warmup_chunks` chunks (caches built),
    so it holds the steady state's counts. Returns {"steps", "step_ops", "logits", "eval"}."""
    import numpy as np

    from trainables.data.augment import augmentation
    from trainables.data.images import TensorImages
    from trainables.data.inputs import EvalSource, TrainSource, pack_epoch
    from trainables.loop import train
    from trainables.model.packed import PackedViT

    step_losses = step_losses or _step_losses
    g = torch.Generator().manual_seed(0)
    with unset_fake_temporarily():  # the host data, real
        split = TensorImages(torch.randint(0, 256, (images, 3, img_size, img_size), dtype=torch.uint8, generator=g),
                             torch.randint(0, 10, (images,), generator=g))
    device = torch.device("cuda")
    base = TrainSource(split, augmentation(cfgs[0].protocol, dataset, img_size), device=device)
    sources = [base.with_spec(augmentation(c.protocol, dataset, img_size)) for c in cfgs]
    pack = PackedViT(cfgs, device).train()
    batch = cfgs[0].batch_size
    mix_gens = [torch.Generator().manual_seed(train.epoch_seed(c.seed, 1, 2)) for c in cfgs]
    perm_gens = [torch.Generator().manual_seed(train.epoch_seed(c.seed, 1, 3)) for c in cfgs]
    steps = stream(sources, cfgs, batch, chunk_images) if stream else \
        pack_epoch(sources, [c.seed for c in cfgs], epoch=1, batch_size=batch, chunk_images=chunk_images)
    warmup_steps = warmup_chunks * max(1, chunk_images // batch)
    counted = 0
    dtypes = []
    forward = pack.forward

    def recording(*args, **kwargs):  # the logits' dtype only: keeping them would keep their graphs
        logits = forward(*args, **kwargs)
        dtypes.append(logits.dtype)
        return logits

    pack.forward = recording
    for step, batches in enumerate(steps):
        if step == warmup_steps:
            counter.reset()
        losses, correct = step_losses(pack, cfgs, batches, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3,
                                      mix_gens=mix_gens, perm_gens=perm_gens, use_amp=True)
        assert losses.shape == (len(cfgs),) and losses.device.type == "cuda" and correct.shape == (len(cfgs),)
        counted += step >= warmup_steps
    pack.forward = forward
    result = {"steps": counted, "step_ops": counter.ops / max(counted, 1), "logits_dtypes": set(dtypes),
              "step_copies": counter.blocking_copies, "step_reads": counter.device_reads,
              "events": list(counter.events)}
    # Evaluation: its reads must not grow with the number of batches (one read of the sums at the end).
    eval_source = EvalSource(split, img_size, device=device)
    reads = []
    for batches in (2, 4):
        counter.reset()
        train.evaluate_pack(pack, list(eval_source.batches(images // 4))[:batches], (0.5,) * 3, (0.25,) * 3,
                             device, use_amp=True)
        reads.append((counter.blocking_copies, counter.device_reads))
    result["eval"] = reads
    np.asarray(0)  # numpy stays importable inside the mode
    return result
