"""A new data set is one row (`DATASET_SPECS`) and one loader (a function and its line in `formats.LOADERS`):
with exactly those two edits the launcher's pre-torch checks take its name, a run config fits its model to
it and the data loads. A row without a loader, or a loader without a row, is refused naming it. A new
preset is one row of `PRESETS`. No Ray."""

from __future__ import annotations

import argparse

import pytest

from sweeps.launch import validate
from trainables.config.architecture import PRESETS
from trainables.config.data_roots import DATASET_SPECS, DataSpec
from trainables.config.run_config import RunConfig
from trainables.data import datasets, formats, shapes
from trainables.data.images import TensorImages, channel_stats

ROW = DataSpec("a few procedural shapes (a test's data set)", 10, 32, 60, 20)


def load_few_shapes(root, *, img_size, download) -> formats.Loaded:
    size = img_size or ROW.img_size
    train = shapes.make_shapes(ROW.train_images, img_size=size, seed=1)
    test = shapes.make_shapes(ROW.test_images, img_size=size, seed=2)
    return formats.Loaded(shapes.CLASSES, TensorImages(*train), TensorImages(*test), size, *channel_stats(train[0]))


@pytest.fixture
def few_shapes(monkeypatch):
    monkeypatch.delenv(datasets.SHARED_ENV, raising=False)  # this process's own copy, not a node's
    monkeypatch.setitem(DATASET_SPECS, "few_shapes", ROW)  # edit 1: its row
    monkeypatch.setitem(formats.LOADERS, "few_shapes", load_few_shapes)  # edit 2: its loader's line
    return "few_shapes"


def test_a_new_data_set_is_one_row_and_one_loader(few_shapes, tmp_path):
    validate.check_names(argparse.Namespace(datasets=f"cifar10,{few_shapes}", preset="tiny"))  # before torch
    assert validate.check_value("dataset", few_shapes) == few_shapes  # --set dataset=few_shapes
    cfg = RunConfig.for_dataset(few_shapes, preset="tiny", epochs=1, warmup_epochs=0, data_root=str(tmp_path))
    assert (cfg.dataset, cfg.model.img_size, cfg.model.patch_size, cfg.model.num_classes) == (few_shapes, 32, 4, 10)
    assert cfg.trial_id.startswith(f"{few_shapes}-ape-baseline-s0-")
    data = datasets.load_dataset(few_shapes, tmp_path, holdout_fraction=0.1)
    assert (len(data.train), len(data.holdout), len(data.test)) == (54, 6, 20)
    assert data.train[0][0].shape == (3, 32, 32) and data.num_classes == 10 and data.patch_size == 4


def test_a_row_without_a_loader_or_a_loader_without_a_row_is_refused_by_name(few_shapes, monkeypatch, tmp_path):
    monkeypatch.setitem(DATASET_SPECS, "rowonly", ROW)
    with pytest.raises(ValueError, match="data set 'rowonly' has a row in DATASET_SPECS but no loader"):
        datasets.load_dataset("rowonly", tmp_path)
    monkeypatch.delitem(DATASET_SPECS, "rowonly")
    monkeypatch.setitem(formats.LOADERS, "loaderonly", load_few_shapes)
    with pytest.raises(ValueError, match="data set 'loaderonly' has a loader in LOADERS but no row"):
        formats.check_loaders()
    with pytest.raises(ValueError, match="unknown data set 'loaderonly'"):  # and no launch takes its name
        validate.check_names(argparse.Namespace(datasets="loaderonly", preset=None))


def test_a_new_preset_is_one_row(monkeypatch):
    monkeypatch.setitem(PRESETS, "tinier", {**PRESETS["tiny"], "dim": 32, "heads": 2})  # the one edit
    validate.check_names(argparse.Namespace(datasets=None, preset="tinier"))  # --preset tinier, before torch
    assert validate.check_value("preset", "tinier") == "tinier"  # --set preset=tinier
    cfg = RunConfig.for_dataset("cifar10", preset="tinier")
    assert (cfg.preset, cfg.model.dim, cfg.model.heads, cfg.model.depth) == ("tinier", 32, 2, PRESETS["tiny"]["depth"])
