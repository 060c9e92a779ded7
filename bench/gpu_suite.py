"""GPU suite: the training loop's device work on one GPU, as one table that cannot lose its numbers.

    PYTHONPATH=. python3 bench/gpu_suite.py            # on a CUDA machine: full size, < 5.5 minutes
    PYTHONPATH=. python3 bench/gpu_suite.py --keep     # ... and copy the table to bench/measured/gpu_suite.json
    PYTHONPATH=. python3 bench/gpu_suite.py --tiny     # anywhere (CPU): every section at a tiny size

Needs torch, torchvision, numpy only (no Ray, no MLflow: the GPU machine's Python has neither).
Each section runs in its own try/except and the JSON is rewritten after every section, so a
failure (or the machine's time running out) loses that section only; each packing row has its own
too. The estimated time of every section is printed before the first starts; they add up to less
than the default `--deadline-s` (330 s: a 15-minute GPU slot keeps time to start the machine and
run the suite again), and a section that would end past the deadline is skipped with that reason.
In order:

* packing (first: `--dry-run` GPU-hours read it): training images/s of K `study_l` models packed
  in one process, K = 1, 4, 8, 16, 32, through the loop's real input path (`pack_epoch`:
  batched augmentation per protocol group, crop + flip and AutoAugment + CutMix + RPT) and its
  real step (`pack_step`, bf16), with the per-epoch evaluation pass priced in (CIFAR: 10,000
  test images per 50,000 training images per member), and GPU memory per member; a failing row
  is recorded as failed, the others are measured and estimated from;
* probe: 10 real training steps (K = 1 and 8) under torch.cuda.set_sync_debug_mode("warn"):
  host syncs per step after the first, the logits' dtype, and which attention kernel ran (from
  the SDPA op the dispatcher chose: `aten::_scaled_dot_product_{flash,efficient,cudnn}_attention`,
  else SDPA's math fallback or the pack's explicit softmax);
* separate: the same step as N one-model processes sharing the GPU (N = 4, 8), started behind
  a barrier and timed over one fixed window; a failed child, or one that stays silent past the
  barrier's or the window's deadline, is killed and reported as a failure;
* augment: `augment.draw` + `augment.apply` images/s per protocol on chunks already on the device;
* decode: nvjpeg `decode_jpeg(list, device=...)` images/s, GPU-decoded pixels against
  CPU-decoded ones, and the antialiased random resized crop on the device against the CPU;
* step: GPU memory of one Study L trial (data copy, step peak), the eager K = 1 step images/s;
* deterministic: the eager step under `torch.use_deterministic_algorithms(True)` with
  CUBLAS_WORKSPACE_CONFIG=:4096:8 (a fresh process: it must be set before CUDA starts);
* compile (last): eager against compiled at K = 1 (`torch.compile`d with CUDA graphs) and K = 8 (the pack's vmapped
  forward compiled; `trainables.model.compiled`, as `compile=True` trains them), and the eager pack of 8 without the
  Linear fold, images/s and peak memory per row, the eager rows first; in a child process killed at its own bound
  (`--compile-bound-s`, never past the deadline), each row written into the table as it comes, so a kill loses none it
  finished; skipped, with the reason, when there is no CUDA, no Triton or no C compiler.

Writes $OUT/gpu_suite.json when OUT is set (else bench/out/gpu_suite.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

from trainables.data.augment import (CHUNK_IMAGES, Augmentation, apply, augmentation, draw, item_keys, resized_crop,
                                     resized_crop_params)
from trainables.data.images import TensorImages
from trainables.data.inputs import EvalSource, TrainSource, decode_on_device, pack_epoch
from trainables.loop.optim import build_optimizer
from trainables.loop.train import epoch_seed, evaluate_pack, pack_step
from trainables.model.packed import PackedViT, fused_attention_under_vmap
from trainables.config.architecture import ViTConfig
from trainables.config.run_config import RunConfig
from trainables.config.switches import Protocol

ROOT = Path(__file__).resolve().parents[1]
KEEP_PATH = ROOT / "bench" / "measured" / "gpu_suite.json"
AUGMENTATIONS = [  # (name, image side, strong augmentation)
    ("crop+flip 32px", 32, None),
    ("autoaugment cifar10 32px", 32, "autoaugment_cifar10"),
    ("color_jitter 64px", 64, "color_jitter"),
    ("flip+autoaugment imagenet 224px", 224, "autoaugment_imagenet"),
]
PROTOCOL_GROUPS = {"crop+flip": "baseline", "autoaugment+cutmix": "autoaugment+cutmix"}
MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
CIFAR_TRAIN, CIFAR_TEST = 50_000, 10_000


class Skipped(Exception):
    """A section that cannot run here: the reason is recorded, not an error."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(fn, items: int, device: torch.device, budget_s: float, min_reps: int = 2) -> float:
    """items/s of fn() after one warm-up call, repeated until budget_s has passed (at least min_reps)."""
    fn()
    _sync(device)
    reps, start = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < budget_s:
        fn()
        reps += 1
    _sync(device)
    return reps * items / (time.perf_counter() - start)


