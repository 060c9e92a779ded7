"""What a study module declares: two required names, and optional hooks whose defaults stand here.

A study is a module in ``sweeps/studies/`` named in ``sweeps.studies.STUDIES``, with a docstring (launch command,
trial count, expected result) and

    DEFAULTS                  a ``StudyOptions``: the data sets, seeds, epochs and preset of a bare launch
    trials(options, **kw)     -> list[RunConfig]: its conditions x seeds (``sweeps.studies.common.make_trials``)

A plain grid needs nothing else. A study that differs says so with these hooks, never by a test of
its name in the launcher (``tests/test_layout.py`` checks ``sweeps/run.py`` compares none):

    EVAL_SIZE = None          images of the test split the analysis measures each checkpoint on
                              (None: the whole split)
    CHECKPOINTS = "final"     which checkpoints the analysis stage measures ("all": every snapshot)
    PLANNED = True            its trials are known before it starts: the launcher counts them, packs
                              them, records the plan (``sweep.json``), prints a line per trial and
                              checks each one finished. False: a search samples its trials as it goes
    UNPACKED = None           why its trials always train alone whatever ``--pack`` says (None: they pack)
    RESUME_REFUSED = None     the error line for ``--resume`` when the study cannot continue
                              (None: ``--resume`` continues the unfinished trials)
    add_arguments(group)      its own flags, in ``vitsweep sweep --help`` under "<study> only"
    check_launch(args, swept) refuse (ValueError, one line) a launch it cannot run, before torch is
                              imported; ``swept``: the ``--set`` fields given as KEY=V1,V2,...
    trial_options(args)       -> dict: keyword arguments of ``trials()`` from its own flags
    tuner(setup)              -> ``ray.tune.Tuner`` from a ``TuneSetup``: its own search (default: a
                              grid over its trials or packs)
    after_sweep(results, grid, configs)   what follows a sweep without storage faults, with Tune's
                              ``ResultGrid`` (e.g. the best config written)

``of(name)`` reads a module into a ``Study`` with every hook resolved. Importing a study must not
import torch (``sweeps.studies.common`` imports it when trials are built), so ``--help`` and the name
checks stay fast.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sweeps.studies import STUDIES

# Hook -> its default; the module's own value wins.
CONSTANTS: dict[str, Any] = {"EVAL_SIZE": None, "CHECKPOINTS": "final", "PLANNED": True, "UNPACKED": None,
                             "RESUME_REFUSED": None}
FUNCTIONS: dict[str, Callable | None] = {
    "add_arguments": lambda group: None,
    "check_launch": lambda args, swept: None,
    "trial_options": lambda args: {},
    "tuner": None,  # None: the launcher's grid over trials (or packs)
    "after_sweep": lambda results, grid, configs: None,
}


@dataclass(frozen=True)
class Study:
    """A study module with its hooks resolved (see the module docstring for each one)."""

    name: str
    module: ModuleType
    eval_size: int | None
    checkpoints: str
    planned: bool
    unpacked: str | None
    resume_refused: str | None
    add_arguments: Callable[[Any], None]
    check_launch: Callable[[argparse.Namespace, dict[str, list[Any]]], None]
    trial_options: Callable[[argparse.Namespace], dict[str, Any]]
    tuner: Callable[[TuneSetup], Any] | None
    after_sweep: Callable[[str, Any, list], None]

    @property
    def defaults(self):
        return self.module.DEFAULTS

    def trials(self, options, args: argparse.Namespace) -> list:
        return self.module.trials(options, **self.trial_options(args))


@dataclass
class TuneSetup:
    """What a study's ``tuner`` hook builds its Tuner from.

    trainable: Tune's trainable (one Tune trial trains one trial, or one pack); base: the study's first
    trial config, which a search varies; max_concurrent: trials that fit at once (None: no cap);
    run_config: keyword arguments of ``tune.RunConfig`` (name, storage_path, verbose, callbacks, stop)
    the launcher needs kept; stopped: add the trial id of every trial the study's scheduler stops
    early (recorded as stopped, not failed)."""

    args: argparse.Namespace
    base: Any  # RunConfig
    trainable: Any
    max_concurrent: int | None
    run_config: dict[str, Any]
    stopped: set[str] = field(default_factory=set)


def of(name: str) -> Study:
    """The study called ``name``, its hooks resolved; unknown names raise ValueError."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; valid studies: {list(STUDIES)}")
    module = importlib.import_module(f"sweeps.studies.{name}")
    hooks = {key.lower(): getattr(module, key, default) for key, default in CONSTANTS.items()}
    hooks |= {key: getattr(module, key, default) for key, default in FUNCTIONS.items()}
    return Study(name=name, module=module, **hooks)


def unpacked_reason(name: str) -> str | None:
    """Why study ``name``'s trials always train alone (None too for a name that is no study)."""
    return of(name).unpacked if name in STUDIES else None
