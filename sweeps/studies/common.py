"""What every study file (``sweeps/studies/study.py``) shares: the options a user may change and the grid helper.

Importing a study imports nothing of ``trainables`` (``RunConfig`` is imported when trials are built),
and building trials imports no torch (``RunConfig``, ``ViTConfig`` and the data-set sizes are torch-free):
``vitsweep sweep --help`` shows every study's own flags, a bad name is refused and ``--dry-run`` lists the
trials, in a moment.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainables.config.run_config import RunConfig
from trainables.config.data_roots import dataset_spec


@dataclass(frozen=True)
class StudyOptions:
    """The knobs every study accepts (``--datasets``, ``--seeds``, ``--epochs``, ``--preset``, ``--set``)."""

    datasets: tuple[str, ...]
    seeds: int
    epochs: int | None  # None: each trial's recipe's (``base["epochs"]``, else the run-config default)
    preset: str | None = None  # None: each data set's native preset
    overrides: dict[str, Any] = field(default_factory=dict)
    data_root: str = "data"


# Native preset per image size: Study L's model at 32 and 64 px, Study P's at 224 px.
NATIVE_PRESETS = {32: "study_l", 64: "study_l", 224: "study_p"}


def native_preset(dataset: str, data_root: str | None = None) -> str:
    size = dataset_spec(dataset, data_root).img_size
    return NATIVE_PRESETS.get(size, "study_l")


def make_trials(study: str, options: StudyOptions, conditions: Iterable[dict[str, Any]],
                base: dict[str, Any] | None = None) -> list[RunConfig]:
    """conditions x seeds, in that order, each a full RunConfig.

    A condition is a dict with ``dataset`` and any run-config fields (``pe``,
    ``rpt``, ``protocol``, ...); ``base`` holds the study's recipe; user
    ``--set`` overrides win over both."""
    configs = []
    for cond in conditions:
        cond = dict(cond)
        dataset = cond.pop("dataset")
        preset = options.preset or native_preset(dataset, options.data_root)
        for seed in range(options.seeds):
            fields = {**(base or {}), **cond, "study": study, "seed": seed,
                      **({} if options.epochs is None else {"epochs": options.epochs}),
                      "data_root": options.data_root, **options.overrides}
            warmup = fields.get("warmup_epochs", RunConfig.warmup_epochs)
            fields["warmup_epochs"] = min(int(warmup), int(fields.get("epochs", RunConfig.epochs)))
            configs.append(RunConfig.for_dataset(dataset, preset=preset, **fields))
    return configs
