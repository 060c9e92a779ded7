"""A pack's per-epoch records, written off the training thread.

Once per epoch every member's metrics go to its ``epochs`` Parquet rows (the whole history, so an epoch
trained again replaces its row) and to its MLflow run (each step once). Written in the training thread
these were K synchronous writes per epoch (0.2-2 s of an idle GPU per ~7 s epoch), so `EpochRecords.add`
only queues them: one background thread writes them in the order they were added, the MLflow calls
retrying within the tracking client's budget (``records.client.with_retries``). Keys and their order are
the metrics dict's as the loop made it, minus ``epoch`` (the MLflow step). A write that fails stops the
writing; its exception is raised in the training thread at the next `add` or at `flush`, the original
exception, so the trial ends as it did when the write failed in the loop (a full disk is a storage fault
with the same line). `flush` waits for every queued write: the worker calls it before it closes a member.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from records import tables, tracking


class EpochRecords:
    """`histories`: trial id -> epoch rows so far; `logged`: trial id -> MLflow steps already
    logged (an earlier attempt's), both the caller's dicts, updated here in the training thread."""

    def __init__(self, results: str, study: str, mlflow_uri: str, run_ids: Mapping[str, str],
                 histories: dict[str, list[dict[str, Any]]], logged: dict[str, set[int]]):
        self.results, self.study, self.mlflow_uri, self.run_ids = results, study, mlflow_uri, run_ids
        self.histories, self.logged = histories, logged
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitsweep-records")
        self._queued: list[Future] = []
        self._failure: BaseException | None = None

    def add(self, trial_id: str, metrics: dict[str, Any]) -> None:
        """Queue one member's epoch; raises the failure of an earlier write, if any."""
        self._raise_failure()
        epoch = metrics["epoch"]
        # An epoch trained again (a retry from an older checkpoint) replaces its row.
        self.histories[trial_id] = [h for h in self.histories[trial_id] if h["epoch"] < epoch] + [metrics]
        log = epoch not in self.logged[trial_id]
        self.logged[trial_id].add(epoch)
        self._queued = [f for f in self._queued if not f.done()]
        self._queued.append(self._writer.submit(self._write, trial_id, list(self.histories[trial_id]),
                                                dict(metrics) if log else None))

    def _write(self, trial_id: str, rows: list[dict[str, Any]], metrics: dict[str, Any] | None) -> None:
        if self._failure is not None:  # the trial is ending: nothing after a failed write
            return
        try:
            tables.write_epochs(self.results, self.study, trial_id, rows)
            if metrics is not None:
                tracking.log_epoch_metrics(self.mlflow_uri, self.run_ids[trial_id],
                                           {k: v for k, v in metrics.items() if k != "epoch"}, metrics["epoch"])
        except BaseException as exc:  # noqa: BLE001 - raised in the training thread
            self._failure = exc

    def flush(self, *, quiet: bool = False) -> None:
        """Wait for every queued write; raise the first failure unless `quiet` (another error is on its way)."""
        for future in self._queued:
            future.result()
        self._queued = []
        if not quiet:
            self._raise_failure()

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure
