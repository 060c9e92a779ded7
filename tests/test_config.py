"""RunConfig: flat round trip, overrides, trial ids."""

import dataclasses
import pickle

import pytest

from trainables.config.run_config import RunConfig


def cfg(**overrides):
    return RunConfig.for_dataset("shapes", preset="tiny", **overrides)


def test_flat_round_trip_keeps_every_field():
    c = cfg(pe="rope2d", rpt=True, cutmix=True, lr=3e-4)
    flat = c.to_flat()
    assert flat["pe"] == "rope2d" and flat["protocol"] == "cutmix" and flat["depth"] == 2
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
    assert RunConfig.from_flat(flat) == c


def test_model_fits_the_dataset():
    c = cfg()
    assert (c.model.img_size, c.model.patch_size, c.model.grid) == (32, 4, 8)
    assert c.model.num_classes == 10


def test_overrides_take_typed_values_and_refuse_strings_for_other_types():
    c = cfg().with_overrides({"lr": 5e-4, "depth": 3, "rpt": True, "protocol": "modern"})
    assert c.lr == 5e-4 and c.model.depth == 3 and c.rpt is True
    assert (c.autoaugment, c.cutmix, c.label_smoothing) == (True, True, True)
    # The command line's strings are typed at its edge (sweeps.launch.validate): one reaching here is refused.
    for key, text in (("lr", "5e-4"), ("depth", "3"), ("rpt", "false"), ("lr", True)):
        with pytest.raises(ValueError, match=f"^{key} must be .*, got {text!r}"):
            cfg().with_overrides({key: text})


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"lr_max": "1"}, "unknown run-config field 'lr_max'.*valid fields"),
        ({"optimizer": "sgd"}, "optimizer must be one of .*'adamw'.*got 'sgd'"),
        ({"pe": "rope3d"}, "rope3d"),
        ({"rpt": "maybe"}, r"rpt must be a boolean \(true/false\), got 'maybe'"),
        ({"protocol": "fancy"}, "fancy"),
        ({"epochs": "0"}, "epochs must be an integer >= 1"),
    ],
)
def test_bad_values_name_the_value_and_the_choices(overrides, match):
    with pytest.raises(ValueError, match=match):
        cfg().with_overrides(overrides)


def test_trial_id_is_stable_readable_and_ignores_where_it_runs():
    a = cfg(pe="ape", rpt=True, cutmix=True, seed=3)
    assert a.trial_id.startswith("shapes-ape-rpt-cutmix-s3-")
    assert a.trial_id == cfg(pe="ape", rpt=True, cutmix=True, seed=3).trial_id
    assert a.trial_id == cfg(pe="ape", rpt=True, cutmix=True, seed=3, data_root="/elsewhere").trial_id
    assert a.trial_id != cfg(pe="ape", rpt=True, cutmix=True, seed=3, lr=2e-3).trial_id


def test_from_flat_rejects_a_protocol_that_contradicts_the_switches():
    flat = cfg().to_flat()
    flat["protocol"] = "cutmix"
    with pytest.raises(ValueError, match="contradicts"):
        RunConfig.from_flat(flat)


# The demo's trial ids since test-scored runs train on the whole training split (holdout_fraction 0, #22;
# the ids before it ended ac367655, d30c279c, 7e6d7e96, 3d4ca14f): fields added later at their default
# (cutmix_prob, compile, crop_padding) leave them, and results stored under them, in place.
DEMO_IDS = ["shapes-none-baseline-s0-2a3aebc3", "shapes-none-cutmix-s0-6fe3f095",
            "shapes-ape-baseline-s0-3bff9c7e", "shapes-ape-cutmix-s0-d29b888d"]


