"""The analysis measurements in MLflow: one metric key per measurements row, and per-layer curves.

Per checkpoint, the scalars go in at step = checkpoint epoch (``log_measurements``);
per-layer profiles go in with the layer as the step and the checkpoint epoch in
the key (``log_metric_series``: ``ssdc_rpi/epoch_0100``), which the MLflow UI
charts as a curve over depth.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from records.client import chunks, with_retries
from records.tracking import MAX_METRICS_PER_BATCH, log_metrics


def _given(x: Any) -> bool:
    """A level / layer / head_index that is set: not None, not NaN (pandas reads nulls as NaN)."""
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def measurement_metric_key(intervention: str, level: float | None, layer: int | None, head_index: int | None,
                           metric: str) -> str:
    """MLflow metric key of one measurements row, grouped in the UI by intervention:
    ('clean', None, None, None, 'acc') -> 'clean/acc'; ('jpeg', 5.0, None, None, 'fs') -> 'jpeg_5/fs';
    ('clean', None, 3, 2, 'mad') -> 'clean/mad/layer3/head2'; ('pe_scale', 0.5, 1, None, 'ssdc')
    -> 'pe_scale_0.5/ssdc/layer1'. Null (None or NaN) layer / head_index: not per layer / head."""
    group = intervention
    if _given(level):
        group += f"_{float(level):g}"
    key = f"{group}/{metric}"
    if _given(layer):
        key += f"/layer{int(layer)}"
    if _given(head_index):
        key += f"/head{int(head_index)}"
    return key


def log_measurements(uri: str, run_id: str, rows, *, per_head: bool = False) -> int:
    """Log measurements rows (schema ``measurements``: a pandas DataFrame, a pyarrow
    Table or an iterable of dicts) as metrics with step = checkpoint_epoch and keys
    from ``measurement_metric_key``. The run may have ended already (the analysis
    job runs after training and finds it with ``find_trial_run``). Per-head rows
    (head_index set, hundreds per checkpoint) are skipped unless ``per_head``: they stay
    in Parquet, where they are queryable, and out of the MLflow runs table.
    Returns the number of points logged."""
    if hasattr(rows, "to_pylist"):  # pyarrow Table
        rows = rows.to_pylist()
    elif hasattr(rows, "to_dict"):  # pandas DataFrame
        rows = rows.to_dict("records")
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        head = row.get("head_index")
        if _given(head) and not per_head:
            continue
        key = measurement_metric_key(row["intervention"], row.get("level"), row.get("layer"), head,
                                     row["metric"])
        by_step.setdefault(int(row["checkpoint_epoch"]), {})[key] = row["value"]
    for step, metrics in sorted(by_step.items()):
        log_metrics(uri, run_id, metrics, step)
    return sum(len(m) for m in by_step.values())


def log_metric_series(uri: str, run_id: str, series: Mapping[str, Mapping[int, Any]],
                      *, timestamp_ms: int | None = None) -> int:
    """Log ``{key: {step: number}}``: several steps of each key in one batched call, e.g. a
    per-layer profile with the layer as the step (``ssdc_rpi/epoch_0100``: step l = layer l),
    which the MLflow UI plots as a curve over depth. None values are skipped; returns the
    number of points logged."""
    from mlflow.entities import Metric

    timestamp = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    points = [Metric(str(key), float(value), timestamp, int(step))
              for key, values in series.items() for step, value in values.items() if value is not None]
    for batch in chunks(points, MAX_METRICS_PER_BATCH):
        with_retries("log_metric_series", uri, lambda c, b=batch: c.log_batch(run_id, metrics=b, synchronous=True))
    return len(points)
