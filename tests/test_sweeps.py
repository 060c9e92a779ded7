"""Study files and the launcher's checks: counts, dry runs, errors before Ray starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import run as launcher
from sweeps.launch import options

ROOT = Path(__file__).resolve().parent.parent


def dry(*argv):
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    return options.build_trials(parser.parse_args([*argv, "--dry-run"]))


@pytest.mark.parametrize(
    "argv, count",
    [
        (["study_l"], 60),
        (["study_l", "--seeds", "1"], 12),
        (["study_p"], 35),
        (["factorial", "--datasets", "cifar100", "--seeds", "1"], 56),
        (["factorial", "--datasets", "cifar100,tinyimagenet", "--seeds", "2"], 224),
        (["factorial", "--datasets", "cifar100", "--seeds", "1", "--include-none-rpt"], 64),
        (["demo"], 4),
    ],
)
def test_trial_counts(argv, count):
    configs = dry(*argv)
    assert len(configs) == count
    assert len({c.trial_id for c in configs}) == count


def test_study_l_conditions_and_recipe():
    configs = dry("study_l", "--seeds", "1")
    by_dataset = {}
    for c in configs:
        by_dataset.setdefault(c.dataset, set()).add(c.protocol.name)
    assert by_dataset["cifar10"] == by_dataset["tinyimagenet"] == {"baseline", "autoaugment+cutmix+label_smoothing"}
    assert len(by_dataset["cifar100"]) == 8
    c = configs[0]
    assert (c.model.depth, c.model.dim, c.model.heads, c.model.mlp_ratio, c.model.grid) == (8, 192, 8, 2.0, 8)
    assert (c.optimizer, c.lr, c.weight_decay, c.batch_size, c.epochs, c.warmup_epochs) == (
        "adamw", 1e-3, 0.05, 128, 100, 10)
    tiny = next(c for c in configs if c.dataset == "tinyimagenet")
    assert (tiny.model.img_size, tiny.model.patch_size, tiny.model.num_classes) == (64, 8, 200)


@pytest.mark.parametrize("argv", [("study_l", "--seeds", "1"),
                                  ("factorial", "--datasets", "cifar10,tinyimagenet", "--seeds", "1")])
def test_study_l_and_factorial_follow_lees_script_where_study_l_is_silent(argv):
    """Lee et al.'s main.py: AdamW(model.parameters(), weight_decay=0.05), RandomCrop(size, padding=4) at every
    size, mix_prob 0.5; test-scored runs train on the whole training split."""
    from trainables.data.augment import augmentation

    configs = dry(*argv)
    assert {c.dataset for c in configs} >= {"cifar10", "tinyimagenet"}
    for c in configs:
        assert (c.optimizer, c.decay_exempt, c.weight_decay) == ("adamw", "none", 0.05), c.trial_id
        assert (c.crop_padding, c.cutmix_prob) == (4, 0.5), c.trial_id
        assert (c.eval_split, c.holdout_fraction) == ("test", 0.0), c.trial_id
        # 4 px of jitter at 64 px too (the default would give img_size // 8 = 8)
        assert augmentation(c.protocol, c.dataset, c.model.img_size, c.crop_padding).padding == 4


def test_factorial_trains_each_image_size_with_its_studys_recipe(capsys):
    """224 px: Study P's optimiser, exemptions, epochs and random resized crop; 32 / 64 px: Lee's. CutMix
    keeps Lee's probability everywhere (it is part of the protocol); --epochs still sets every trial's."""
    from sweeps.studies import study_p
    from trainables.data.augment import augmentation

    configs = dry("factorial", "--datasets", "cifar10,tinyimagenet,imagenet100", "--seeds", "1")
    sizes = {c.model.img_size for c in configs}
    assert sizes == {32, 64, 224} and len(configs) == 3 * 56
    for c in configs:
        crop = augmentation(c.protocol, c.dataset, c.model.img_size, c.crop_padding)
        if c.model.img_size == 224:
            assert c.preset == "study_p" and crop.resized_crop, c.trial_id
            assert (c.optimizer, c.decay_exempt, c.epochs) == ("adamw", "timm", 60), c.trial_id
            assert all(getattr(c, k) == v for k, v in study_p.RECIPE.items() if k != "protocol"), c.trial_id
        else:
            assert c.preset == "study_l" and not crop.resized_crop and crop.padding == 4, c.trial_id
            assert (c.optimizer, c.decay_exempt, c.epochs) == ("adamw", "none", 100), c.trial_id
        assert c.cutmix_prob == 0.5
    assert len({c.protocol.name for c in configs if c.model.img_size == 224}) == 8  # the cell's protocol, not baseline
    assert {c.epochs for c in dry("factorial", "--datasets", "cifar10,imagenet100", "--epochs", "7")} == {7}
    assert launcher.main(["factorial", "--datasets", "cifar10,imagenet100", "--dry-run", "--wide"]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    column = {name: i for i, name in enumerate(table[0])}
    shown = {(row[column["dataset"]], row[column["epochs"]], row[column["decay_exempt"]]) for row in table[1:]}
    assert shown == {("cifar10", "100", "none"), ("imagenet100", "60", "timm")}


def test_every_test_scored_study_trains_on_the_whole_training_split():
    for argv in (("study_p", "--seeds", "1"), ("demo",), ("study_l", "--seeds", "1")):
        assert {c.holdout_fraction for c in dry(*argv)} == {0.0}, argv
    # The hparam study scores on the holdout: there it stays.
    hparam = dry("hparam")
    assert {(c.eval_split, c.holdout_fraction) for c in hparam} == {("holdout", 0.05)}


def test_study_p_conditions_and_recipe():
    configs = dry("study_p", "--seeds", "1")
    conds = {(c.pe, c.rpt) for c in configs}
    assert conds == {("none", False), ("ape", False), ("sincos2d", False), ("rope2d", False),
                     ("ape", True), ("sincos2d", True), ("rope2d", True)}
    c = configs[0]
    assert (c.model.img_size, c.model.patch_size, c.model.dim, c.model.depth, c.model.heads) == (224, 16, 384, 12, 8)
    assert (c.optimizer, c.weight_decay, c.epochs, c.model.num_classes, c.model.ape_init) == (
        "adamw", 0.05, 60, 100, "normal")
    # bench/recipe_pilot.py: the literal Adam + L2 on every parameter stays at chance; AdamW with timm's
    # exemptions learns (README, "Protocol choices")
    assert c.decay_exempt == "timm"
    # Study P keeps its random resized crop (224 px) and its own recipe: Lee's padding and mix_prob are not set.
    assert (c.crop_padding, c.cutmix_prob) == (0, 1.0)
    # Its code smooths labels only in the validation loss of `predict` (no training script): training does not.
    assert {c.label_smoothing for c in configs} == {False}
    assert (c.model.cls_init, c.model.linear_init, c.model.final_norm) == ("normal", "torch", False)


def test_options_reach_every_trial():
    configs = dry("study_l", "--datasets", "cifar10", "--seeds", "2", "--epochs", "7", "--preset", "tiny",
                  "--set", "lr=5e-4", "--set", "depth=3")
    assert len(configs) == 4
    assert all((c.epochs, c.lr, c.model.depth, c.preset) == (7, 5e-4, 3, "tiny") for c in configs)
    assert all(c.warmup_epochs <= c.epochs for c in configs)
    assert sorted({c.seed for c in configs}) == [0, 1]


def test_set_with_commas_sweeps_the_field_across_the_study_grid():
    configs = dry("demo", "--set", "lr=1e-3,5e-4", "--set", "depth=1,2")
    assert len(configs) == 4 * 2 * 2 and len({c.trial_id for c in configs}) == 16
    assert {(c.lr, c.model.depth) for c in configs} == {(1e-3, 1), (1e-3, 2), (5e-4, 1), (5e-4, 2)}
    # The swept values are in each id's readable part (and so in its MLflow run's name); a field set
    # to one value is not.
    assert all(f"-lr{c.lr:g}-depth{c.model.depth}-s0-" in c.trial_id for c in configs)
    assert all("-lr" not in c.trial_id for c in dry("demo", "--set", "lr=5e-4"))
    with pytest.raises(ValueError, match="KEY=V1,V2"):
        dry("demo", "--set", "lr=1e-3,")


# sha1 of the comma-joined trial ids, in the study's order: ids name MLflow runs, checkpoints and rows,
# so no change to how trials are built may move one.
PINNED_IDS = {
    ("demo",): (4, "2358a13a07af"),
    ("study_l",): (60, "d608ac86e8cc"),
    ("study_p",): (35, "59e9aedc253a"),  # 5 seeds; Study P's code: CLS N(0, 1), Linear default init, no final norm
    ("study_p", "--seeds", "4"): (28, "4c904f41aa18"),
    ("factorial", "--datasets", "cifar100,tinyimagenet", "--seeds", "2"): (224, "61421ea2c1e0"),
    ("hparam",): (1, "98b771db311e"),
    ("demo", "--set", "lr=1e-3,5e-4"): (8, "6ced042bae18"),  # swept values in the readable part (v0.3)
    ("demo", "--gpus-per-trial", "1"): (4, "2358a13a07af"),
}


@pytest.mark.parametrize("argv", list(PINNED_IDS))
def test_trial_ids_are_pinned(argv):
    import hashlib

    ids = [c.trial_id for c in dry(*argv)]
    assert (len(ids), hashlib.sha1(",".join(ids).encode()).hexdigest()[:12]) == PINNED_IDS[argv]


def test_dry_run_starts_with_conditions_x_seeds_and_lists_one_short_line_per_trial(capsys, monkeypatch, tmp_path):
    from sweeps.launch import estimate

    monkeypatch.setattr(estimate, "TABLE", tmp_path / "missing.json")
    assert launcher.main(["study_l", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("study_l: 12 conditions x 5 seeds = 60 trials in 60 packs (sizes 1)")
    assert "every trial: preset study_l, epochs 100, lr 0.001" in lines[0]
    assert lines[1].startswith("GPU-hours:") and lines[2] == "trial_id"
    trials = lines[3:-1]
    assert len(trials) == 60 and trials[0] == "cifar10-ape-baseline-s0-ff40cc9b" and max(map(len, trials)) < 80
    assert lines[-1].startswith("60 trials (--dry-run --wide")
    # a swept field is what tells two trials apart beside their ids; --wide is the whole table
    assert launcher.main(["demo", "--dry-run", "--set", "lr=1e-3,5e-4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("demo: 8 conditions x 1 seed = 8 trials") and lines[2].split() == ["trial_id", "lr"]
    assert launcher.main(["demo", "--dry-run", "--wide"]) == 0
    header = capsys.readouterr().out.splitlines()[2].split()
    assert header == ["trial_id", "dataset", "preset", "pe", "rpt", "protocol", "seed", "epochs", "lr", "optimizer",
                      "decay_exempt", "crop_padding", "cutmix_prob", "pack"]


def test_dry_run_json_prints_only_json_on_stdout():
    out = subprocess.run([sys.executable, "sweeps/run.py", "demo", "--dry-run", "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    trials = json.loads(out.stdout)
    assert len(trials) == 4 and {"trial_id", "pe", "dataset", "lr", "depth"} <= set(trials[0])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["study_q"], "unknown study 'study_q'; valid studies: \\['demo', 'study_l'"),
        (["demo", "--set", "pe=fourier"], "fourier"),
        (["demo", "--datasets", "mnist"], "mnist"),
        (["demo", "--set", "protocol=fancy"], "fancy"),
        (["demo", "--set", "warmup"], "KEY=VALUE"),
        (["demo", "--results", "nosuchscheme://x/y"], "nosuchscheme"),
        (["study_l", "--data-root", "/nonexistent/vitsweep-data"], "/nonexistent/vitsweep-data"),
        # zero and empty are errors, never "the study's default"
        (["demo", "--epochs", "0"], r"^error: --epochs must be an integer >= 1, got 0$"),
        (["demo", "--seeds", "0"], r"--seeds must be an integer >= 1, got 0"),
        (["hparam", "--samples", "0"], r"--samples must be an integer >= 1, got 0"),
        (["demo", "--datasets", ""], r"--datasets is empty .*'cifar100'"),
        (["demo", "--datasets", " , "], r"--datasets is empty"),
        (["demo", "--preset", ""], r"--preset is empty .*'tiny'"),
        # resources, before Ray divides by them
        (["demo", "--cpus-per-trial", "0"], r"--cpus-per-trial must be a number > 0, got 0"),
        (["demo", "--gpus-per-trial", "-1"], r"--gpus-per-trial must be a number >= 0, got -1"),
        (["demo", "--gpus-per-trial", "nan"], r"--gpus-per-trial must be a number >= 0, got nan"),
        (["demo", "--cpus-per-trial", "0.00001"], r"--cpus-per-trial must be a multiple of 0.0001"),
        (["demo", "--workers-per-trial", "0"], r"--workers-per-trial must be an integer >= 1, got 0"),
        (["demo", "--max-concurrent", "0"], r"--max-concurrent must be an integer >= 1, got 0"),
        (["demo", "--max-failures", "-1"], r"--max-failures must be an integer >= 0, got -1"),
        # an MLflow server nobody runs: TrackingError, still one line
        (["demo", "--mlflow-uri", "http://127.0.0.1:1"], r"^error: MLflow tracking server .* not reachable"),
    ],
)
def test_bad_input_fails_before_ray_with_a_clear_message(argv, message, tmp_path, capsys):
    import ray

    ray_was_up = ray.is_initialized()  # the session's shared Ray may already run
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args([*argv] + ([] if "--results" in argv else ["--results", str(tmp_path)]))
    assert launcher.run(args) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    import re

    assert re.search(message, err, flags=re.MULTILINE), err
    assert len(err.strip().splitlines()) == 1, err  # one line, no traceback
    assert ray.is_initialized() == ray_was_up  # failed before starting Ray
    assert not (tmp_path / "demo").exists()  # and before writing anything


def test_results_or_storage_that_is_a_file_is_named(tmp_path, capsys):
    import ray

    ray_was_up = ray.is_initialized()
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    assert launcher.run(parser.parse_args(["demo", "--results", str(a_file)])) == 2
    assert capsys.readouterr().err == f"error: --results {a_file} is a file; pass a folder (created when missing) " \
                                      "or a URI (s3://...)\n"
    args = parser.parse_args(["demo", "--results", str(tmp_path / "r"), "--storage", str(a_file)])
    assert launcher.run(args) == 2
    assert capsys.readouterr().err.startswith(f"error: --storage {a_file} is a file")
    assert ray.is_initialized() == ray_was_up


def test_offline_cifar_fails_the_launch_before_any_trial(tmp_path, capsys, monkeypatch):
    """No network (a proxy that refuses): the download is tried once, in the launcher,
    and the launch ends with the message a Train worker would give, before Ray."""
    import ray

    ray_was_up = ray.is_initialized()
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # discard port: connection refused
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    # urllib builds its global opener, proxies included, at its first urlopen: one built here (torchvision's
    # download) would send every later urlopen of this process to the dead proxy. It goes with the test.
    import urllib.request

    monkeypatch.setattr(urllib.request, "_opener", None)
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(["demo", "--datasets", "cifar10", "--data-root", str(tmp_path / "data"),
                              "--results", str(tmp_path / "results")])
    assert launcher.run(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cifar10: files ['batches.meta'") and "the download failed" in err, err
    assert str(tmp_path / "data" / "cifar-10-batches-py") in err and len(err.strip().splitlines()) == 1
    assert ray.is_initialized() == ray_was_up
    assert not (tmp_path / "results" / "demo").exists()  # no trial row, no lock left behind


@pytest.mark.parametrize(
    "argv, message",
    [
        (["analyze", "demo", "--eval-size", "-1"], r"^error: --eval-size must be an integer >= 0, got -1$"),
        (["analyze", "demo", "--mlflow-uri", "http://127.0.0.1:1"], r"^error: MLflow tracking server"),
        (["sweep", "demo", "--epochs", "0"], r"^error: --epochs must be an integer >= 1"),
    ],
)
def test_cli_user_errors_are_one_line_on_stderr_with_exit_2(argv, message, tmp_path, capsys):
    import re

    from sweeps import cli

    assert cli.main([*argv, "--results", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert re.search(message, err, flags=re.MULTILINE) and len(err.strip().splitlines()) == 1, err
    assert "error" not in out


def test_gpu_trials_checkpoint_by_wall_time_under_the_same_ids():
    cpu, gpu = dry("demo"), dry("demo", "--gpus-per-trial", "1")
    assert {c.checkpoint_interval_s for c in cpu} == {0.0} and {c.checkpoint_interval_s for c in gpu} == {120.0}
    assert [c.trial_id for c in cpu] == [c.trial_id for c in gpu]
    assert {c.checkpoint_interval_s
            for c in dry("demo", "--gpus-per-trial", "1", "--set", "checkpoint_interval_s=0")} == {0.0}
