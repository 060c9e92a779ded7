"""Faults inside a pack's training, for the pack tests (never on a user's path).

Put this folder on PYTHONPATH and every process of the sweep (the launcher, Ray's and Train's workers,
which inherit the environment) wraps the product where the fault belongs, as the module loads:

- ``VITSWEEP_TEST_DIVERGE=TRIAL_ID:EPOCH``: that member's weights turn non-finite at the start of
  that epoch (when the pack asks for the epoch's batches), so its loss diverges and it must leave
  its pack alone (``diverge``);
- ``VITSWEEP_TEST_DIE=TRIAL_ID:EPOCH:MARKER``: the Train worker of TRIAL_ID's pack is SIGKILLed when
  it reports EPOCH, after the uploads of the epoch before are done, once (while the file MARKER does
  not exist), so Train retries the worker (``die``).

In-process tests call ``diverge`` with ``monkeypatch.setattr`` (``tests/conftest.py``). Processes
that never load the wrapped modules pay only for installing the finder."""

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import weakref

DIVERGE = "VITSWEEP_TEST_DIVERGE"
DIE = "VITSWEEP_TEST_DIE"


def diverge(trial_id: str, epoch: int, patch=setattr) -> None:
    """Both halves of the divergence, on modules already loaded (``patch``: ``monkeypatch.setattr`` in-process)."""
    from trainables.data import inputs
    from trainables.model import packed

    track_packs(packed, patch)
    poison_epoch(inputs, trial_id, epoch, patch)


_current: list = []  # a weak reference to the pack built or put into training last: the one training now


def track_packs(packed, patch=setattr) -> None:
    """``PackedViT`` remembers the pack built or put into training last (an out-of-memory retry or a
    resume in groups builds new ones; evaluation puts a pack out of training, not into it)."""
    cls = packed.PackedViT
    init, train = cls.__init__, cls.train

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _current[:] = [weakref.ref(self)]

    def train_mode(self, mode: bool = True):
        if mode:
            _current[:] = [weakref.ref(self)]
        return train(self, mode)

    patch(cls, "__init__", __init__)
    patch(cls, "train", train_mode)


def poison_epoch(inputs, trial_id: str, epoch: int, patch=setattr) -> None:
    """``pack_epoch`` (the batches of one epoch of a pack) first makes ``trial_id``'s head non-finite
    in the current pack at ``epoch``; every module that already bound it gets the wrapper too."""
    import torch

    real = inputs.pack_epoch

    def pack_epoch(*args, **kwargs):
        pack = _current[0]() if _current else None
        if kwargs.get("epoch") == epoch and pack is not None and trial_id in pack.trial_ids:
            k = pack.trial_ids.index(trial_id)
            state = pack.member_state_dict(k)
            state["head.weight"] = torch.full_like(state["head.weight"], float("inf"))
            pack.load_member_state_dict(k, state)
        return real(*args, **kwargs)

    for module in [inputs, *(m for m in list(sys.modules.values()) if getattr(m, "pack_epoch", None) is real)]:
        patch(module, "pack_epoch", pack_epoch)


def die(ray_trial, trial_id: str, epoch: int, marker: str) -> None:
    """``PackWorker.report`` SIGKILLs its own process at ``epoch`` of ``trial_id``'s pack, once."""
    real = ray_trial.PackWorker.report

    def report(self, entries, report_to_train):
        if (entries[0][1]["epoch"] == epoch and trial_id in [t for t, _, _ in entries]
                and not os.path.exists(marker)):
            self.settle()  # the uploads of the epoch before are done
            open(marker, "w").close()  # noqa: SIM115
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, entries, report_to_train)

    ray_trial.PackWorker.report = report


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hooks[name](module)`` right after module ``name`` runs, before anyone imports from it."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run_module, hook = spec.loader.exec_module, self.hooks[name]

        def exec_module(module):
            run_module(module)
            hook(module)

        spec.loader.exec_module = exec_module
        return spec


def _install() -> None:
    hooks = {}
    if os.environ.get(DIVERGE):
        member, _, at = os.environ[DIVERGE].rpartition(":")
        hooks["trainables.model.packed"] = track_packs
        hooks["trainables.data.inputs"] = lambda module: poison_epoch(module, member, int(at))
    if os.environ.get(DIE):
        victim, when, marker = os.environ[DIE].split(":", 2)
        hooks["trainables.trial.ray_trial"] = lambda module: die(module, victim, int(when), marker)
    if hooks:
        sys.meta_path.insert(0, _AfterImport(hooks))


_install()
