"""How the report names and orders what it shows: protocol and model labels, their sort keys, the
names of claim groups and metrics, and the factors a condition is made of.

Torch-free and plotting-free: figures, claims, tables and the page all read their words here, so a
protocol is called ``AA+CutMix`` and sorted the same way everywhere. The protocol vocabulary (the
switches and their parsing), the headline severities and the test-split sizes are the block below,
kept together because they move to ``records.vocab``; the PE order comes from ``records.names``.
"""

from __future__ import annotations

from records.names import PES

# vocabulary: moves to records.vocab at merge
SWITCHES = ("autoaugment", "cutmix", "label_smoothing")  # Study L's protocol switches, in name order
MODERN = "+".join(SWITCHES)  # Protocol.name of "modern" (all three switches on)


def canonical_protocol(name: str) -> str:
    """Protocol name as trials store it (``Protocol.name``); the alias ``modern`` maps to its switches."""
    return MODERN if name == "modern" else name


def protocol_switches(name: str) -> dict[str, bool]:
    """{'autoaugment': bool, 'cutmix': bool, 'label_smoothing': bool} from a protocol name."""
    parts = set() if name == "baseline" else set(canonical_protocol(name).split("+"))
    return {s: s in parts for s in SWITCHES}


# Headline severities of Study P's fragility score (FS): JPEG quality 5, blur kernel 5 sigma 2.5.
HEADLINE_JPEG_QUALITY, HEADLINE_BLUR_SIGMA = 5.0, 2.5
# Images of each data set's official test split: the n behind trials.test_acc (training measures it on
# the whole split), whatever cap the analysis set had. From trainables.datasets.DATASETS (shapes:
# trainables.shapes.TEST_SIZE; tests/test_figures.py checks both); a folder data set's is unknown here.
TEST_SPLIT_IMAGES = {"shapes": 2_000, "cifar10": 10_000, "cifar100": 10_000, "tinyimagenet": 10_000,
                     "imagenet100": 5_000}
# end of the vocabulary block

FACTORS = ("dataset", "pe", "rpt", "protocol")  # what a condition is; `seed` makes it a trial
REFERENCE = {"pe": "ape", "rpt": False, "protocol": "baseline"}  # the setting a factor is pinned to
SWITCH_LABELS = {"autoaugment": "AA", "cutmix": "CutMix", "label_smoothing": "LS"}  # table heads, group names
METRIC_LABELS = {
    "min_mad": "minimum MAD",
    "test_acc": "test accuracy",
    "dssdc": "dSSDC under RPI",
    "fs_jpeg": "FS JPEG q5",
    "fs_blur": "FS blur s2.5",
}


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
    """Sort key: the PE registry's order (``records.names.PES``), a PE it does not name last, by name."""
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
