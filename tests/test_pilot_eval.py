"""What the pilot's scale rests on: each epoch scored on a fixed stratified subset of the test split and
the last on the whole split (the epochs table says on how many), and one analysis actor per core."""

import pyarrow.parquet as pq
import pytest
import torch

from analysis.measuring.job import pool_size
from records import tables
from trainables.data.images import TensorImages
from trainables.data.inputs import EpochEval
from trainables.loop.train import train
from trainables.config.run_config import RunConfig


def _split(n: int = 200, classes: int = 10) -> TensorImages:
    labels = torch.arange(n) % classes
    images = (torch.arange(n, dtype=torch.uint8)[:, None, None, None] + torch.zeros(1, 3, 8, 8, dtype=torch.uint8))
    return TensorImages(images, labels)


def test_epoch_eval_scores_a_fixed_stratified_subset_then_the_whole_split():
    split = _split()
    at = EpochEval(split, 50, 8, device="cpu")
    first, middle, last = at.source(1, 3), at.source(2, 3), at.source(3, 3)
    assert first is middle and len(first.split) == 50  # the same images every epoch
    assert torch.bincount(first.split.labels, minlength=10).tolist() == [5] * 10  # every class in its share
    assert last is at.whole and len(last.split) == 200
    # Another trial draws the same subset (a function of the labels only).
    again = EpochEval(split, 50, 8, device="cpu").source(1, 3)
    assert torch.equal(again.split.images, first.split.images)


@pytest.mark.parametrize("images", [0, 200, 500])
def test_epoch_eval_zero_or_a_subset_as_large_as_the_split_scores_the_whole_split(images):
    at = EpochEval(_split(), images, 8, device="cpu")
    assert at.source(1, 3) is at.whole


def test_epoch_eval_images_must_not_be_negative():
    with pytest.raises(ValueError, match="epoch_eval_images must be an integer >= 0, got -1"):
        RunConfig.for_dataset("shapes", preset="tiny", epoch_eval_images=-1)


def test_training_records_how_many_images_each_epoch_was_scored_on(tmp_path):
    cfg = RunConfig.for_dataset("shapes", preset="tiny", max_train_images=128, batch_size=64, epochs=2, warmup_epochs=0,
                                epoch_eval_images=40, device="cpu")
    rows = []
    final = train(cfg, tmp_path / "w", report=lambda metrics, _: rows.append(metrics), log=lambda *_: None)
    assert [r["eval_images"] for r in rows] == [40, 2000]  # shapes' test split: 2,000 images
    assert final["test_acc"] == rows[-1]["eval_acc"]  # the final score is the whole split's
    tables.write_epochs(str(tmp_path / "results"), "s", cfg.trial_id, rows)
    stored = pq.read_table(tables.table_path(str(tmp_path / "results"), "s", "epochs"))
    assert stored.column("eval_images").to_pylist() == [40, 2000]


@pytest.mark.parametrize("cpus, actors, cpu_each", [(2, 2, 0.5), (1, 1, 0.5), (16, 16, 15 / 16), (4.0, 4, 0.75)])
def test_analysis_pool_holds_one_actor_per_core_and_leaves_a_cpu_unreserved(cpus, actors, cpu_each):
    got = pool_size(cpus, 0.0, None, 1.0)
    assert got == (actors, pytest.approx(cpu_each), 0.0)
    assert got[0] * got[1] <= max(0.5, cpus - 1)  # Ray Data's own tasks keep a CPU


def test_analysis_pool_cap_and_gpu_pools_are_unchanged():
    assert pool_size(16, 0.0, 3, 1.0)[0] == 3  # --actors caps it
    assert pool_size(8, 2.0, None, 1.0) == (2, 2.0, 1.0)  # one actor per GPU, CPUs shared among them
    assert pool_size(8, 2.0, None, 0.0)[2] == 0.0  # --gpus-per-actor 0: CPU actors