def test_fields_added_at_their_default_leave_existing_ids_unchanged():
    from sweeps.studies import demo

    trials = demo.trials(demo.DEFAULTS)
    assert [t.trial_id for t in trials] == DEMO_IDS
    base = trials[1]
    # A later field enters the id only away from its default; execution fields never do.
    assert base.with_overrides({"cutmix_prob": 0.5}).trial_id != base.trial_id
    assert base.with_overrides({"cutmix_prob": 1.0}).trial_id == base.trial_id
    assert base.with_overrides({"crop_padding": 4}).trial_id != base.trial_id
    assert base.with_overrides({"crop_padding": 0}).trial_id == base.trial_id
    for execution in ({"compile": True}, {"num_workers": 3}, {"device": "cpu"}):
        assert base.with_overrides(execution).trial_id == base.trial_id, execution
    with pytest.raises(ValueError, match="cutmix_prob must be a finite number >= 0 and <= 1, got 1.5"):
        base.with_overrides({"cutmix_prob": 1.5})


def test_a_test_scored_run_has_no_holdout_and_a_tuning_run_keeps_it():
    assert cfg().holdout_fraction == 0.0
    assert cfg(holdout_fraction=0.1).holdout_fraction == 0.0  # the holdout would score nothing
    tuning = cfg(eval_split="holdout")
    assert tuning.holdout_fraction == 0.05 and cfg(eval_split="holdout", holdout_fraction=0.1).holdout_fraction == 0.1
    assert RunConfig.from_flat(tuning.to_flat()) == tuning
    # Moving a run from tuning to test scoring changes what it trains on: a new trial id.
    assert tuning.with_overrides({"eval_split": "test"}).trial_id != tuning.trial_id


def test_crop_padding_reaches_the_augmentation_and_rejects_negatives():
    from trainables.data.augment import augmentation

    assert augmentation("baseline", "tinyimagenet", 64).padding == 8  # default: img_size // 8
    assert augmentation("baseline", "tinyimagenet", 64, cfg(crop_padding=4).crop_padding).padding == 4
    with pytest.raises(ValueError, match="crop_padding must be an integer >= 0, got -1"):
        cfg(crop_padding=-1)


def test_the_training_loop_augments_with_the_configs_crop_padding(tmp_path, monkeypatch):
    """One short epoch: the loop's training sources get crop_padding from the run config (alone and packed)."""
    from trainables.data import augment
    from trainables.loop import train as loop

    built = []

    def spy(*args, **kwargs):
        spec = augment.augmentation(*args, **kwargs)
        built.append(spec.padding)
        return spec

    monkeypatch.setattr(loop, "augmentation", spy)
    c = cfg(crop_padding=1, max_train_images=64, batch_size=32, epochs=1, warmup_epochs=0)
    loop.train(c, tmp_path, log=lambda *_: None)
    assert built and set(built) == {1}  # img_size // 8 would be 4 at 32 px


def test_a_swept_field_enters_the_readable_id_and_nothing_else_changes():
    plain = RunConfig(lr=5e-4)
    swept = plain.with_overrides({"swept": "lr,protocol"})
    assert swept.trial_id == plain.trial_id.replace("-baseline-", "-baseline-lr0.0005-")  # same digest
    assert RunConfig.from_flat(swept.to_flat()).trial_id == swept.trial_id  # survives the trip to a worker
    assert "swept" not in RunConfig().to_flat() and swept.to_flat()["swept"] == "lr,protocol"
    assert "-optimizer_adam-" in RunConfig().with_overrides({"swept": "optimizer", "optimizer": "adam"}).trial_id


def test_a_trial_id_follows_every_changed_field():
    a = cfg(pe="ape", seed=3)
    assert a.trial_id == a.trial_id  # asked twice: the same id
    for b in (dataclasses.replace(a, seed=4), dataclasses.replace(a, lr=2e-3), a.with_overrides({"pe": "none"}),
              dataclasses.replace(a, model=dataclasses.replace(a.model, depth=a.model.depth + 1))):
        assert b.trial_id != a.trial_id and b.trial_id == RunConfig.from_flat(b.to_flat()).trial_id
    assert pickle.loads(pickle.dumps(a)).trial_id == a.trial_id == RunConfig.from_flat(a.to_flat()).trial_id
