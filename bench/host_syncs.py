"""Host syncs and launches per training step, counted on the CPU: before and after the hot-path work.

    PYTHONPATH=. python3 bench/host_syncs.py                 # this checkout, beside the recorded baseline
    PYTHONPATH=/path/to/old/checkout python3 bench/host_syncs.py --no-baseline   # measure another checkout
    PYTHONPATH=. python3 bench/host_syncs.py --cuda          # on a GPU: the real step's syncs, counted by CUDA

Per step of a CIFAR-10 pack (32 px, batch 128 per member, chunks of 1,024 images per member), for
crop + flip and AutoAugment + CutMix at K = 1, 4 and 8 (every member the same protocol, RPT on):

* blocking host-to-device copies and device reads: the device half of the step on fake CUDA tensors
  (tests/fake_cuda.py: FakeTensorMode + a dispatch mode that counts them), steady state (after
  the first chunk); `study_l` model;
* device ops: the aten ops of that step that compute on CUDA, views and device queries (`prim.device`)
  excluded: a launch proxy;
* profiler ops: `torch.profiler` op count of the real step on the CPU (augmentation, CutMix,
  normalisation, RPT, forward, loss, backward, AdamW), `tiny` model (the count, not the time,
  is the point: the CPU pays little per op, a GPU a launch).

`--cuda` counts on a real GPU what the fake device predicts: the whole step (`train.pack_step`:
forward, backward, AdamW) of the same cases, run for real under `torch.cuda.set_sync_debug_mode("warn")`
(a warning per synchronising call), per steady-state step (after one chunk of warm-up), with the
logits' dtype; `--tiny` runs it at a tiny size, on the CPU where there is no CUDA (no count: CUDA's
sync debug mode is the counter). It needs no baseline: the prediction is 0.

BASELINE holds the same script's counts on the code before this work (commit 6637a4a), measured
with --no-baseline and PYTHONPATH pointing at that checkout; the script runs against either API
(per-member `TrainSource.epoch` and `pack_step`, or `pack_epoch` and `step_inputs` + `member_losses`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fake_cuda import fake_cuda, member_configs  # noqa: E402

from trainables.data import inputs, protocols  # noqa: E402
from trainables.data.augment import augmentation  # noqa: E402
from trainables.data.images import TensorImages, to_device  # noqa: E402
from trainables.loop import train
from trainables.model.packed import PackedViT  # noqa: E402

CASES = [("crop+flip", "baseline"), ("autoaugment", "autoaugment+cutmix")]
PACKS = (1, 4, 8)
BATCH, CHUNK, IMAGES = 128, 1024, 4096

# Measured on commit 6637a4a (before: torchvision's affine / rotate / sharpness per group, eps per
# step, one augmentation call per member): per step, {case: {K: (copies, reads, device ops, profiler ops)}}.
# Device ops re-measured 2026-12-06 by this script (bf16 autocast on fake CUDA, device queries out).
BASELINE = {
    "crop+flip": {1: (0.0, 0.0, 354.0, 1819.8), 4: (1.0, 0.0, 515.0, 2675.3), 8: (1.0, 0.0, 587.0, 3104.0)},
    "autoaugment": {1: (5.0, 0.0, 441.5, 2249.5), 4: (21.8, 0.0, 869.5, 4391.1), 8: (42.5, 0.0, 1297.9, 6533.5)},
}


def _step_losses(pack, cfgs, batches, *, num_classes, mean, std, mix_gens, perm_gens, use_amp):
    """The device half up to the loss: `train.step_inputs` and `train.member_losses` where they exist,
    else the first half of the older `pack_step`, written out (the same calls)."""
    if hasattr(train, "member_losses"):
        x, target, perms = train.step_inputs(cfgs, batches, num_classes=num_classes, mean=mean, std=std,
                                             mix_gens=mix_gens, perm_gens=perm_gens)
        return train.member_losses(pack, x, target, perms, use_amp=use_amp)
    xs, targets, perms = [], [], []
    for cfg, (images, labels), mix_gen, perm_gen in zip(cfgs, batches, mix_gens, perm_gens):
        images, target = train.mix_batch(cfg, images, labels, num_classes, mix_gen)
        xs.append(protocols.normalize(images, mean, std))
        targets.append(target)
        perms.append(to_device(train.random_permutation(labels.numel(), cfg.model.num_patches,
                                                        per_image=cfg.rpt_per_image, generator=perm_gen),
                               images.device) if cfg.rpt else None)
    target, x = torch.stack(targets), torch.stack(xs)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=use_amp):
        logits = pack(x, perms)
    return pack.losses(logits, target), (logits.argmax(-1) == target.argmax(-1)).sum(-1)


def _steps(sources, cfgs, epoch: int = 1, batch: int = BATCH, chunk: int = CHUNK):
    if hasattr(inputs, "pack_epoch"):
        return inputs.pack_epoch(sources, [c.seed for c in cfgs], epoch=epoch, batch_size=batch, chunk_images=chunk)
    return zip(*[s.epoch(seed=c.seed, epoch=epoch, batch_size=batch, chunk_images=chunk)
                 for s, c in zip(sources, cfgs)])


def _clear_old_caches() -> None:
    stats = getattr(protocols, "_pixel_stats", None)
    if hasattr(stats, "cache_clear"):  # the older checkout's per-device lru_cache
        stats.cache_clear()


def _setup(protocol: str, k: int, preset: str, device: str, batch: int = BATCH, images: int = IMAGES):
    cfgs = member_configs([protocol] * k, batch_size=batch, preset=preset, rpt=True)
    g = torch.Generator().manual_seed(0)
    split = TensorImages(torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8, generator=g),
                         torch.randint(0, 10, (images,), generator=g))
    base = inputs.TrainSource(split, augmentation(cfgs[0].protocol, "cifar10", 32), device=device)
    sources = [base.with_spec(augmentation(c.protocol, "cifar10", 32)) for c in cfgs]
    mix = [torch.Generator().manual_seed(c.seed * 7 + 2) for c in cfgs]
    perm = [torch.Generator().manual_seed(c.seed * 7 + 3) for c in cfgs]
    return cfgs, sources, _pack(cfgs, device), mix, perm


def _pack(cfgs, device: str) -> PackedViT:
    try:
        return PackedViT(cfgs, device).train()
    except RuntimeError:  # the older PackedViT made its meta copy from device tensors (fake ones refuse)
        pack = PackedViT(cfgs, "cpu")
        pack.device = torch.device(device)
        pack.params = {n: p.detach().to(device).requires_grad_() for n, p in pack.params.items()}
        pack.buffers = {n: b.to(device) for n, b in pack.buffers.items()}
        return pack.train()


def fake_counts(protocol: str, k: int) -> tuple[float, float, float]:
    """(blocking copies, device reads, device ops) per steady-state step on fake CUDA, study_l."""
    _clear_old_caches()
    per_chunk = CHUNK // BATCH
    with fake_cuda() as syncs:
        cfgs, sources, pack, mix, perm = _setup(protocol, k, "study_l", "cuda")
        steps = 0
        for step, batches in enumerate(_steps(sources, cfgs)):
            if step == per_chunk:
                syncs.reset()
            if step >= 2 * per_chunk:
                break
            _step_losses(pack, cfgs, batches, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3, mix_gens=mix,
                         perm_gens=perm, use_amp=True)
            steps += step >= per_chunk
        result = (syncs.blocking_copies / steps, syncs.device_reads / steps, syncs.device_ops / steps)
    _clear_old_caches()
    return result


def profiler_ops(protocol: str, k: int) -> float:
    """torch.profiler op count per step of the real step on the CPU (tiny model), over one chunk."""
    cfgs, sources, pack, mix, perm = _setup(protocol, k, "tiny", "cpu")
    # train's name for it in every checkout: an older one lacks trainables.loop.optim, which the editable
    # install would then import from this checkout (another optimiser: 650 more ops per step at 6637a4a)
    optimizer = pack.optimizer(train.build_optimizer, cfgs[0])
    batches_iter = iter(_steps(sources, cfgs))
    per_chunk = CHUNK // BATCH
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(per_chunk):
            train.pack_step(pack, optimizer, cfgs, next(batches_iter), num_classes=10, mean=(0.5,) * 3,
                            std=(0.25,) * 3, mix_gens=mix, perm_gens=perm, use_amp=False)
    ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    return ops / per_chunk


def device_counts(protocol: str, k: int, device: torch.device, *, tiny: bool) -> dict:
    """The real step on `device`, steady state: host syncs per step (CUDA's sync debug mode; None
    elsewhere) and the logits' dtype."""
    batch, chunk, images, preset = (16, 32, 128, "tiny") if tiny else (BATCH, CHUNK, IMAGES, "study_l")
    cuda = device.type == "cuda"
    cfgs, sources, pack, mix, perm = _setup(protocol, k, preset, str(device), batch, images)
    optimizer = pack.optimizer(train.build_optimizer, cfgs[0])
    forward, dtypes = pack.forward, []

    def recording(*a, **kw):  # the dtype only: keeping the logits would keep their graphs
        logits = forward(*a, **kw)
        dtypes.append(logits.dtype)
        return logits

    pack.forward = recording
    steps, per_chunk = iter(_steps(sources, cfgs, batch=batch, chunk=chunk)), chunk // batch

    def step():
        train.pack_step(pack, optimizer, cfgs, next(steps), num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3,
                        mix_gens=mix, perm_gens=perm, use_amp=cuda)

    for _ in range(per_chunk):  # the first chunk builds the caches (grids, constants, pinned buffers)
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(per_chunk):
                step()
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    return {"syncs_per_step": len(syncs) / per_chunk if cuda else None, "steps": per_chunk,
            "sync_sites": sorted({m[:120] for m in syncs})[:5], "logits_dtype": str(dtypes[-1]).replace("torch.", "")}