class Size:
    """Every size the suite uses, full (H200) or tiny (CPU)."""

    def __init__(self, tiny: bool, section_s: float | None):
        self.tiny = tiny
        self.section_s = section_s if section_s is not None else (0.2 if tiny else 3.0)
        self.preset, self.batch = ("tiny", 16) if tiny else ("study_l", 128)
        self.packs = [1, 2] if tiny else [1, 4, 8, 16, 32]
        self.probe_packs = [1, 2] if tiny else [1, 8]
        self.separate = [2] if tiny else [4, 8]
        self.images = 512 if tiny else CIFAR_TRAIN
        self.eval_images = 64 if tiny else 2048  # timed; priced at CIFAR_TEST per epoch
        self.chunk = 64 if tiny else CHUNK_IMAGES
        self.steps, self.warmup = (2, 1) if tiny else (20, 3)
        self.window_s = 1.0 if tiny else 6.0  # separate processes' common timing window
        self.ready_s = 120.0 if tiny else 45.0  # a child's set-up and warm-up, before the barrier gives up


def _configs(protocol: str, k: int, size: Size) -> list[RunConfig]:
    """K members of the Study L recipe at 32 px (seeds 0..K-1), `protocol`, RPT on."""
    p = Protocol.from_name(protocol)
    model = ViTConfig.preset(size.preset, img_size=32, patch_size=4, num_classes=10)
    return [RunConfig(dataset="cifar10", preset=size.preset, model=model, batch_size=size.batch, epochs=1,
                      warmup_epochs=0, seed=seed, autoaugment=p.autoaugment, cutmix=p.cutmix,
                      label_smoothing=p.label_smoothing, rpt=True) for seed in range(k)]


def _split(n: int, device: torch.device) -> TensorImages:
    g = torch.Generator().manual_seed(0)
    return TensorImages(torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g),
                        torch.randint(0, 10, (n,), generator=g))


class Loop:
    """The training loop's step for a pack of `cfgs`: `pack_epoch` input, `pack_step`, endless."""

    def __init__(self, cfgs: list[RunConfig], split: TensorImages, device: torch.device, size: Size, *,
                 amp: bool, base: TrainSource | None = None):
        self.cfgs, self.device, self.size, self.amp = cfgs, device, size, amp
        base = base or TrainSource(split, augmentation(cfgs[0].protocol, "cifar10", 32), device=device)
        self.base = base
        self.sources = [base.with_spec(augmentation(c.protocol, "cifar10", 32)) for c in cfgs]
        self.pack = PackedViT(cfgs, device)
        self.optimizer = self.pack.optimizer(build_optimizer, cfgs[0])
        self.pack.train()
        self.epoch, self.steps = 0, iter(())
        self.logits_dtype = None

    def _new_epoch(self) -> None:
        self.epoch += 1
        self.mix = [torch.Generator().manual_seed(epoch_seed(c.seed, self.epoch, 2)) for c in self.cfgs]
        self.perm = [torch.Generator().manual_seed(epoch_seed(c.seed, self.epoch, 3)) for c in self.cfgs]
        self.steps = pack_epoch(self.sources, [c.seed for c in self.cfgs], epoch=self.epoch,
                                batch_size=self.size.batch, chunk_images=self.size.chunk)

    def step(self) -> None:
        batches = next(self.steps, None)
        if batches is None:
            self._new_epoch()
            batches = next(self.steps)
        pack_step(self.pack, self.optimizer, self.cfgs, batches, num_classes=10, mean=MEAN, std=STD,
                  mix_gens=self.mix, perm_gens=self.perm, use_amp=self.amp)

    def images_per_step(self) -> int:
        return len(self.cfgs) * self.size.batch


