"""A run-config field's spec (type, range, choices, help), declared once beside the field.

`RunConfig` and `ViTConfig` declare each field as ``name: float = spec(1e-3, gt=0, help=...)``. The
dataclass checks itself with it (`check_fields`, in ``__post_init__``) and the launcher checks every
``--set`` value with it before torch is imported (`Spec.parse`, ``sweeps/launch/validate.py``): one range,
one message, ``lr must be a finite number > 0, got 'nan'``. Torch-free, standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Spec:
    """A field's type and what is valid: bounds (``ge``/``gt``/``le``/``lt``) or ``choices`` (a registry's live
    keys see a row added at run time). ``open``: the class's own check decides (a PE registered in a test)."""

    kind: type
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: Collection[str] | None = None
    open: bool = False
    help: str = ""

    def describe(self) -> str:
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        if self.kind is bool:
            return "a boolean (true/false)"
        what = "an integer" if self.kind is int else "a finite number"
        bounds = [f"{op} {limit:g}" for op, limit in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                  if limit is not None]
        return f"{what} {' and '.join(bounds)}" if bounds else what

    def valid(self, value: Any) -> bool:
        """Whether a value of the field's type is in range (or among the choices); a number's field refuses a
        string (the command line's are typed at its edge, by `parse`) and a bool."""
        if self.kind is bool:
            return isinstance(value, bool)
        if self.kind is str:
            return self.open or self.choices is None or value in self.choices
        try:
            number = math.nan if isinstance(value, (str, bool)) else float(value)
        except (TypeError, ValueError):
            return False
        return (math.isfinite(number) and (self.kind is float or number.is_integer())
                and (self.ge is None or number >= self.ge) and (self.gt is None or number > self.gt)
                and (self.le is None or number <= self.le) and (self.lt is None or number < self.lt))

    def error(self, name: str, value: Any, hint: str = "") -> ValueError:
        return ValueError(f"{name} must be {self.describe()}, got {value!r}{hint}")

    def parse(self, name: str, value: Any) -> Any:
        """A ``--set`` string or a JSON value -> the field's type, or the ValueError naming what is valid."""
        parsed: Any
        if self.kind is bool and isinstance(value, str) and value.lower() in TRUE + FALSE:
            parsed = value.lower() in TRUE
        elif self.kind is str:
            parsed = str(value)
        elif self.kind is bool or isinstance(value, bool):
            parsed = value
        else:
            try:
                number = float(value) if isinstance(value, str) else value
                parsed = self.kind(number) if self.kind is float or float(number).is_integer() else None
            except (TypeError, ValueError, OverflowError):
                parsed = None
        if parsed is None or not self.valid(parsed) or (
                self.kind is str and self.open and parsed not in (self.choices or ())):
            raise self.error(name, value)
        return parsed


def spec(default: Any, help: str = "", **limits: Any) -> Any:
    """A dataclass field with its default and its `Spec` (the type is the default's)."""
    return dataclasses.field(default=default, metadata={"spec": Spec(type(default), help=help, **limits)})


@functools.cache  # a class's fields do not change, and every config built checks its fields with them
def specs(cls: type) -> Mapping[str, Spec]:
    """Field name -> `Spec`, for the fields of ``cls`` that declare one (read-only: it is shared)."""
    return types.MappingProxyType({f.name: f.metadata["spec"] for f in dataclasses.fields(cls) if "spec" in f.metadata})


def check_fields(obj: object) -> None:
    """Raise the first field's ValueError whose value its spec refuses (``__post_init__``)."""
    for name, field_spec in specs(type(obj)).items():  # type: ignore[arg-type]  # mypy: a class is not Hashable
        if not field_spec.valid(value := getattr(obj, name)):
            raise field_spec.error(name, value)
