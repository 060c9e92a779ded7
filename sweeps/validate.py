"""Every value a user types, checked before torch, torchvision, Ray or MLflow is imported.

A bad value must answer in a moment with one line naming it and what is valid,
not after the 10-40 s those imports cost cold, and never inside Ray (``lr=nan``
there fails every trial deterministically, and Tune retries it). So the names
(``records.vocab``), the flags and every ``--set`` field are checked here, from a
torch-free table of the run-config fields (``FIELDS``; ``tests/test_validate.py``
fails when it drifts from ``RunConfig.to_flat()``). ``RunConfig`` checks the
same ranges again when it is built; what needs two fields at once (warm-up <=
epochs, dim divisible by heads) is left to it.

One function per kind of check (``check_study``, ``check_numbers``,
``check_texts``, ``check_names``, ``check_value``, ``check_overrides``);
``check_args`` runs them all. Each raises ValueError with the one line; a name
close to a valid one (``difflib``) ends it with "did you mean ...?".
"""

from __future__ import annotations

import argparse
import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from records import vocab
from sweeps import STUDIES
from trainables.vit_config import CLS_INITS, LINEAR_INITS  # torch-free


@dataclass(frozen=True)
class Field:
    """A run-config field: its type, and for numbers the valid range (low/high, inclusive or not)."""

    kind: type
    low: float | None = None
    low_inclusive: bool = True
    high: float | None = None
    high_inclusive: bool = True
    choices: tuple[str, ...] | None = None

    def describe(self) -> str:
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        if self.kind is bool:
            return "a boolean (true/false)"
        what = "an integer" if self.kind is int else "a finite number"
        parts = []
        if self.low is not None:
            parts.append(f"{'>=' if self.low_inclusive else '>'} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<=' if self.high_inclusive else '<'} {self.high:g}")
        return f"{what} {' and '.join(parts)}" if parts else what


def _ge(low, kind=float):
    return Field(kind, low)


_POSITIVE_INT = Field(int, 1)
_RATE = Field(float, 0, True, 1, False)  # dropout-like: [0, 1)
OPTIMIZERS = ("adamw", "adam")
DECAY_EXEMPT = ("timm", "none")
SCHEDULES = ("cosine", "constant")
EVAL_SPLITS = ("test", "holdout")
DEVICES = ("auto", "cpu", "cuda")
APE_INITS = ("normal", "trunc_normal")

