"""A new PE is one subclass plus one registry entry: defined only here, it trains, is measured with its alpha
rows, and reaches the report's per-trial data in the registry's order (CPU, tiny preset, one epoch)."""

from __future__ import annotations

import pandas as pd
import torch

from analysis.measuring.evaluate import evaluate_checkpoint
from analysis.statistics.labels import model_key
from analysis.statistics.study_data import StudyData
from trainables.loop.checkpoints import load_model, local_snapshots
from trainables.loop.train import train
from trainables.model import pos_embed
from trainables.config.run_config import RunConfig


class ScaledAbsolute(pos_embed.LearnedAbsolute):
    """A learned table at half strength: an additive PE the analysis scales like `ape`."""

    alpha_scaling = "pe_scale"

    def additive(self, pe_scale: float = 1.0) -> torch.Tensor:
        return super().additive(pe_scale * 0.5)


def test_a_pe_defined_in_a_test_trains_is_measured_and_reported(monkeypatch, tmp_path):
    monkeypatch.setitem(pos_embed.POS_EMBEDS, "ape_half", ScaledAbsolute)
    cfg = RunConfig.for_dataset("shapes", preset="tiny", pe="ape_half", epochs=1, warmup_epochs=0,
                                max_train_images=128, batch_size=32)
    final = train(cfg, tmp_path, log=lambda *_: None)
    assert final["error"] is None and 0.0 <= final["test_acc"] <= 1.0

    model, loaded, _ = load_model(local_snapshots(tmp_path)[-1])
    assert loaded.pe == "ape_half" and isinstance(model.pe, ScaledAbsolute)
    size = model.config.img_size
    images = torch.randint(0, 256, (16, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    rows = evaluate_checkpoint(model, images, torch.arange(16) % 2, mean=(0.5,) * 3, std=(0.25,) * 3,
                               grid=model.config.grid, batch_size=16, alphas=(0.0, 0.5, 1.0),
                               jpeg_levels=(), blur_levels=())
    scaled = {r["level"] for r in rows if r["intervention"] == "pe_scale" and r["metric"] == "acc"}
    assert scaled == {0.0, 0.5, 1.0} and not any(r["intervention"] == "rope_scale" for r in rows)

    trials = pd.DataFrame({"trial_id": ["t0", "t1"], "dataset": "shapes", "pe": ["ape_half", "ape"], "rpt": False,
                           "protocol": "baseline", "seed": 0, "status": "finished", "test_acc": final["test_acc"]})
    measured = pd.DataFrame([{"trial_id": t, **r} for t in ("t0", "t1") for r in rows]).assign(checkpoint_epoch=1)
    data = StudyData.from_frames("s", trials, pd.DataFrame(), measured)
    assert set(data.per_trial["pe"]) == {"ape_half", "ape"}
    assert set(data.select("pe_scale", "acc")["pe"]) == {"ape_half", "ape"}
    # Ordered after the names the torch-free vocabulary knows, never dropped.
    assert sorted(["ape_half", "none", "ape"], key=lambda pe: model_key(pe, False)) == ["none", "ape", "ape_half"]
