"""A pack's per-epoch records leave the training thread (`trainables.trial.epoch_records`): `add` returns
while the Parquet and MLflow writes block, every row lands once and in order once they go on, and a
failed write reaches the training thread as the very exception the loop used to raise."""

from __future__ import annotations

import errno
import threading

import pytest

from records import tracking
from trainables.trial import epoch_records
from trainables.trial.epoch_records import EpochRecords


def metrics(epoch: int, loss: float) -> dict:
    return {"epoch": epoch, "train_loss": loss, "train_acc": 0.5, "eval_loss": loss, "eval_acc": 0.25,
            "lr": 1e-3, "images_per_s": 100.0, "wall_time_s": float(epoch)}


class BlockingStores:
    """Table and tracking stubs that block until the test releases them, recording what lands."""

    def __init__(self, fail: BaseException | None = None):
        self.release = threading.Event()
        self.writes: list[tuple] = []
        self.fail = fail

    def write_epochs(self, results, study, trial_id, rows):
        self.release.wait(timeout=30)
        if self.fail is not None:
            raise self.fail
        self.writes.append(("epochs", trial_id, [r["epoch"] for r in rows]))

    def log_metrics(self, uri, run_id, values, step):
        self.release.wait(timeout=30)
        self.writes.append(("mlflow", run_id, step, list(values)))


@pytest.fixture
def stores(monkeypatch):
    stub = BlockingStores()
    monkeypatch.setattr(epoch_records.tables, "write_epochs", stub.write_epochs)
    monkeypatch.setattr(epoch_records.tracking, "log_metrics", stub.log_metrics)
    return stub


def test_report_returns_while_the_writes_block_and_every_row_lands_once_in_order(stores):
    histories = {"a": [], "b": [metrics(1, 9.0)]}  # b resumed: epoch 1 is in its history and logged
    records = EpochRecords("results", "demo", "uri", {"a": "run-a", "b": "run-b"}, histories, {"a": set(), "b": {1}})
    for epoch in (1, 2):
        for trial_id in ("a", "b"):
            records.add(trial_id, metrics(epoch, 3.0 - epoch))  # returns although nothing is written yet
    records.add("a", metrics(2, 0.5))  # epoch 2 trained again (a retry): its row replaced, its step not resent
    assert stores.writes == [] and histories["a"][-1]["train_loss"] == 0.5
    stores.release.set()
    records.flush()
    keys = [tracking.epoch_key(k) for k in  # today's order, under the epochs/ chart section
            ("train_loss", "train_acc", "eval_loss", "eval_acc", "lr", "images_per_s", "wall_time_s")]
    assert stores.writes == [
        ("epochs", "a", [1]), ("mlflow", "run-a", 1, keys),
        ("epochs", "b", [1]),  # b's epoch 1 again: its row replaced, its MLflow step not logged twice
        ("epochs", "a", [1, 2]), ("mlflow", "run-a", 2, keys),
        ("epochs", "b", [1, 2]), ("mlflow", "run-b", 2, keys),
        ("epochs", "a", [1, 2]),
    ]
    records.close()


def test_a_failed_write_reaches_the_training_thread_as_raised(monkeypatch):
    full = OSError(errno.ENOSPC, "No space left on device")
    stub = BlockingStores(fail=full)
    monkeypatch.setattr(epoch_records.tables, "write_epochs", stub.write_epochs)
    monkeypatch.setattr(epoch_records.tracking, "log_metrics", stub.log_metrics)
    records = EpochRecords("results", "demo", "uri", {"a": "run-a"}, {"a": []}, {"a": set()})
    records.add("a", metrics(1, 1.0))
    stub.release.set()
    with pytest.raises(OSError) as raised:
        records.flush()
    assert raised.value is full  # the launcher's storage-fault line classifies this very exception
    with pytest.raises(OSError):
        records.add("a", metrics(2, 1.0))  # the next epoch's report raises it too: the trial ends
    records.flush(quiet=True)
    assert stub.writes == []
    records.close()
