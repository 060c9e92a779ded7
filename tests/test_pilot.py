"""The pilot study's shape: grid, counts, conditions and recipe (nothing measured; docs/pilot/ holds the numbers).
~3 s: dry runs only."""

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sweeps import run as launcher
from sweeps.launch import options
from sweeps.studies import STUDIES, pilot
from sweeps.studies.study_l import LEE_RECIPE

CLASSES = tuple(f"class{k}" for k in range(10))


def _folder(root: Path, size: int = 32) -> Path:
    """A train/<class>/, test/<class>/ layout of a few random PNGs, as a user's DIR would hold."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in CLASSES:
            (root / split / c).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                    root / split / c / f"{i}.png")
    return root


def dry(*argv):
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    return options.build_trials(parser.parse_args([*argv, "--dry-run"]))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return _folder(tmp_path_factory.mktemp("pilot_data"))


def test_pilot_is_a_registered_study():
    assert "pilot" in STUDIES


def test_pilot_plans_five_seeds_of_baseline_and_cutmix_on_every_batch_on_the_whole_training_split(root):
    configs = dry("pilot", "--data-root", str(root))
    assert len(configs) == 10 == len({c.trial_id for c in configs})
    cells = {(c.model.pe, c.rpt, c.protocol.name) for c in configs}
    assert cells == {("ape", False, "baseline"), ("ape", False, "cutmix")}  # Study P's models left the pilot
    # CutMix mixes every batch of its arm (an amplifier of Study L's mechanism; Lee's recipe mixes half).
    assert {c.cutmix_prob for c in configs if c.cutmix} == {1.0} and LEE_RECIPE["cutmix_prob"] == 0.5
    assert [c.cutmix for c in configs].count(True) == 5
    for cell in cells:  # >= 3 seeds of >= 2 protocols; 5: the fewest at which a directional claim can decide
        assert sorted(c.seed for c in configs if (c.model.pe, c.rpt, c.protocol.name) == cell) == [0, 1, 2, 3, 4]
    assert {c.max_train_images for c in configs} == {0}  # the whole training split, no cap
    # Each epoch scores a fixed subset of the test split, the last the whole split.
    assert {c.epoch_eval_images for c in configs} == {pilot.EPOCH_EVAL_IMAGES} and 0 < pilot.EPOCH_EVAL_IMAGES
    # The docstring's launch line states the count the dry run shows.
    assert re.search(r"2 conditions x 5 seeds = 10 trials", pilot.__doc__)


def test_pilot_one_recipe_lees_for_every_condition(root):
    configs = dry("pilot", "--data-root", str(root))
    for c in configs:
        assert c.study == "pilot" and c.dataset == "folder" and c.data_root == str(root)
        assert (c.decay_exempt, c.crop_padding) == (LEE_RECIPE["decay_exempt"], LEE_RECIPE["crop_padding"])
        assert (c.optimizer, c.lr, c.weight_decay, c.batch_size, c.schedule) == ("adamw", 1e-3, 0.05, 128, "cosine")
        assert c.epochs == pilot.EPOCHS and 1 == c.warmup_epochs < c.epochs
        m = c.model
        assert (m.dim, m.depth, m.heads) == (pilot.MODEL["dim"], pilot.MODEL["depth"], pilot.MODEL["heads"])
        assert (m.dim, m.depth, m.heads) == (64, 4, 4)  # the measured model
        # Classes and grid come from the folder: 10 classes, 32 px / patch 4 -> Study L's 8x8 grid.
        assert (m.num_classes, m.img_size, m.patch_size) == (10, 32, 4)


def test_pilot_measures_every_snapshot_on_the_same_thousand_test_images():
    from sweeps.studies.study import of
    from trainables.loop.train import snapshot_epochs

    study = of("pilot")  # the hooks as the launcher reads them
    assert (study.checkpoints, study.eval_size) == ("all", 1000) == ("all", pilot.EPOCH_EVAL_IMAGES)
    epochs = snapshot_epochs(pilot.EPOCHS)  # epoch 0, about halfway, the last (and the log-spaced ones between)
    assert epochs[0] == 0 and epochs[-1] == pilot.EPOCHS and any(abs(e - pilot.EPOCHS / 2) <= 1 for e in epochs)
    assert 8 <= pilot.EPOCHS <= 12  # the range; the docstring's sizing says which one fits
    assert re.search(rf"EPOCHS`` = {pilot.EPOCHS}\b", pilot.__doc__)


def test_pilot_user_overrides_still_win(root):
    configs = dry("pilot", "--data-root", str(root), "--seeds", "1", "--epochs", "2", "--set", "max_train_images=100")
    assert len(configs) == 2
    assert {(c.epochs, c.max_train_images, c.warmup_epochs <= 2) for c in configs} == {(2, 100, True)}


def test_pilot_without_its_folder_names_the_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nowhere"))):
        dry("pilot", "--data-root", str(tmp_path / "nowhere"))
