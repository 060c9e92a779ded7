"""What a checkpoint and a snapshot are, where they lie, and how they are read: the one place.

    <workdir>/checkpoint/state.pt          a trial's resumable checkpoint (the latest only)
    <workdir>/snapshots/epoch_0004.pt      model-only fp16 snapshots at log-spaced epochs
    <storage>/<study>/checkpoints/<trial>/state.pt   + epoch.json   (every trial, packed or alone)
    <storage>/<study>/snapshots/<trial>/epoch_0004.pt
    <storage>/<study>/train/<trial>/checkpoint_*/state.pt   lone trials of earlier versions (read only)

A checkpoint holds tensors, dicts, lists, tuples, numbers and strings only, all on the CPU: it is read
with ``torch.load(weights_only=True, map_location="cpu")``, so a file on shared storage cannot run code
in a worker or in ``vitsweep analyze``, and a checkpoint written on a GPU loads anywhere. Each part then
moves where it belongs: weights by ``load_state_dict`` into the model's device, optimiser state as
``Optimizer.load_state_dict`` places it (moments to the parameter's device, Adam's ``step`` stays a CPU
tensor), RNG states stay CPU ``ByteTensor``s (``torch.set_rng_state`` refuses anything else).
``epoch.json`` beside a stored checkpoint names its epoch, so the launcher re-forms packs without
downloading checkpoints.
"""

from __future__ import annotations

import os
import pickle
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from records import layout
from trainables.model.packed import PackedViT
from trainables.model.vit import ViT
from trainables.config.run_config import RunConfig

CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FILE = "state.pt"
EPOCH_FILE = "epoch.json"
SNAPSHOT_DIR = "snapshots"
_SNAPSHOT = re.compile(r"^epoch_(\d+)\.pt$")
_TRAIN_CHECKPOINT = re.compile(r"^checkpoint_[^/]*$")  # Ray Train's checkpoint_<timestamp> folders


class CorruptCheckpointError(ValueError):
    """A checkpoint file that cannot be read back: truncated, or not a checkpoint."""


# -- names and places ----------------------------------------------------------------------------------
def local_checkpoint(workdir: str | os.PathLike) -> Path:
    return Path(workdir) / CHECKPOINT_DIR / CHECKPOINT_FILE


def snapshot_name(epoch: int) -> str:
    return f"epoch_{epoch:04d}.pt"


