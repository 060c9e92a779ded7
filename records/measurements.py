"""The analysis measurements in MLflow: per-layer curves, several steps of a key in one batch.

Per checkpoint, the headline scalars go in at step = checkpoint epoch (``analysis.trial_record``
picks them from the rows); per-layer profiles go in with the layer as the step and the checkpoint
epoch in the key (``log_metric_series``: ``layers/ssdc_rpi_epoch_0100``), which the MLflow UI charts as
a curve over depth. Every measurement row stays in Parquet (``records.tables``), where it is queried.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from records.client import chunks, with_retries
from records.tracking import MAX_METRICS_PER_BATCH


def log_metric_series(uri: str, run_id: str, series: Mapping[str, Mapping[int, Any]],
                      *, timestamp_ms: int | None = None) -> int:
    """Log ``{key: {step: number}}``: several steps of each key in one batched call, e.g. a
    per-layer profile with the layer as the step (``layers/ssdc_rpi_epoch_0100``: step l = layer l),
    which the MLflow UI plots as a curve over depth. None values are skipped; returns the
    number of points logged."""
    from mlflow.entities import Metric

    timestamp = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    points = [Metric(str(key), float(value), timestamp, int(step))
              for key, values in series.items() for step, value in values.items() if value is not None]
    for batch in chunks(points, MAX_METRICS_PER_BATCH):
        with_retries("log_metric_series", uri, lambda c, b=batch: c.log_batch(run_id, metrics=b, synchronous=True))
    return len(points)