# Every field of RunConfig.to_flat() (run fields, the derived protocol, the ViT's fields).
FIELDS: dict[str, Field] = {
    "study": Field(str), "dataset": Field(str, choices=vocab.DATASETS), "data_root": Field(str),
    "preset": Field(str, choices=vocab.PRESETS),
    "rpt": Field(bool), "rpt_per_image": Field(bool), "autoaugment": Field(bool), "cutmix": Field(bool),
    "label_smoothing": Field(bool), "cutmix_prob": Field(float, 0, True, 1, True),
    "optimizer": Field(str, choices=OPTIMIZERS), "lr": Field(float, 0, False), "weight_decay": _ge(0),
    "decay_exempt": Field(str, choices=DECAY_EXEMPT), "batch_size": _POSITIVE_INT, "epochs": _POSITIVE_INT,
    "warmup_epochs": _ge(0, int), "schedule": Field(str, choices=SCHEDULES), "seed": _ge(0, int),
    "eval_split": Field(str, choices=EVAL_SPLITS), "holdout_fraction": Field(float, 0, True, 1, False),
    "crop_padding": _ge(0, int),
    "max_train_images": _ge(0, int), "checkpoint_every": _POSITIVE_INT, "checkpoint_interval_s": _ge(0),
    "epoch_eval_images": _ge(0, int),
    "device": Field(str, choices=DEVICES), "amp": Field(bool), "num_workers": _ge(-1, int), "compile": Field(bool),
    "protocol": Field(str, choices=vocab.PROTOCOLS),
    "img_size": _POSITIVE_INT, "patch_size": _POSITIVE_INT, "in_chans": _POSITIVE_INT, "num_classes": _POSITIVE_INT,
    "dim": _POSITIVE_INT, "depth": _POSITIVE_INT, "heads": _POSITIVE_INT, "mlp_ratio": Field(float, 0, False),
    "pe": Field(str, choices=vocab.PES), "drop_rate": _RATE, "attn_drop_rate": _RATE, "proj_drop_rate": _RATE,
    "drop_path_rate": _RATE, "ape_init": Field(str, choices=APE_INITS), "rope_base": Field(float, 0, False),
    "cls_init": Field(str, choices=CLS_INITS), "linear_init": Field(str, choices=LINEAR_INITS), "final_norm": Field(bool),
}

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the valid name closest to a misspelt ``name``, or "" when none is close."""
    close = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_study(study: str) -> None:
    if study not in STUDIES:
        raise ValueError(f"unknown study {study!r}; valid studies: {list(STUDIES)}{did_you_mean(study, STUDIES)}")


def check_value(key: str, value: Any) -> Any:
    """One run-config value (a ``--set`` string or a JSON value) -> the parsed value, or ValueError
    naming the field, the value and what is valid."""
    if key not in FIELDS:
        raise ValueError(f"unknown run-config field {key!r}; valid fields: {sorted(FIELDS)}{did_you_mean(key, FIELDS)}")
    field = FIELDS[key]
    bad = ValueError(f"{key} must be {field.describe()}, got {value!r}"
                     f"{did_you_mean(value, field.choices) if field.choices else ''}")
    if field.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise bad
    if field.kind is str:
        if field.choices is not None and str(value) not in field.choices:
            raise bad
        return str(value)
    try:
        if isinstance(value, bool):
            raise TypeError
        number = field.kind(value) if isinstance(value, str) else value
        if field.kind is int and (not isinstance(number, int) and not float(number).is_integer()):
            raise TypeError
        number = field.kind(number)
    except (TypeError, ValueError, OverflowError):
        raise bad from None
    if not math.isfinite(number):
        raise bad
    if field.low is not None and (number < field.low if field.low_inclusive else number <= field.low):
        raise bad
    if field.high is not None and (number > field.high if field.high_inclusive else number >= field.high):
        raise bad
    return number


def parse_overrides(pairs: Iterable[str]) -> dict[str, list[str]]:
    """``--set KEY=VALUE`` pairs -> {key: [values]}: ``KEY=V1,V2`` sweeps the key over V1 and V2
    (crossed with the study's grid and with the other swept keys), as Hydra's multirun does."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        values = [v.strip() for v in value.split(",")]
        if not sep or not key.strip() or not all(values):
            raise ValueError(f"--set expects KEY=VALUE or KEY=V1,V2,..., got {pair!r}")
        overrides[key.strip()] = values
    return overrides


def check_overrides(pairs: Iterable[str]) -> dict[str, list[str]]:
    """``--set`` pairs parsed, every key and every value checked (the strings are kept: the run
    config parses them to its own types)."""
    overrides = parse_overrides(pairs)
    for key, values in overrides.items():
        for value in values:
            check_value(key, value)
    return overrides


# (flag, attribute, smallest valid value, whether the value may equal it, integer?)
# None (flag not given) always means "the study's / the default value".
NUMERIC_FLAGS = (
    ("--seeds", "seeds", 1, True, True),
    ("--epochs", "epochs", 1, True, True),
    ("--samples", "samples", 1, True, True),
    ("--gpus-per-trial", "gpus_per_trial", 0, True, False),
    ("--cpus-per-trial", "cpus_per_trial", 0, False, False),
    ("--workers-per-trial", "workers_per_trial", 1, True, True),
    ("--max-concurrent", "max_concurrent", 1, True, True),
    ("--max-failures", "max_failures", 0, True, True),
    ("--pack", "pack", 1, True, True),
)
TEXT_FLAGS = (("--datasets", "datasets"), ("--preset", "preset"), ("--results", "results"),
              ("--storage", "storage"), ("--mlflow-uri", "mlflow_uri"), ("--data-root", "data_root"),
              ("--address", "address"), ("--defaults-from", "defaults_from"))


def check_numbers(args: argparse.Namespace, flags=NUMERIC_FLAGS) -> None:
    """Every numeric flag in its range (zero epochs is an error, not "the default"):
    raises ValueError naming the flag, the value and the valid range."""
    for flag, attr, low, inclusive, integer in flags:
        value = getattr(args, attr, None)
        if value is None:
            continue
        valid = f"an integer >= {low}" if integer else f"a number {'>=' if inclusive else '>'} {low:g}"
        if not math.isfinite(value) or (value < low if inclusive else value <= low):
            raise ValueError(f"{flag} must be {valid}, got {value:g}")
        if not integer and value and abs(value * 10_000 - round(value * 10_000)) > 1e-6:
            # Ray's resource precision: a finer fraction is refused only after Ray started.
            raise ValueError(f"{flag} must be a multiple of 0.0001 (Ray's resource precision), got {value!r}")


def check_texts(args: argparse.Namespace, flags=TEXT_FLAGS) -> None:
    """A text flag given as "" (or only commas and blanks) is an error, never a silent default."""
    for flag, attr in flags:
        value = getattr(args, attr, None)
        if value is not None and not value.replace(",", "").strip():
            raise ValueError(f"{flag} is empty ({value!r}); omit it for the default, or {_expected(flag)}")


def _expected(flag: str) -> str:
    if flag == "--datasets":
        return f"pass comma-separated data sets from {list(vocab.DATASETS)}"
    if flag == "--preset":
        return f"pass one of {list(vocab.PRESETS)}"
    return "pass a value"


def check_names(args: argparse.Namespace) -> None:
    """``--datasets`` and ``--preset`` name things that exist."""
    for dataset in (d.strip() for d in (getattr(args, "datasets", None) or "").split(",") if d.strip()):
        if dataset not in vocab.DATASETS:
            raise ValueError(f"unknown data set {dataset!r}; valid data sets: {list(vocab.DATASETS)}"
                             f"{did_you_mean(dataset, vocab.DATASETS)}")
    preset = getattr(args, "preset", None)
    if preset is not None and preset not in vocab.PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {list(vocab.PRESETS)}"
                         f"{did_you_mean(preset, vocab.PRESETS)}")


def check_args(args: argparse.Namespace) -> dict[str, list[str]]:
    """All of the above for a launch; returns the parsed ``--set`` overrides."""
    check_study(args.study)
    check_numbers(args)
    check_texts(args)
    check_names(args)
    return check_overrides(getattr(args, "set", None) or [])


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument (``--seeds nan``) is one ``error:`` line and exit code 2, not the
    whole usage block first."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