def snapshot_epoch(path: str) -> int | None:
    """The epoch of a snapshot file (path or URI), None when it is not one."""
    m = _SNAPSHOT.match(path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def local_snapshots(workdir: str | os.PathLike) -> list[Path]:
    folder = Path(workdir) / SNAPSHOT_DIR
    return sorted(p for p in folder.iterdir() if snapshot_epoch(p.name) is not None) if folder.is_dir() else []


def checkpoint_file(folder: str) -> str:
    """The checkpoint file in a checkpoint folder (a trials row's ``checkpoint_path``, of any version)."""
    return f"{folder.rstrip('/')}/{CHECKPOINT_FILE}"


def epoch_file(folder: str) -> str:
    return f"{folder.rstrip('/')}/{EPOCH_FILE}"


def legacy_train_dir(storage: str, study: str, trial_id: str) -> str:
    """Where a lone trial of earlier versions kept its checkpoints: its Ray Train run's storage."""
    return f"{layout.train_storage(storage, study)}/{trial_id}"


def latest_train_checkpoint(dirs: list[str]) -> str | None:
    """The newest of Ray Train's ``checkpoint_<timestamp>`` folders among `dirs` (their names sort by
    time), or None."""
    found = sorted(d for d in dirs if _TRAIN_CHECKPOINT.match(d.rstrip("/").rsplit("/", 1)[-1]))
    return found[-1] if found else None


def find_stored(storage: str, study: str, trial_id: str) -> str | None:
    """The URI of a trial's stored checkpoint file: its own place, else (a lone trial of an earlier
    version) the newest checkpoint of its Ray Train run; None when it has none."""
    from records import files  # here, not at the top: the plain loop (and bench/gpu_suite.py) stays pyarrow-free

    uri = checkpoint_file(layout.checkpoint_dir(storage, study, trial_id))
    if files.exists(uri):
        return uri
    legacy = latest_train_checkpoint(files.list_dirs(legacy_train_dir(storage, study, trial_id)))
    if legacy is not None and files.exists(checkpoint_file(legacy)):
        return checkpoint_file(legacy)
    return None


def stored_epoch(storage: str, study: str, trial_id: str, scratch: str | os.PathLike) -> int | None:
    """The epoch a trial's stored checkpoint holds, as recorded with it (``epoch.json``; an earlier
    version's checkpoint is downloaded into `scratch` and read); None when it has no checkpoint."""
    from records import files  # (see find_stored)

    doc = files.read_json(epoch_file(layout.checkpoint_dir(storage, study, trial_id)))
    if doc is not None and isinstance(doc.get("epoch"), int):
        return doc["epoch"]
    uri = find_stored(storage, study, trial_id)
    if uri is None:
        return None
    local = Path(scratch) / trial_id / CHECKPOINT_FILE
    files.download(uri, local)
    try:
        return resume_point(local, name=uri)[0]
    finally:
        local.unlink(missing_ok=True)


# -- content -------------------------------------------------------------------------------------------
def to_cpu(obj: Any) -> Any:
    """`obj` with every tensor moved to the CPU (dicts, lists and tuples walked), so what is saved
    from a GPU run loads on any machine and holds no device handle."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_cpu(v) for v in obj)
    return obj


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write `obj` (its tensors on the CPU) atomically: a crash mid-write leaves the previous file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(to_cpu(obj), tmp)
    os.replace(tmp, path)


def load(path: str | os.PathLike, *, name: str | None = None, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """A checkpoint or snapshot, every tensor on the CPU, read without running any code in the file.

    ``name``: the file as errors call it (its storage URI when ``path`` is a local copy). Raises
    CorruptCheckpointError naming it when the file is not a readable checkpoint, or lacks one of `keys`."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict):
            raise TypeError(f"holds a {type(blob).__name__}, not a dict")
        if missing := [k for k in keys if k not in blob]:
            raise TypeError(f"holds no {missing}")
        return blob
    except (RuntimeError, EOFError, pickle.UnpicklingError, TypeError, ValueError) as exc:
        # torch: "PytorchStreamReader failed reading zip archive" (truncated), "invalid load key" (not one),
        # "Weights only load failed" (an object that is not plain data)
        raise CorruptCheckpointError(f"checkpoint file {name or os.fspath(path)} is corrupt (truncated, or not a "
                                     f"checkpoint): {type(exc).__name__}: {exc}") from exc


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu", *,
               name: str | None = None) -> tuple[ViT, RunConfig, int]:
    """Model (fp32, eval mode, on `map_location`), run config and epoch from a checkpoint or a
    snapshot file. Raises CorruptCheckpointError naming the file when it is not a readable one."""
    blob = load(path, name=name, keys=("config", "model", "epoch"))
    cfg = RunConfig.from_flat(blob["config"])
    model = ViT(cfg.model)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in blob["model"].items()})
    return model.to(map_location).eval(), cfg, int(blob["epoch"])


# -- a trial's checkpoint: the one place its keys are written and read -----------------------------------
def save_member(pack: PackedViT, k: int, optimizer: torch.optim.Optimizer, scheduler, history: list[dict[str, Any]],
                workdir: str | os.PathLike) -> str:
    """Write pack member k's resumable checkpoint into its `workdir` (the latest only): its weights and
    optimiser state, the pack's scheduler, the epoch it just recorded (the last of `history`), the
    process's RNG states, its history and config. Returns the checkpoint's folder."""
    path = local_checkpoint(workdir)
    save({"model": pack.member_state_dict(k), "optimizer": pack.member_optimizer_state(optimizer, k),
          "scheduler": scheduler.state_dict(), "epoch": history[-1]["epoch"], **rng_state(pack.device),
          "history": history, "config": pack.configs[k].to_flat()}, path)
    return str(path.parent)


