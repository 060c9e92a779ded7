"""The project's vocabulary, torch-free (standard library only): every name and shared rule in one place.

Every floor reads it: `vitsweep --help` and the pre-torch checks (`sweeps/launch/validate.py`) list the
names from here without waiting 10-40 s for torch; training, the analysis and the report take the
same names, switches and rules from here, so no two copies can drift. A data set's or a preset's name
is its row's key (`trainables.config.data_roots.DATASET_SPECS`, `trainables.config.architecture.PRESETS`).

The PE registry (`trainables.model.pos_embed.POS_EMBEDS`) calls `check_registry` at import: a key it has
and `PES` lacks (or the other way round, or another order) fails the import with a message naming the
key. So a new PE is its subclass, its line in `POS_EMBEDS` and its name in `PES` below; a PE defined
outside the product (a test, a notebook) by `POS_EMBEDS[name] = cls` after import needs no name here:
it trains and is measured, and the report orders names it does not know after these.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

# -- the registries' names ------------------------------------------------------------------------
PES = ("none", "ape", "sincos2d", "rope2d", "rope2d_mixed")


def check_registry(registry: str, keys: Iterable[str], names: tuple[str, ...], vocabulary: str) -> None:
    """Raise ValueError unless a registry's keys are the vocabulary's names, in the same order.

    registry / vocabulary: how to name the two in the message (``"trainables.model.pos_embed.POS_EMBEDS"``,
    ``"PES"``)."""
    keys = tuple(keys)
    if keys == names:
        return
    extra = [k for k in keys if k not in names]
    missing = [n for n in names if n not in keys]
    problems = []
    if extra:
        problems.append(f"{registry} has {extra}, which records.vocab.{vocabulary} lacks: add to records/vocab.py")
    if missing:
        problems.append(f"records.vocab.{vocabulary} has {missing}, which {registry} lacks")
    if not problems:
        problems.append(f"{registry} lists {list(keys)}, records.vocab.{vocabulary} {list(names)}: put them "
                        "in one order (the report's)")
    raise ValueError("; ".join(problems))


# -- protocols: Study L's three switches ----------------------------------------------------------
SWITCHES = ("autoaugment", "cutmix", "label_smoothing")  # in name order: "autoaugment+cutmix", never the reverse
MODERN = "+".join(SWITCHES)  # the name trials store for `modern` (all three switches on)
ALIASES = {"modern": MODERN}  # a name a user may type for another protocol


def protocol_name(autoaugment: bool = False, cutmix: bool = False, label_smoothing: bool = False) -> str:
    """The name a trial stores: "baseline", or the switches that are on joined by "+" in `SWITCHES` order."""
    on = [s for s, value in zip(SWITCHES, (autoaugment, cutmix, label_smoothing)) if value]
    return "+".join(on) if on else "baseline"


# Every on/off setting of the switches, baseline first and all three last (the report's order), then the aliases.
SETTINGS = tuple(protocol_name(*on) for on in itertools.product((False, True), repeat=len(SWITCHES)))
PROTOCOLS = (*SETTINGS, *ALIASES)


def canonical_protocol(name: str) -> str:
    """Protocol name as trials store it (``protocol_name``); an alias (``modern``) maps to its switches."""
    return ALIASES.get(name, name)


def protocol_switches(name: str) -> dict[str, bool]:
    """{'autoaugment': bool, 'cutmix': bool, 'label_smoothing': bool} of a protocol name (or an alias).
    ``"cutmix+label_smoothing"`` -> cutmix and label_smoothing on. An unknown name raises ValueError."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; valid: {list(PROTOCOLS)}")
    name = canonical_protocol(name)
    parts = set() if name == "baseline" else set(name.split("+"))
    return {s: s in parts for s in SWITCHES}


# -- run-config fields by role --------------------------------------------------------------------
# Fields that say where or how a run executes, or what it is called, not what it computes: they stay
# out of the trial id's hash (trainables.config.run_config) and never split a condition
# (analysis.statistics.conditions).
# `swept` names the fields a --set sweep varies (the id's readable part shows their values).
EXECUTION_FIELDS = ("data_root", "device", "num_workers", "compile", "checkpoint_interval_s", "swept")


# -- collapsed runs -------------------------------------------------------------------------------
# A final accuracy at most this far above chance (1 / classes) means the model did not learn: it is
# flagged (trials column `did_not_learn`), counted per condition and shown with and without in every claim.
CHANCE_MARGIN = 0.02


def did_not_learn(eval_acc: float | None, num_classes: int) -> bool | None:
    """True when a final top-1 accuracy lies within ``CHANCE_MARGIN`` of chance (or below it);
    None when the accuracy is unknown. ``did_not_learn(0.11, 10)`` -> True, ``(0.13, 10)`` -> False."""
    if eval_acc is None or math.isnan(eval_acc):
        return None
    return bool(eval_acc <= 1.0 / num_classes + CHANCE_MARGIN + 1e-12)


# -- CLS sinks -------------------------------------------------------------------------------------
# A head whose patch queries give CLS at least this share of their mass is a CLS sink: its renormalised
# MAD describes the little left on the patches (uniform, for a head that spreads it), not locality, so
# minimum MAD (the report's, and a checkpoint's MLflow scalar) leaves it out and counts it (``cls_sink_heads``).
CLS_SINK_MASS = 0.5


# -- Study P's headline severities ----------------------------------------------------------------
# The fragility score (FS) a claim, a summary column and a trial's MLflow run report: JPEG quality 5,
# Gaussian blur of kernel 5 at sigma 2.5 (the harshest levels of `analysis.measuring.interventions`' grids).
JPEG_HEADLINE = 5  # quality
BLUR_HEADLINE = (5, 2.5)  # (kernel, sigma)


# -- the console's durations -----------------------------------------------------------------------
def format_duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``1.5 h``: every console line's durations (a launch's, an analysis', status)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
