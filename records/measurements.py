"""The analysis measurements in MLflow: per-layer curves, several steps of a key in one batch.

Per checkpoint, the headline scalars go in at step = checkpoint epoch (``analysis.measuring.trial_record``
picks them from the rows); per-layer profiles go in with the layer as the step and the checkpoint
epoch in the key (``log_metric_series``: ``layers/ssdc_rpi_epoch_0100``), which the MLflow UI charts as
a curve over depth. Every measurement row stays in Parquet (``records.tables``), where it is queried.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from records.client import with_retries
from records.tracking import log_batches

# Imports inside functions: MLflow loads on the first write (see records/client.py).


def log_metric_series(uri: str, run_id: str, series: Mapping[str, Mapping[int, Any]]) -> int:
    """Log ``{key: {step: number}}``: several steps of each key in one batched call, e.g. a
    per-layer profile with the layer as the step (``layers/ssdc_rpi_epoch_0100``: step l = layer l),
    which the MLflow UI plots as a curve over depth. None values are skipped; returns the
    number of points logged."""
    from mlflow.entities import Metric

    timestamp = int(time.time() * 1000)
    points = [Metric(str(key), float(value), timestamp, int(step))
              for key, values in series.items() for step, value in values.items() if value is not None]
    log_batches(uri, run_id, "metrics", points, "log_metric_series")
    return len(points)


def log_new_points(uri: str, run_id: str,
                   series: Mapping[str, Mapping[int, Any]]) -> list[tuple[str, int, float, float]]:
    """``log_metric_series`` of only the (key, step) points the run has no value at: MLflow keeps
    every point it is sent and can neither overwrite nor delete one, so measuring a checkpoint again
    (``--force``, or a rerun after its Parquet file failed) never adds a second value at a step.
    Returns (key, step, the value MLflow keeps, the new value) of each point the new value differs at."""
    new: dict[str, dict[int, Any]] = {}
    changed = []
    # One get_run names the keys the run has: only those have a history to read (a new checkpoint's
    # per-layer keys, named by its epoch, have none).
    had = with_retries("get run", uri, lambda c: c.get_run(run_id)).data.metrics
    for key, values in series.items():
        history = with_retries(f"metric history {key}", uri,
                               lambda c, k=key: c.get_metric_history(run_id, k)) if key in had else []
        kept = {int(m.step): m.value for m in history}
        for step, value in values.items():
            if value is None:
                continue
            if int(step) not in kept:
                new.setdefault(key, {})[int(step)] = value
            elif not math.isclose(kept[int(step)], float(value), rel_tol=1e-9, abs_tol=1e-12):
                changed.append((str(key), int(step), kept[int(step)], float(value)))
    log_metric_series(uri, run_id, new)
    return changed