def save_snapshot(model_state: dict[str, torch.Tensor], cfg: RunConfig, epoch: int, workdir: str | os.PathLike) -> None:
    # fp16 halves storage (a thousand trials x ~8 snapshots); analysis casts back.
    state = {k: v.half() if v.is_floating_point() else v for k, v in model_state.items()}
    save({"model": state, "config": cfg.to_flat(), "epoch": epoch}, Path(workdir) / SNAPSHOT_DIR / snapshot_name(epoch))


def resume_point(path: str | os.PathLike, *, name: str | None = None) -> tuple[int, list[dict[str, Any]], dict]:
    """(epoch, history, state) a checkpoint holds: where its trial continues, and the whole state for
    `restore_pack` (so it is read once). An earlier version's Train checkpoint of a lone trial may hold
    no history: its epochs are in the epochs table."""
    state = load(path, name=name)
    return int(state["epoch"]), list(state.get("history", [])), state


def restore_pack(pack: PackedViT, optimizer, scheduler, paths: list[Path], device: torch.device,
                 log=print, states: Sequence[dict[str, Any]] | None = None) -> tuple[int, list[list[dict]]]:
    """Continue every member from its own checkpoint (``states`` as loaded, else read from ``paths``), or
    none (a fresh start): (start epoch, histories)."""
    if states is None:
        found = [p.exists() for p in paths]
        if not any(found):
            return 1, [[] for _ in paths]
        if not all(found):
            missing = [c.trial_id for c, f in zip(pack.configs, found) if not f]
            raise ValueError(f"pack members {missing} have no checkpoint while the others do; members must "
                             "resume from the same epoch (the launcher packs trials by resume epoch)")
        states = [load(p) for p in paths]
    epochs = {s["epoch"] for s in states}
    if len(epochs) > 1:
        raise ValueError(f"pack members resume from different epochs {sorted(epochs)}; they must share one")
    load_pack_state(pack, optimizer, scheduler, states, device)
    for k, state in enumerate(states):
        log(f"[{pack.configs[k].trial_id}] resumed from epoch {state['epoch']}")
    return states[0]["epoch"] + 1, [list(s["history"]) for s in states]


def load_pack_state(pack: PackedViT, optimizer, scheduler, states: list[dict[str, Any]], device: torch.device) -> None:
    """Put loaded (CPU) checkpoint states, one per member, into a pack on `device`."""
    for k, state in enumerate(states):
        pack.load_member_state_dict(k, state["model"])
        pack.load_member_optimizer_state(optimizer, k, state["optimizer"])
    scheduler.load_state_dict(states[0]["scheduler"])
    restore_rng(states[0], device)


# -- random state --------------------------------------------------------------------------------------
def rng_state(device: torch.device) -> dict[str, Any]:
    """The process's random state: torch's CPU generator, Python's, and on CUDA the generator of the
    device in use (dropout masks and other device draws), all as CPU ByteTensors / plain data. Only
    that device's: a run resumes on a machine that sees any number of GPUs (a Ray worker sees one)."""
    state: dict[str, Any] = {"torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Undo `rng_state` from a loaded checkpoint (CPU ByteTensors, as `load` gives them); the saved CUDA
    state goes to the device this run uses, whichever it was saved from, and only when this run uses
    CUDA (a checkpoint moves between a GPU and a CPU machine)."""
    torch.set_rng_state(state["torch_rng"])
    random.setstate(_as_python_state(state["python_rng"]))
    if device.type == "cuda" and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"], device)


def _as_python_state(value: Any) -> tuple:
    """random.setstate wants (version, tuple of ints, gauss); a list-typed copy is accepted too."""
    version, internal, gauss = value
    return int(version), tuple(int(x) for x in internal), gauss
