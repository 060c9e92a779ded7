"""Pack key and grouping in the launcher: which trials of a study train together (--pack, --dry-run)."""

import json
from collections import Counter

import pytest

from sweeps import run as launcher
from sweeps.launch import options
from sweeps.launch.packs import form_packs, pack_of, pack_size


def _args(*argv):
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args([*argv, "--dry-run"])


def packs(*argv):
    args = _args(*argv)
    return options.build_packs(args, options.build_trials(args))


def sizes_by_dataset(found):
    out = {}
    for p in found:
        assert len({c.dataset for c in p.members}) == 1
        out.setdefault(p.members[0].dataset, []).append(len(p.members))
    return out


def test_study_l_packs_of_eight():
    found = packs("study_l", "--seeds", "5", "--pack", "8")
    assert len(found) == 9
    assert sizes_by_dataset(found) == {"cifar10": [8, 2], "tinyimagenet": [8, 2], "cifar100": [8] * 5}
    members = [t for p in found for t in p.trial_ids]
    assert len(members) == len(set(members)) == 60  # every trial in exactly one pack
    for p in found:  # within a pack only the free fields differ
        assert len({c.lr for c in p.members}) == 1 and len({c.model for c in p.members}) == 1


@pytest.mark.parametrize(
    "argv, count",
    [
        (["study_l", "--seeds", "5", "--pack", "1"], 60),
        (["study_l", "--seeds", "5"], 60),  # no GPU per trial: default K = 1
        (["study_l", "--seeds", "5", "--gpus-per-trial", "0.5"], 9),  # GPUs: default K = 8
        (["study_l", "--seeds", "5", "--pack", "8", "--workers-per-trial", "2"], 60),  # DDP trains alone
        (["study_p", "--pack", "8"], 35),  # dropout and drop path
        (["study_l", "--seeds", "5", "--preset", "vit_s", "--pack", "8"], 60),
        (["hparam", "--pack", "8"], 1),
        (["factorial", "--datasets", "cifar100", "--seeds", "1", "--pack", "8"], 7),  # one per PE x order
    ],
)
def test_pack_counts(argv, count):
    assert len(packs(*argv)) == count


def test_trials_resuming_from_different_epochs_never_share_a_pack():
    configs = options.build_trials(_args("study_l", "--seeds", "5", "--datasets", "cifar10"))
    assert len(form_packs(configs, 8)) == 2
    resumed = form_packs(configs, 8, resume_epochs={configs[0].trial_id: 3, configs[1].trial_id: 3})
    assert sorted(len(p.members) for p in resumed) == [2, 8]
    assert {configs[0].trial_id, configs[1].trial_id} in [set(p.trial_ids) for p in resumed]


def test_compiled_trials_pack_with_compiled_trials_only():
    """A pack's vmapped forward compiles (trainables/model/compiled.py): compile=True trials pack; `compile`
    is in the pack key, so they never share a pack with eager trials."""
    configs = options.build_trials(_args("study_l", "--seeds", "5", "--datasets", "cifar10"))
    compiled = [c.with_overrides({"compile": True}) for c in configs[:6]]
    found = form_packs(compiled + configs[6:], 8)
    assert sorted(len(p.members) for p in found) == [4, 6]
    assert all(len({c.compile for c in p.members}) == 1 for p in found)


def test_a_single_trial_pack_keeps_its_trial_id_and_bad_sizes_fail():
    found = packs("demo")
    assert [p.pack_id for p in found] == [p.members[0].trial_id for p in found]
    with pytest.raises(ValueError, match="--pack must be >= 1"):
        pack_size(0, 0.0)


def test_dry_run_prints_packs_and_json_gives_every_trial_its_pack(capsys):
    argv = ("study_l", "--seeds", "5", "--pack", "8")
    assert launcher.run(_args(*argv)) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert "60 trials in 9 packs (sizes 8, 2)" in lines[0] and lines[2].split() == ["trial_id", "pack"]
    assert launcher.run(_args(*argv, "--json")) == 0
    trials = json.loads(capsys.readouterr().out)
    assert len(trials) == 60 and Counter(Counter(t["pack"] for t in trials).values()) == {8: 7, 2: 2}
    assert pack_of(packs("study_l", "--seeds", "5", "--pack", "8")) == {t["trial_id"]: t["pack"] for t in trials}


def test_resume_epochs_are_the_checkpoints_not_the_epochs_table(tmp_path):
    """With throttled checkpoints (checkpoint_interval_s) the epochs table runs ahead: packs re-form by
    the epoch each member's checkpoint holds, recorded beside it (or inside an earlier version's
    Train checkpoint of a lone trial)."""
    import torch

    from records import files, layout, tables
    from sweeps.launch.packs import resume_epochs
    from trainables.loop import checkpoints

    results, storage = str(tmp_path / "results"), str(tmp_path / "storage")
    for trial_id, ran in (("a", 5), ("b", 5), ("c", 2), ("d", 1)):
        tables.write_epochs(results, "demo", trial_id, [{"epoch": e, "train_loss": 1.0} for e in range(1, ran + 1)])
    files.write_json(checkpoints.epoch_file(layout.checkpoint_dir(storage, "demo", "a")), {"epoch": 3})
    files.write_json(checkpoints.epoch_file(layout.checkpoint_dir(storage, "demo", "b")), {"epoch": 3})
    legacy = f"{checkpoints.legacy_train_dir(storage, 'demo', 'c')}/checkpoint_2026-01-01_00-00-00.000000"
    checkpoints.save({"epoch": 2, "model": {"w": torch.zeros(1)}}, checkpoints.checkpoint_file(legacy))
    # "d" ran an epoch but never wrote a checkpoint: a fresh start, packed with the never-started "e"
    assert resume_epochs(results, "demo", storage) == {"a": 3, "b": 3, "c": 2}
    assert resume_epochs(results, "demo", storage, ["a", "c"]) == {"a": 3, "c": 2}
    assert checkpoints.find_stored(storage, "demo", "c") == checkpoints.checkpoint_file(legacy)
    assert checkpoints.find_stored(storage, "demo", "d") is None
