"""Faults without Ray: corrupt checkpoints are named, not just skipped."""

import pytest
import torch

from trainables.config import RunConfig
from trainables.train import CorruptCheckpointError, load_model
from trainables.vit import ViT


@pytest.fixture()
def checkpoint(tmp_path):
    cfg = RunConfig.for_dataset("shapes", preset="tiny", epochs=1, warmup_epochs=0)
    path = tmp_path / "state.pt"
    torch.save({"model": ViT(cfg.model).state_dict(), "config": cfg.to_flat(), "epoch": 1}, path)
    return path


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "not_a_checkpoint"])
def test_a_corrupt_checkpoint_is_named_with_its_path(checkpoint, damage):
    data = checkpoint.read_bytes()
    if damage == "truncate":
        checkpoint.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        checkpoint.write_bytes(b"\x00garbage" * 64)
    elif damage == "empty":
        checkpoint.write_bytes(b"")
    else:
        torch.save({"weights": 1}, checkpoint)
    with pytest.raises(CorruptCheckpointError, match=rf"^checkpoint file {checkpoint} is corrupt \(truncated, or not"):
        load_model(checkpoint)
    with pytest.raises(CorruptCheckpointError, match=r"^checkpoint file s3://b/state.pt is corrupt"):
        load_model(checkpoint, name="s3://b/state.pt")  # a downloaded copy is called by its URI


def test_the_analysis_status_of_a_corrupt_checkpoint_names_its_path(checkpoint, tmp_path):
    from analysis.job import Measurer

    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    measurer = Measurer(str(tmp_path / "results"), "demo", None, eval_size=8, batch_size=8, threads=1)
    out = measurer({"trial_id": ["t"], "epoch": [4], "path": [str(checkpoint)], "dataset": ["shapes"],
                    "data_root": [str(tmp_path)]})
    status = str(out["status"][0])
    assert status.startswith(f"error: CorruptCheckpointError: checkpoint file {checkpoint} is corrupt"), status
    assert str(out["path"][0]) == str(checkpoint) and int(out["rows"][0]) == 0


def test_a_good_checkpoint_still_loads(checkpoint):
    model, cfg, epoch = load_model(checkpoint)
    assert epoch == 1 and cfg.dataset == "shapes" and isinstance(model, ViT)
