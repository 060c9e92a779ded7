"""How the report names and orders what it shows: protocol and model labels, their sort keys, the
names of claim groups and metrics, and the factors a condition is made of.

Torch-free and plotting-free: figures, claims, tables and the page all read their words here, so a
protocol is called ``AA+CutMix`` and sorted the same way everywhere. The protocol vocabulary (the
switches and their parsing) and the PE order are ``records.vocab``'s.
"""

from __future__ import annotations

from records.vocab import MODERN, PES, SWITCHES, canonical_protocol

FACTORS = ("dataset", "pe", "rpt", "protocol")  # what a condition is; `seed` makes it a trial
REFERENCE = {"pe": "ape", "rpt": False, "protocol": "baseline"}  # the setting a factor is pinned to
SWITCH_LABELS = {"autoaugment": "AA", "cutmix": "CutMix", "label_smoothing": "LS"}  # table heads, group names
METRIC_LABELS = {"min_mad": "minimum MAD", "test_acc": "test accuracy", "dssdc": "dSSDC under RPI",
                 "fs_jpeg": "FS JPEG q5", "fs_blur": "FS blur s2.5", "mad_early": "mean MAD of layers 0-1",
                 "entropy_early": "mean attention entropy of layers 0-1",
                 "dssdc_per_batch": "dSSDC under RPI, the paper's estimator"}


def protocol_label(name: str) -> str:
    """Short display name: ``autoaugment+cutmix`` -> ``AA+CutMix``; all three -> ``modern``."""
    name = canonical_protocol(name)
    if name in ("baseline", MODERN):
        return "modern" if name == MODERN else name
    return "+".join(SWITCH_LABELS.get(p, p) for p in name.split("+"))


def protocol_key(name: str) -> tuple:
    """Sort key: baseline, single switches, pairs, modern (the ablation's reading order)."""
    parts = [] if name == "baseline" else canonical_protocol(name).split("+")
    return (len(parts), [SWITCHES.index(p) if p in SWITCHES else len(SWITCHES) for p in parts], name)


def model_label(pe: str, rpt: bool) -> str:
    """Study P's model names: ``ape``, ``ape + RPT``."""
    return f"{pe} + RPT" if rpt else str(pe)


def model_key(pe: str, rpt: bool) -> tuple:
    """Sort key: the PE registry's order (``records.vocab.PES``), a PE it does not name last, by name."""
    return (PES.index(pe) if pe in PES else len(PES), str(pe), bool(rpt))


def group_label(filters: dict) -> str:
    """Readable name of a group filter: ``ape + RPT``, ``CutMix``, ``with CutMix``."""
    parts = []
    if "pe" in filters:
        parts.append(model_label(filters["pe"], filters.get("rpt", False)))
    elif "rpt" in filters:
        parts.append("RPT" if filters["rpt"] else "fixed order")
    if "protocol" in filters:
        parts.append(protocol_label(filters["protocol"]))
    for s in SWITCHES:
        if s in filters:
            parts.append(f"{'with' if filters[s] else 'without'} {SWITCH_LABELS[s]}")
    return ", ".join(parts) or "all"
