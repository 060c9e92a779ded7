"""The tests' view of a study's MLflow runs: every live trial run of an experiment as one DataFrame."""

from __future__ import annotations

import pandas as pd
from mlflow.tracking import MlflowClient

from records import tracking
from records.client import with_retries
from records.stores import redact
from records.tracking import TRIAL_ID_TAG

BASE_COLUMNS = ["run_id", "run_name", "trial_id", "experiment_id", "status", "start_time", "end_time",
                "artifact_uri"]


def search_trial_runs(uri: str, experiment_name: str) -> pd.DataFrame:
    """All live trial runs of an experiment (runs without a trial-id tag, such as the
    report's, are left out), one row per run, like ``mlflow.search_runs`` but with an
    explicit URI: ``BASE_COLUMNS`` (times as UTC timestamps), then ``metrics.<key>``
    (latest value), ``params.<key>``, ``tags.<key>``.
    Raises ValueError if the experiment does not exist, listing those that do."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"no MLflow experiment {experiment_name!r} on {redact(uri)!r}; "
                         f"experiments: {', '.join(names) or '(none)'}")
    runs = with_retries(f"search runs of {experiment_name!r}", uri, lambda c: tracking._search_all(
        c, experiment.experiment_id, "", order_by=["attributes.start_time ASC"]))
    rows = []
    for run in runs:
        info, data = run.info, run.data
        if TRIAL_ID_TAG not in data.tags:
            continue
        row = {
            "run_id": info.run_id, "run_name": info.run_name,
            "trial_id": data.tags.get(TRIAL_ID_TAG), "experiment_id": info.experiment_id,
            "status": info.status,
            "start_time": pd.to_datetime(info.start_time, unit="ms", utc=True),
            "end_time": pd.to_datetime(info.end_time, unit="ms", utc=True) if info.end_time else pd.NaT,
            "artifact_uri": info.artifact_uri,
        }
        row.update({f"metrics.{k}": v for k, v in data.metrics.items()})
        row.update({f"params.{k}": v for k, v in data.params.items()})
        row.update({f"tags.{k}": v for k, v in data.tags.items()})
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else BASE_COLUMNS)