def main_device(tiny: bool) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (no CUDA: syncs not counted)"
    print(f"host syncs per steady-state step, the real step on {name} (32 px, batch {16 if tiny else BATCH} per "
          f"member{', tiny' if tiny else ''}); predicted on fake CUDA: 0")
    print(f"{'case':12s} {'K':>2s}  {'syncs/step':>10s}  {'logits':>8s}  sites")
    results = {}
    # tiny: the plain module (K = 1) and a stacked pack, one case each: every code path, in seconds
    # not K = 4: the lent GPU's first command (bench/device_check.sh) is sized for these four
    runs = list(zip(CASES, (1, 2))) if tiny else [(case, k) for case in CASES for k in (1, 8)]
    for (case, protocol), k in runs:
        row = device_counts(protocol, k, device, tiny=tiny)
        results.setdefault(case, {})[k] = row
        syncs = "-" if row["syncs_per_step"] is None else f"{row['syncs_per_step']:.2f}"
        print(f"{case:12s} {k:2d}  {syncs:>10s}  {row['logits_dtype']:>8s}  {'; '.join(row['sync_sites'])}",
              flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-baseline", action="store_true", help="print this checkout's counts only")
    parser.add_argument("--cuda", action="store_true", help="count the real step's syncs on the GPU instead")
    parser.add_argument("--tiny", action="store_true", help="with --cuda: tiny sizes (the CPU dry run)")
    args = parser.parse_args(argv)
    if args.cuda:
        return main_device(args.tiny)
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    results = {}
    for case, protocol in CASES:
        for k in PACKS:
            copies, reads, device_ops = fake_counts(protocol, k)
            results.setdefault(case, {})[k] = (copies, reads, device_ops, profiler_ops(protocol, k))
    header = (f"{'case':12s} {'K':>2s}  {'blocking copies':>17s}  {'device reads':>13s}  {'device ops':>17s}  "
              f"{'profiler ops':>19s}")
    print("per training step (32 px, batch 128 per member):")
    print(header if not args.no_baseline else header.replace("  ", " "))
    for case, rows in results.items():
        for k, now in rows.items():
            if args.no_baseline:
                print(f"{case:12s} {k:2d}  " + "  ".join(f"{v:8.2f}" for v in now))
                continue
            before = BASELINE[case][k]
            cells = [f"{b:6.1f} -> {n:6.1f}" + (f" ({n / b:4.2f}x)" if b else "        ")
                     for b, n in zip(before, now)]
            print(f"{case:12s} {k:2d}  " + "  ".join(cells))
    if not args.no_baseline:
        print("before -> after (after / before); before: BASELINE, commit 6637a4a")
    return results


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
