"""GPU-hours of a planned sweep, from a measured throughput table: printed by ``--dry-run``.

The table is what ``bench/gpu_suite.py`` writes (``gpu_suite.json``) on a GPU
machine; a copy kept at ``bench/measured/gpu_suite.json`` makes it the
estimate's source. Its ``packing`` rows give training images/s of the
``study_l`` model per pack size K; a sweep's trials are counted as
training images (train split x epochs) and divided by the measured rate of
their pack size. Only what was measured is estimated: other presets (Study
P's ViT-S at 224 px) are named as unmeasured, never guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainables.config.data_roots import DATASET_SPECS

TABLE = Path(__file__).resolve().parents[2] / "bench" / "measured" / "gpu_suite.json"  # bench/gpu_suite.py writes it


def load_table() -> dict[str, Any] | None:
    try:
        return json.loads(TABLE.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def trial_images(flat: dict[str, Any]) -> int | None:
    """Training images one trial sees over all its epochs (None for a data set of unknown size): the
    official training split (`trainables.config.data_roots.DATASET_SPECS`) less the holdout, capped, times
    the epochs."""
    size = DATASET_SPECS.get(flat["dataset"])
    if size is None or size.train_images is None:
        return None
    n = round(size.train_images * (1 - flat.get("holdout_fraction", 0.05)))
    if flat.get("max_train_images", 0) > 0:
        n = min(n, flat["max_train_images"])
    return n * flat["epochs"]


def rate(table: dict[str, Any], preset: str, k: int) -> float | None:
    """Measured training images/s (all members together) of a pack of ``k`` ``preset`` models: that of
    the largest measured K not above ``k`` (packs are measured at 1, 4, 8, 16, 32), so a pack between
    two measured sizes is estimated conservatively, never extrapolated."""
    rows = (table.get("packing") or {}).get(preset) or {}
    sizes = sorted(int(key.split("=")[1]) for key in rows if key.startswith("K="))
    usable = [s for s in sizes if s <= k]
    return rows[f"K={usable[-1]}"].get("images_per_s") if usable else None


def packing_speedup(table: dict[str, Any], preset: str, k: int) -> float | None:
    """How many times the images/s of one lone trial a pack of ``k`` trains (all members together),
    from the measured rates (``rate``: the largest measured K not above ``k``); None when unmeasured.
    A pack's GPU-hours are its members' unpacked GPU-hours divided by this."""
    alone, packed = rate(table, preset, 1), rate(table, preset, k)
    return packed / alone if alone and packed else None


def estimate(configs, packs, table: dict[str, Any] | None) -> str:
    """One line for the dry run: GPU-hours, or why there is no estimate."""
    if table is None:
        return (f"GPU-hours: no estimate (no measured throughput table at {TABLE}; "
                "bench/gpu_suite.py writes one on a GPU machine: keep its gpu_suite.json there)")
    size_of = {tid: len(p.members) for p in packs for tid in p.trial_ids}
    seconds, unmeasured = 0.0, set()
    for cfg in configs:
        flat = cfg.to_flat()
        images = trial_images(flat)
        r = rate(table, flat["preset"], size_of.get(cfg.trial_id, 1))
        if images is None or r is None:
            unmeasured.add(f"{flat['preset']} on {flat['dataset']}")
            continue
        seconds += images / r  # a pack of K trains K members' images at r: each member's share is images / r
    device = table.get("device", "the measured GPU")
    line = f"GPU-hours: {seconds / 3600:.1f} on {device} (measured {table.get('measured_at', '?')})"
    if unmeasured:
        line += f"; not estimated (no measurement): {', '.join(sorted(unmeasured))}"
    sizes = {(p.members[0].to_flat()["preset"], len(p.members)) for p in packs if len(p.members) > 1}  # (preset, K)
    shown = [f"{preset} K={k} x{s:.1f}" for preset, k in sorted(sizes)
             if (s := packing_speedup(table, preset, k)) is not None]
    if shown:
        line += f"; packing speed-up over lone trials: {', '.join(shown)}"
    return line
