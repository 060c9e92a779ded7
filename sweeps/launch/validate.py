"""Every value a user types, checked before torch, torchvision, Ray or MLflow is imported.

A bad value must answer in a moment with one line naming it and what is valid,
not after the 10-40 s those imports cost cold, and never inside Ray (``lr=nan``
there fails every trial deterministically, and Tune retries it). So the names
(``records.vocab``, the rows' keys), the flags and every ``--set`` field are checked here, each
field by the spec it declares in ``RunConfig`` or ``ViTConfig`` (torch-free;
``trainables.config.fields``), which checks the same spec again when it is built; what
needs two fields at once (warm-up <= epochs, dim divisible by heads) is left to it. A name close to
a valid one (``difflib``) ends the line with "did you mean ...?".
"""

from __future__ import annotations

import argparse
import difflib
import math
import shlex
from collections.abc import Iterable
from typing import Any

from records.layout import is_uri
from sweeps.studies import STUDIES
from trainables.config.architecture import PRESETS  # torch-free, as the two below
from trainables.config.data_roots import DATASET_SPECS
from trainables.config.run_config import FIELD_SPECS


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
    if key not in FIELD_SPECS:
        raise ValueError(f"unknown run-config field {key!r}; valid fields: {sorted(FIELD_SPECS)}"
                         f"{did_you_mean(key, FIELD_SPECS)}")
    field = FIELD_SPECS[key]
    try:
        return field.parse(key, value)
    except ValueError:
        raise field.error(key, value, did_you_mean(value, field.choices) if field.choices else "") from None


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


def check_overrides(pairs: Iterable[str]) -> dict[str, list[Any]]:
    """``--set`` pairs parsed, every key checked and every value typed (``check_value``): from here on the
    values are the fields' types, as the run config takes them."""
    return {key: [check_value(key, value) for value in values] for key, values in parse_overrides(pairs).items()}


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
    ("--placement-timeout", "placement_timeout", 0, False, False),
)
TEXT_FLAGS = (("--datasets", "datasets"), ("--preset", "preset"), ("--results", "results"),
              ("--storage", "storage"), ("--mlflow-uri", "mlflow_uri"), ("--data-root", "data_root"),
              ("--address", "address"), ("--defaults-from", "defaults_from"))


def check_numbers(args: argparse.Namespace) -> None:
    """Every numeric flag in its range (zero epochs is an error, not "the default"):
    raises ValueError naming the flag, the value and the valid range."""
    for flag, attr, low, inclusive, integer in NUMERIC_FLAGS:
        value = getattr(args, attr, None)
        if value is None:
            continue
        valid = f"an integer >= {low}" if integer else f"a number {'>=' if inclusive else '>'} {low:g}"
        if not math.isfinite(value) or (value < low if inclusive else value <= low):
            raise ValueError(f"{flag} must be {valid}, got {value:g}")
        if not integer and value and abs(value * 10_000 - round(value * 10_000)) > 1e-6:
            # Ray's resource precision: a finer fraction is refused only after Ray started.
            raise ValueError(f"{flag} must be a multiple of 0.0001 (Ray's resource precision), got {value!r}")


def check_texts(args: argparse.Namespace) -> None:
    """A text flag given as "" (or only commas and blanks) is an error, never a silent default."""
    for flag, attr in TEXT_FLAGS:
        value = getattr(args, attr, None)
        if value is not None and not value.replace(",", "").strip():
            expected = {"--datasets": f"pass comma-separated data sets from {list(DATASET_SPECS)}",
                        "--preset": f"pass one of {list(PRESETS)}"}.get(flag, "pass a value")
            raise ValueError(f"{flag} is empty ({value!r}); omit it for the default, or {expected}")


# The flags that take a path or URI: typed as they are, they stand on the launcher's command line.
PATH_FLAGS = (("--results", "results"), ("--storage", "storage"), ("--data-root", "data_root"),
              ("--mlflow-uri", "mlflow_uri"), ("--defaults-from", "defaults_from"))


def check_ascii_paths(args: argparse.Namespace) -> None:
    """A path flag with a non-ASCII character is refused: it stands on the launcher's command line, and
    Ray's memory monitor, reporting the processes that use the most memory, cuts their command lines at
    a byte length; a cut inside a multi-byte character made every raylet on the machine abort on the
    invalid UTF-8 (other users' included). A symlink gives such a folder an ASCII path."""
    for flag, attr in PATH_FLAGS:
        value = getattr(args, attr, None)
        if value is None or value.isascii():
            continue
        at, char = next((i, c) for i, c in enumerate(value) if not c.isascii())
        link = "" if is_uri(value) else f", e.g. a symlink with an ASCII name (ln -s {shlex.quote(value)} ASCII_PATH)"
        raise ValueError(f"{flag} {value!r} has a non-ASCII character {char!r} (U+{ord(char):04X}) at position "
                         f"{at + 1}: on this command line it can abort every raylet on this machine (Ray's "
                         f"out-of-memory report cuts command lines at a byte length, inside such a character); "
                         f"pass an ASCII {'URI' if is_uri(value) else 'path'} instead{link}")


def check_names(args: argparse.Namespace) -> None:
    """``--datasets`` and ``--preset`` name things that exist."""
    for dataset in (d.strip() for d in (getattr(args, "datasets", None) or "").split(",") if d.strip()):
        if dataset not in DATASET_SPECS:
            raise ValueError(f"unknown data set {dataset!r}; valid data sets: {list(DATASET_SPECS)}"
                             f"{did_you_mean(dataset, DATASET_SPECS)}")
    preset = getattr(args, "preset", None)
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {list(PRESETS)}{did_you_mean(preset, PRESETS)}")


def check_args(args: argparse.Namespace) -> dict[str, list[Any]]:
    """The flags' checks above (the study's name: ``options.check``, first); returns the ``--set`` overrides."""
    check_numbers(args)
    check_texts(args)
    check_ascii_paths(args)
    check_names(args)
    return check_overrides(getattr(args, "set", None) or [])


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument (``--seeds nan``) is one ``error:`` line and exit code 2, not the
    whole usage block first."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
