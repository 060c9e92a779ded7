"""Every value checked before torch, Ray or MLflow: one line, exit code 2, in a fresh interpreter
that never imported them (so a bad value or a refused second launch answers in a moment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.launch import validate

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "torchvision", "ray", "mlflow")
BAD_SETS = {
    "lr=nan": "lr must be a finite number > 0, got 'nan'",
    "lr=inf": "lr must be a finite number > 0, got 'inf'",
    "lr=0": "lr must be a finite number > 0, got '0'",
    "weight_decay=nan": "weight_decay must be a finite number >= 0, got 'nan'",
    "weight_decay=-1": "weight_decay must be a finite number >= 0, got '-1'",
    "max_train_images=-1": "max_train_images must be an integer >= 0, got '-1'",
    "checkpoint_interval_s=inf": "checkpoint_interval_s must be a finite number >= 0, got 'inf'",
    "epochs=1.5": "epochs must be an integer >= 1, got '1.5'",
    "cutmix_prob=2": "cutmix_prob must be a finite number >= 0 and <= 1, got '2'",
    "drop_rate=1": "drop_rate must be a finite number >= 0 and < 1, got '1'",
    "cutmix=maybe": "cutmix must be a boolean (true/false), got 'maybe'",
    "pe=fourier": "pe must be one of ['none', 'ape'",
    "lr=1e-3,nan": "lr must be a finite number > 0, got 'nan'",  # every swept value
    "nosuchfield=1": "unknown run-config field 'nosuchfield'; valid fields: [",
}


def test_every_field_the_run_config_flattens_is_checked_and_its_default_is_valid():
    from trainables.config import run_config

    flat = run_config.RunConfig().to_flat()
    assert set(run_config.FIELD_SPECS) == set(flat)
    for key, value in flat.items():  # every default is valid, and keeps its type
        assert validate.check_value(key, value) == value, key
        assert validate.check_value(key, str(value).lower() if isinstance(value, bool) else str(value)) == value


def test_the_run_config_refuses_what_the_pre_torch_check_refuses():
    from trainables.config.run_config import FIELD_SPECS, RunConfig

    for pair in BAD_SETS:
        key, _, value = pair.partition("=")
        if "," in value or key == "nosuchfield":
            continue
        typed = value if FIELD_SPECS[key].kind in (str, bool) else float(value)  # as a JSON value would come
        with pytest.raises(ValueError, match=f"^{key} must be"):
            RunConfig().with_overrides({key: typed})


def test_the_overrides_come_back_typed():
    overrides = validate.check_overrides(["lr=5e-4,1e-3", "depth=3", "rpt=true", "protocol=modern", "pe=rope2d"])
    assert overrides == {"lr": [5e-4, 1e-3], "depth": [3], "rpt": [True], "protocol": ["modern"], "pe": ["rope2d"]}
    assert [type(v[0]) for v in overrides.values()] == [float, int, bool, str, str]


PROBE = rf"""
import contextlib, io, json, sys
from sweeps import cli
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:
            rc = exc.code
    out.append({{"rc": rc, "err": err.getvalue()}})
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps({{"runs": out, "heavy": heavy}}))
"""


def _probe(argvs: list[list[str]]) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bad_values_and_a_refused_launch_answer_in_one_line_before_torch(tmp_path):
    from sweeps.launch.lock import LaunchLock

    results = str(tmp_path / "results")
    argvs = [["sweep", "demo", "--set", pair, "--results", results] for pair in BAD_SETS]
    argvs += [["sweep", "demo", "--seeds", "nan"], ["sweep", "demo", "--epochs", "2.5"],
              ["sweep", "demo", "--datasets", "mnist"], ["sweep", "demo", "--preset", "huge"],
              ["sweep", "demo", "--pack", "0"], ["sweep", "nosuch"], ["sweep", "demo", "--results", results]]
    with LaunchLock(results, "demo"):  # held by this process: the last launch is refused
        got = _probe(argvs)
    assert got["heavy"] == [], f"a refused launch imported {got['heavy']}"
    for argv, run in zip(argvs, got["runs"]):
        assert run["rc"] == 2 and run["err"].startswith("error: ") and run["err"].count("\n") == 1, (argv, run)
    for pair, run in zip(BAD_SETS.values(), got["runs"]):
        assert pair in run["err"], run["err"]
    tail = [r["err"] for r in got["runs"][len(BAD_SETS):]]
    assert "--seeds: invalid int value: 'nan'" in tail[0] and "--epochs: invalid int value" in tail[1]
    assert "unknown data set 'mnist'" in tail[2] and "unknown preset 'huge'" in tail[3]
    assert "--pack must be an integer >= 1, got 0" in tail[4]
    assert "invalid choice" in tail[5] or "unknown study" in tail[5]
    assert f"another launch of study 'demo' into {results} is running" in tail[6]
    assert not (tmp_path / "results" / "demo" / "trials").exists()


def test_defaults_from_values_are_checked_too(tmp_path, capsys):
    from sweeps import run as launcher
    from sweeps.launch import options

    best = tmp_path / "best.json"
    best.write_text(json.dumps({"best_config": {"lr": float("nan")}}))
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    assert launcher.run(parser.parse_args(["demo", "--defaults-from", str(best), "--dry-run"])) == 2
    assert capsys.readouterr().err == "error: lr must be a finite number > 0, got nan\n"


def test_analyze_of_object_storage_without_a_tracking_server_is_one_line(capsys):
    from sweeps import cli

    assert cli.main(["analyze", "demo", "--results", "s3://bucket/vitsweep"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --results 's3://bucket/vitsweep' is on s3:// storage") and err.count("\n") == 1
    assert "--mlflow-uri" in err


def test_a_misspelt_name_is_refused_with_a_suggestion_before_torch(tmp_path):
    results = str(tmp_path / "results")
    misspelt = {
        ("sweep", "studyl"): "unknown study 'studyl'; valid studies: [",
        ("sweep", "demo", "--set", "pe=rope"): "pe must be one of [",
        ("sweep", "demo", "--set", "protocol=modrn"): "protocol must be one of [",
        ("sweep", "demo", "--set", "protocl=modern"): "unknown run-config field 'protocl'",
        ("sweep", "demo", "--datasets", "cifar"): "unknown data set 'cifar'",
        ("sweep", "demo", "--preset", "vits"): "unknown preset 'vits'",
        ("sweep", "demo", "--set", "zzzz=1"): "unknown run-config field 'zzzz'",
    }
    suggested = ["study_l", "rope2d", "modern", "protocol", "cifar10", "vit_s", None]
    got = _probe([[*argv, "--results", results] for argv in misspelt])
    assert got["heavy"] == [], f"a misspelt name imported {got['heavy']}"
    for (argv, message), suggestion, run in zip(misspelt.items(), suggested, got["runs"]):
        assert run["rc"] == 2 and run["err"].count("\n") == 1 and message in run["err"], (argv, run)
        if suggestion:
            assert run["err"].rstrip().endswith(f"; did you mean {suggestion!r}?"), run["err"]
        else:
            assert "did you mean" not in run["err"], run["err"]