def _timed(fn, steps: int, device: torch.device, max_s: float) -> tuple[float, int]:
    _sync(device)
    start, done = time.perf_counter(), 0
    while done < steps and (done == 0 or time.perf_counter() - start < max_s):
        fn()
        done += 1
    _sync(device)
    return time.perf_counter() - start, done


# -- sections ----------------------------------------------------------------------------------


def section_packing(device, size: Size, results: dict) -> dict:
    """Per protocol group and K: training, evaluation and per-epoch (both) images/s, MiB per member.
    The estimate table (`results["packing"]`) takes the slower protocol group per K."""
    cuda = device.type == "cuda"
    split = _split(size.images, device)
    eval_source = EvalSource(_split(size.eval_images, device), 32, device=device)
    base = TrainSource(split, Augmentation(32), device=device)  # one device copy for every row
    rows: dict = {}
    for group, protocol in PROTOCOL_GROUPS.items():
        for k in size.packs:
            try:  # one row's failure (out of memory at K = 32, a kernel) loses that row only
                rows[f"{group} K={k}"] = _packing_row(protocol, k, split, eval_source, base, device, size)
            except Exception as exc:  # noqa: BLE001 - recorded, and the next row runs
                rows[f"{group} K={k}"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"  packing {group} K={k} failed: {type(exc).__name__}: {exc}", flush=True)
            finally:
                if cuda:
                    torch.cuda.empty_cache()
    estimate = {}
    for k in size.packs:
        measured = [rows[f"{g} K={k}"] for g in PROTOCOL_GROUPS if "images_per_s" in rows[f"{g} K={k}"]]
        if len(measured) == len(PROTOCOL_GROUPS):  # the slower protocol group, so both groups measured
            slower = min(measured, key=lambda r: r["images_per_s"])
            estimate[f"K={k}"] = {key: slower[key] for key in ("images_per_s", "mib_per_member") if key in slower}
    results["packing"] = {size.preset: estimate}
    failed = sorted(name for name, row in rows.items() if "error" in row)
    if failed:
        rows["failed rows"] = failed
    if not estimate:
        raise RuntimeError(f"every packing row failed: {failed}")
    best = max(estimate, key=lambda name: estimate[name]["images_per_s"])
    rows["best K"] = best
    if "K=1" in estimate:
        rows["best K / K=1"] = estimate[best]["images_per_s"] / estimate["K=1"]["images_per_s"]
    return rows


def _packing_row(protocol: str, k: int, split, eval_source, base, device, size: Size) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    loop = Loop(_configs(protocol, k, size), split, device, size, amp=cuda, base=base)
    _timed(loop.step, size.warmup, device, size.section_s)
    seconds, done = _timed(loop.step, size.steps, device, size.section_s)
    train_rate = done * loop.images_per_step() / seconds
    eval_s = time.perf_counter()
    evaluate_pack(loop.pack, eval_source.batches(max(256, size.batch)), MEAN, STD, device, use_amp=cuda)
    eval_rate = size.eval_images / (time.perf_counter() - eval_s)  # images through all K members
    # One epoch per member: 50,000 training images, then 10,000 test images through the pack.
    epoch_s = k * CIFAR_TRAIN / train_rate + CIFAR_TEST / eval_rate
    row = {"images_per_s": k * CIFAR_TRAIN / epoch_s, "train_images_per_s": train_rate,
           "eval_images_per_s": eval_rate, "steps_timed": done}
    if cuda:
        row["mib_per_member"] = (torch.cuda.max_memory_allocated(device) - before) / k / 2**20
    return row


# The SDPA ops that name the kernel the dispatcher chose, in the profile's op names (CPU rows, which
# CUDA profiles have too). Only these decide: a kernel's name would mislead (cuDNN's SDPA kernels say
# "flash" too), and so would "cudnn" anywhere (the patch embedding's Conv2d runs
# aten::cudnn_convolution on CUDA whatever attention ran). The backward ops share the prefixes.
SDPA_OPS = (("aten::_scaled_dot_product_cudnn_attention", "fused: cuDNN"),
            ("aten::_scaled_dot_product_flash_attention", "fused: flash"),  # _for_cpu on the CPU
            ("aten::_scaled_dot_product_efficient_attention", "fused: memory-efficient"))
SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"


def attention_label(op_names) -> str:
    """Which attention ran, from the profiler's op names: the fused SDPA kernel the dispatcher chose,
    else SDPA's math fallback, else the pack's explicit softmax path (no SDPA call at all)."""
    names = set(op_names)
    for prefix, label in SDPA_OPS:
        if any(name.startswith(prefix) for name in names):
            return label
    if any(name.startswith(SDPA_MATH_OP) for name in names):
        return "math (SDPA's unfused fallback)"
    return "explicit softmax" if any("softmax" in name for name in names) else "unknown"


def _attention_kernel(loop: Loop, device: torch.device) -> str:
    """Which attention ran in one step, from the profiler's op names (`attention_label`)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loop.step()
        _sync(device)
    return attention_label(e.key for e in prof.key_averages())


def section_probe(device, size: Size, results: dict) -> dict:
    """10 real steps per K under set_sync_debug_mode("warn"): syncs per step after the first."""
    cuda = device.type == "cuda"
    split = _split(max(size.images // 4, 10 * size.batch), device)
    out = {}
    for k in size.probe_packs:
        loop = Loop(_configs("autoaugment+cutmix", k, size), split, device, size, amp=cuda)
        forward = loop.pack.forward
        dtypes = []

        def recording(*a, forward=forward, dtypes=dtypes, **kw):
            # the logits' dtype only: keeping them would keep their graphs
            logits = forward(*a, **kw)
            dtypes.append(logits.dtype)
            return logits

        loop.pack.forward = recording
        loop.step()  # the first step builds the caches (grids, constants, pinned buffers)
        _sync(device)
        row = {"attention": _attention_kernel(loop, device),
               "attention_selected": "fused" if k == 1 or fused_attention_under_vmap(device) else "explicit"}
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(9):
                    loop.step()
                _sync(device)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
        syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
        row["syncs_per_step"] = len(syncs) / 9 if cuda else None
        row["sync_sites"] = sorted({str(w.message)[:120] for w in syncs})[:5]
        if not cuda:
            row["syncs_note"] = "set_sync_debug_mode needs CUDA; on the CPU tests/test_fake_cuda.py counts them"
        row["logits_dtype"] = str(dtypes[-1]).replace("torch.", "")
        out[f"K={k}"] = row
        del loop
    return out


def section_separate(device, size: Size, results: dict, args) -> dict:
    """N one-model processes: each sets up and warms up, then all start one timing window together."""
    out = {}
    for n in size.separate:
        cmd = [sys.executable, __file__, "--only-alone", "--window-s", str(size.window_s)]
        cmd += ["--tiny"] if size.tiny else []
        logs = [tempfile.TemporaryFile(mode="w+") for _ in range(n)]  # a pipe could fill and stall a child
        procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                  env={**os.environ, "OUT": ""}) for log in logs]
        failures, rates = [], []
        try:
            ready = [bool(line) for line in wait_for_lines(procs, "READY", time.monotonic() + size.ready_s)]
            if sum(ready) < n:  # a silent child holds no barrier: it is killed, the others go on
                failures.append(f"{n - sum(ready)} of {n} children never got ready within {size.ready_s:.0f} s")
            start_at = time.time() + 0.5  # one wall-clock start for all
            for proc, ok in zip(procs, ready):
                if ok:
                    proc.stdin.write(f"GO {start_at}\n")
                    proc.stdin.flush()
                else:
                    proc.kill()
            done = wait_for_lines(procs, "ALONE ", time.monotonic() + 0.5 + size.window_s + 30)
            for i, (proc, line) in enumerate(zip(procs, done)):
                if not ready[i]:
                    continue
                if not line:
                    proc.kill()
                    proc.wait()
                    logs[i].seek(0)
                    failures.append(f"child {i} reported no rate within its window (exit {proc.returncode}): "
                                    f"{logs[i].read().strip()[-300:]}")
                else:
                    rates.append(float(line.split()[1]))
        finally:
            for proc, log in zip(procs, logs):
                if proc.poll() is None:
                    proc.kill()
                log.close()
        out[f"{n} separate processes"] = {"images_per_s": sum(rates) if not failures else None,
                                          "children_ok": len(rates), "window_s": size.window_s,
                                          **({"failures": failures} if failures else {})}
    return out


def wait_for_lines(procs: list[subprocess.Popen], prefix: str, deadline: float) -> list[str]:
    """Per child, its first stdout line starting with `prefix`, or "" when it exits or stays silent
    until `deadline` (time.monotonic()): no read blocks past it."""
    found = [""] * len(procs)
    waiting = {proc.stdout.fileno(): i for i, proc in enumerate(procs)}
    while waiting and time.monotonic() < deadline:
        readable, _, _ = select.select(list(waiting), [], [], max(0.0, deadline - time.monotonic()))
        for fd in readable:
            i = waiting[fd]
            line = procs[i].stdout.readline()  # a child writes whole lines, flushed
            if line.startswith(prefix):
                found[i] = line
            if line.startswith(prefix) or not line:  # found, or end of file (the child exited)
                del waiting[fd]
    return found


def run_alone(device, size: Size, window_s: float) -> None:
    """A child of section_separate: set up, warm up, report READY, wait for GO, time the window."""
    loop = Loop(_configs("autoaugment+cutmix", 1, size), _split(size.images // 2, device), device, size,
                amp=device.type == "cuda")
    _timed(loop.step, size.warmup + 1, device, 60)
    print("READY", flush=True)
    start_at = float(sys.stdin.readline().split()[1])
    while time.time() < start_at:
        time.sleep(0.001)
    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < window_s:
        loop.step()
        done += 1
    _sync(device)
    print(f"ALONE {done * loop.images_per_step() / (time.perf_counter() - start)}", flush=True)


def section_augment(device, size: Size, results: dict) -> dict:
    """What the loop does per chunk: draw on the host, apply to rows of a split held on the device."""
    out = {}
    for name, side, strong in AUGMENTATIONS:
        if size.tiny:  # the same code paths at small sizes (128 px keeps the resized-crop path)
            side = 128 if strong == "autoaugment_imagenet" else min(side, 64)
        spec = Augmentation(side, strong)
        for images_per_call in (size.chunk, 4 * size.chunk) if side <= 64 else (size.chunk,):
            split = torch.randint(0, 256, (2 * images_per_call, 3, side, side), dtype=torch.uint8, device=device)
            rng = np.random.default_rng(0)
            counter = iter(range(10**9))

            def run(rng=rng, split=split, images_per_call=images_per_call, spec=spec, counter=counter):
                # fresh rows and draws every call (host side included), as in training
                rows = rng.choice(len(split), images_per_call, replace=False)
                apply(spec, split, draw(spec, item_keys(0, next(counter), rows)), rows=rows)

            label = name if images_per_call == size.chunk else f"{name} (chunk {images_per_call})"
            out[label] = {"images_per_s": _rate(run, images_per_call, device, size.section_s),
                          "chunk": images_per_call, "img_size": side}
    return out


def section_decode(device, size: Size, results: dict) -> dict:
    """nvjpeg images/s; GPU-decoded pixels against CPU-decoded ones; the resized crop on the device."""
    import torchvision.io

    n, side = (8, 160) if size.tiny else (256, 400)
    g = torch.Generator().manual_seed(0)
    raw = [torch.randint(0, 256, (3, side, side + 40), dtype=torch.uint8, generator=g) for _ in range(n)]
    encoded = [torchvision.io.encode_jpeg(image, quality=90) for image in raw]
    out = {"files": n, "image": f"{side}x{side + 40}"}
    out["decode_images_per_s"] = _rate(lambda: decode_on_device(encoded, device), n, device, size.section_s)
    decoded_cpu = [torchvision.io.decode_jpeg(e) for e in encoded]
    decoded_dev = decode_on_device(encoded, device)
    diffs = [(d.cpu().int() - c.int()).abs() for d, c in zip(decoded_dev, decoded_cpu)]
    out["decoded_max_level_diff_vs_cpu"] = int(max(int(d.max()) for d in diffs))
    out["decoded_share_of_pixels_differing"] = float(sum(int((d > 0).sum()) for d in diffs) /
                                                     sum(d.numel() for d in diffs))
    keys = item_keys(0, 1, np.arange(n))
    boxes = resized_crop_params(keys, np.full(n, side), np.full(n, side + 40))
    crop = 128 if size.tiny else 224
    crop_diffs = [(resized_crop(image.to(device), box, crop).cpu().int() - resized_crop(image, box, crop).int())
                  .abs().max() for image, box in zip(decoded_cpu, boxes)]
    out["resized_crop_max_level_diff_vs_cpu"] = int(max(crop_diffs))
    return out


def section_step(device, size: Size, results: dict, deterministic: bool = False) -> dict:
    """GPU memory of one Study L trial and its eager step, K = 1 (the loop's own step)."""
    cuda = device.type == "cuda"
    out = {}
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    split = _split(size.images, device)
    source = TrainSource(split, Augmentation(32, "autoaugment_cifar10"), device=device)
    if cuda:
        out["data_copy_mib"] = (torch.cuda.memory_allocated(device) - base) / 2**20
    loop = Loop(_configs("autoaugment+cutmix", 1, size), split, device, size, amp=cuda, base=source)
    _timed(loop.step, size.warmup, device, size.section_s)
    if cuda:
        out["step_peak_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    name = "eager_deterministic" if deterministic else "eager"
    out[f"{name}_step_images_per_s"] = _rate(loop.step, loop.images_per_step(), device, size.section_s,
                                             min_reps=3)
    return out


def section_deterministic(device, size: Size, results: dict, args) -> dict:
    if device.type != "cuda":
        raise Skipped("CUDA only (CUBLAS_WORKSPACE_CONFIG concerns cuBLAS)")
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OUT": ""}
    cmd = [sys.executable, __file__, "--only-deterministic", "--section-s", str(size.section_s)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    line = [text for text in done.stdout.splitlines() if text.startswith("DETERMINISTIC ")]
    if done.returncode != 0 or not line:
        raise RuntimeError(f"the deterministic child failed (exit {done.returncode}): {done.stderr[-500:]}")
    return json.loads(line[-1].split(" ", 1)[1])


def section_compile(device, size: Size, results: dict, args) -> dict:
    """Eager against compiled, K = 1 and K = 8, images/s and peak memory, as the loop trains them. The
    rows run in a child process bounded in time (`child_rows`): two cold inductor compiles may take
    minutes, and a compile cannot be interrupted from its own process; the rows it finished are kept."""
    if device.type != "cuda":
        raise Skipped("the loop compiles on CUDA only (compiling measured slower on CPU)")
    from torch.utils._triton import has_triton

    if not has_triton():
        raise Skipped("Triton is not installed: torch.compile's CUDA backend needs it")
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        raise Skipped("no C compiler (cc, gcc, clang) on PATH: Triton needs one")
    bound_s = max(10.0, min(args.compile_bound_s, args.ends_at - time.monotonic()))
    cmd = [sys.executable, __file__, "--only-compile", "--section-s", str(size.section_s)]

    def written(rows):  # each row into the table as it comes: a suite killed from outside keeps it
        results["sections"]["compile"] = {**rows, "running": True}
        _write(results, args.json_path)

    out, stopped = child_rows(cmd, "COMPILE_ROW ", bound_s, env={**os.environ, "OUT": ""}, on_row=written)
    out["bound_s"] = bound_s
    if stopped:  # recorded with the rows it finished (a missing compiled row says which compile hung)
        out["stopped"] = stopped
    return out


def compile_rows(device, size: Size) -> None:
    """The child of section_compile: the eager rows first (they cannot hang), then the compiled ones
    (`trainables.model.compiled`, as compile=True trains a lone trial and a pack), each printed as a
    COMPILE_ROW line when done. "eager K=8 unfolded" is the pack without `trainables.model.folded` (the fold
    adds eager kernels: on a card whose launches cost more than ~15 us it may be a loss there)."""
    from trainables.model.compiled import compile_forward

    def compiling(mode):
        return lambda pack: compile_forward(pack, mode=mode)

    rows = [("eager K=1", 1, None, False), ("eager K=8", 8, None, False), ("eager K=8 unfolded", 8, None, True),
            ("compiled K=1", 1, compiling("reduce-overhead"), False), ("compiled K=8", 8, compiling(None), False)]
    for name, k, compile_pack, unfolded in rows:
        try:
            with _unfolded() if unfolded else contextlib.nullcontext():
                row = _compile_row(device, size, k, compile_pack)
        except Exception as exc:  # noqa: BLE001 - recorded; the next row runs
            row = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print("COMPILE_ROW " + json.dumps({"name": name, **row}, default=str), flush=True)
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _unfolded():
    """Packs built here keep their Linear biases and LayerNorms unfolded (bench/step_model.py's "before")."""
    from trainables.model import folded

    fold = folded.fold_linears
    folded.fold_linears = lambda base: []
    try:
        yield
    finally:
        folded.fold_linears = fold


def _compile_row(device, size: Size, k: int, compile_pack) -> dict:
    """One row: the step's images/s after 3 warm-up steps (the compile, when `compile_pack` is given),
    and the row's peak GPU memory (its data copy, pack, optimiser state and step) above what was allocated
    before it."""
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    loop = Loop(_configs("autoaugment+cutmix", k, size), _split(size.images, device), device, size, amp=True)
    lines = []
    loop.pack.fast_paths.log = lines.append
    if compile_pack is not None:
        compile_pack(loop.pack)
    start = time.perf_counter()
    _timed(loop.step, 3, device, 600)
    row = {"warmup_s": time.perf_counter() - start, "fell_back": lines,
           "images_per_s": _rate(loop.step, loop.images_per_step(), device, size.section_s, min_reps=3),
           "peak_mib": (torch.cuda.max_memory_allocated(device) - base) / 2**20}
    return row


def child_rows(cmd: list[str], prefix: str, timeout_s: float, env: dict | None = None,
               on_row=None) -> tuple[dict, str | None]:
    """Run `cmd` in its own process group for at most `timeout_s`: every stdout line `prefix {json}` is a
    row named by its "name", handed to `on_row(rows so far)` as it comes. Returns (rows, None) or (the
    rows printed before it stopped, why it stopped): at the bound the whole group is killed (inductor's
    compile workers too)."""
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a chatty compile cannot block the child
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True)
        rows, buffer, stopped = {}, b"", None
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                stopped = f"killed at its bound of {timeout_s:.0f} s"
                break
            if not select.select([fd], [], [], min(left, 1.0))[0]:
                if proc.poll() is not None:  # exited, its output read (a compile worker may hold the pipe)
                    break
                continue  # the deadline is checked at the top
            chunk = os.read(fd, 65536)
            if not chunk:  # end of file: the child exited
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith(prefix):
                    row = json.loads(text[len(prefix):])
                    rows[row.pop("name")] = row
                    if on_row is not None:
                        on_row(dict(rows))
        with contextlib.suppress(ProcessLookupError):  # at the bound, or what the child left behind
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        if not stopped and proc.returncode != 0:
            stderr.seek(0)
            stopped = f"exit {proc.returncode}: {stderr.read().decode(errors='replace')[-500:]}"
    return rows, stopped


# (name, function, estimated seconds on an H200 at full size): packing first, compile last.
SECTIONS = [
    ("packing", section_packing, 80),
    ("probe", section_probe, 20),
    ("separate", section_separate, 40),
    ("augment", section_augment, 25),
    ("decode", section_decode, 12),
    ("step", section_step, 12),
    ("deterministic", section_deterministic, 25),
    ("compile", section_compile, 90),
]
DEADLINE_S = 330.0  # the estimates sum below it (304 s)
COMPILE_BOUND_S = 180.0  # the compile section's own bound: 3 eager rows (~40 s), then two cold compiles
NEEDS_ARGS = {"separate", "deterministic", "compile"}


def _write(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str))
    os.replace(tmp, path)


def _print_table(results: dict) -> None:
    print(f"gpu_suite on {results['device']} (torch {results['torch']}{', tiny' if results['tiny'] else ''}), "
          f"{results['wall_s']:.0f} s")
    print(f"{'section':13s} {'measure':52s} {'value':>16s}")
    for section, rows in results["sections"].items():
        for name, value in rows.items():
            if isinstance(value, dict) and isinstance(value.get("images_per_s"), (int, float)):
                value = f"{value['images_per_s']:,.0f} img/s"
            elif isinstance(value, dict):
                value = json.dumps(value, default=str)[:60]
            elif isinstance(value, float):
                value = f"{value:,.3f}"
            print(f"{section:13s} {name:52s} {value!s:>16s}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU mode CI runs); implied without CUDA")
    parser.add_argument("--section-s", type=float, default=None, help="seconds measured per row (default 3, tiny 0.2)")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help=f"skip sections whose estimate would end past this many seconds "
                             f"(default {DEADLINE_S:.0f})")
    parser.add_argument("--keep", nargs="?", const=str(KEEP_PATH), default=None, metavar="PATH",
                        help=f"copy the table to PATH (default {KEEP_PATH.relative_to(ROOT)}), what --dry-run reads")
    parser.add_argument("--only", default=None, help="comma-separated sections to run (default: all)")
    parser.add_argument("--fail-section", default=None, help=argparse.SUPPRESS)  # tests: a section that raises
    parser.add_argument("--window-s", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only-deterministic", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-alone", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile-bound-s", type=float, default=COMPILE_BOUND_S,
                        help=f"the compile section's time bound, its child killed there (default {COMPILE_BOUND_S:.0f}"
                             "; never past --deadline-s)")
    args = parser.parse_args(argv)
    args.ends_at = time.monotonic() + args.deadline_s
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.tiny = args.tiny or device.type != "cuda"
    size = Size(args.tiny, args.section_s)
    if args.keep and args.tiny and Path(args.keep).resolve() == KEEP_PATH.resolve():
        parser.error("a tiny (CPU) table is no GPU measurement: --keep it elsewhere (--keep PATH) or run on a GPU")
    if args.only_alone:
        return run_alone(device, size, args.window_s or size.window_s)
    if args.only_compile:
        return compile_rows(device, size)
    if args.only_deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)  # measure, even where an op has no such kernel
        result = section_step(device, size, {}, deterministic=True)
        print("DETERMINISTIC " + json.dumps(result))
        return result

    chosen = [s for s in SECTIONS if args.only is None or s[0] in args.only.split(",")]
    scale = 0.5 if args.tiny else 1.0  # the estimates are the H200's; tiny mode only prints them
    print("estimated time per section (H200, full size): " +
          ", ".join(f"{name} {est} s" for name, _, est in chosen) +
          f"; total {sum(est for _, _, est in chosen)} s (deadline {args.deadline_s:.0f} s)", flush=True)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "out"
    path = args.json_path = out_dir / "gpu_suite.json"
    t_start = time.perf_counter()
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "python": sys.version.split()[0], "tiny": args.tiny,
        "chunk_images": size.chunk, "measured_at": time.strftime("%Y-%m-%d", time.gmtime()),
        "sections": {}, "section_s": {}, "failed": [], "skipped": {},
    }
    for name, fn, estimate in chosen:
        elapsed = time.perf_counter() - t_start
        if not args.tiny and elapsed + estimate * scale > args.deadline_s:
            results["skipped"][name] = f"not started: {elapsed:.0f} s gone, estimate {estimate} s, deadline " \
                                       f"{args.deadline_s:.0f} s"
            results["sections"][name] = {"skipped": results["skipped"][name]}
            _write(results, path)
            continue
        print(f"[{elapsed:6.1f} s] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            if name == args.fail_section:
                raise RuntimeError(f"--fail-section {name}: a failure injected by the test")
            rows = fn(device, size, results, args) if name in NEEDS_ARGS else fn(device, size, results)
            results["sections"][name] = rows
        except Skipped as why:
            results["skipped"][name] = str(why)
            results["sections"][name] = {"skipped": str(why)}
        except Exception as exc:  # noqa: BLE001 - one section's failure must not lose the others
            results["failed"].append(name)
            results["sections"][name] = {"error": f"{type(exc).__name__}: {exc}",
                                         "traceback": traceback.format_exc()[-2000:]}
            print(f"  {name} failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            _sync_quietly(device)
        results["section_s"][name] = time.perf_counter() - t0
        results["wall_s"] = time.perf_counter() - t_start
        _write(results, path)  # after every section: a later failure or timeout loses nothing written
    results["wall_s"] = time.perf_counter() - t_start
    _write(results, path)
    _print_table(results)
    print(f"wrote {path}")
    if args.keep:
        Path(args.keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, args.keep)
        print(f"kept a copy at {args.keep}")
    return results


def _sync_quietly(device: torch.device) -> None:
    try:
        _sync(device)
    except Exception:  # noqa: BLE001 - a broken device shows in the next section's error
        pass


if __name__ == "__main__":
    main()
