"""The launcher's flags decided without Ray: a GPU cluster never trains on CPUs unless told to, and a
study's own hooks (sweeps/studies/study.py) reach the launch."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.launch import options
from sweeps.studies import STUDIES, study

ROOT = Path(__file__).resolve().parents[1]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_gpu_cluster_refuses_a_launch_without_gpus_per_trial():
    cluster = {"CPU": 16.0, "GPU": 4.0, "memory": 1e11}
    with pytest.raises(ValueError) as refused:
        options.check_gpus(cluster, _args("study_l"))
    line = str(refused.value)
    assert "--gpus-per-trial" in line and "4 GPU" in line and "\n" not in line


def test_an_explicit_zero_trains_on_cpus_with_one_warning_and_gpus_or_no_gpus_say_nothing():
    warning = options.check_gpus({"CPU": 16.0, "GPU": 1.0}, _args("study_l", "--gpus-per-trial", "0"))
    assert warning and "--gpus-per-trial 0" in warning and "1 GPU" in warning and "\n" not in warning
    assert options.check_gpus({"CPU": 16.0, "GPU": 1.0}, _args("study_l", "--gpus-per-trial", "0.25")) is None
    assert options.check_gpus({"CPU": 2.0}, _args("demo")) is None  # a CPU machine: unset means 0
    assert options.check_gpus({"CPU": 2.0, "GPU": 0.0}, _args("demo", "--gpus-per-trial", "0")) is None
    assert (options.gpus_per_trial(_args("demo")) == 0.0
            and options.gpus_per_trial(_args("demo", "--gpus-per-trial", "2")) == 2.0)


def test_every_study_resolves_its_hooks_with_the_defaults():
    for name in STUDIES:
        spec = study.of(name)
        assert spec.checkpoints in ("final", "all") and (spec.eval_size is None or spec.eval_size > 0), name
    demo, hparam, study_l = study.of("demo"), study.of("hparam"), study.of("study_l")
    assert (demo.eval_size, demo.checkpoints) == (500, "all")
    # Study L and the factorial measure every snapshot (their emergence figure); Study P the final ones.
    assert (study_l.eval_size, study_l.checkpoints, study_l.planned, study_l.tuner) == (None, "all", True, None)
    assert (study.of("factorial").checkpoints, study.of("study_p").checkpoints) == ("all", "final")
    assert not hparam.planned and hparam.tuner is not None and hparam.unpacked and hparam.resume_refused
    with pytest.raises(ValueError, match="unknown study 'nosuch'"):
        study.of("nosuch")


def test_a_studys_own_flags_and_checks_come_from_its_hooks():
    assert _args("factorial", "--include-none-rpt").include_none_rpt is True
    assert _args("hparam", "--samples", "3").samples == 3
    with pytest.raises(ValueError, match="the hparam study searches one condition"):
        options.check(_args("hparam", "--set", "lr=1e-3,5e-4"))
    assert options.check(_args("demo", "--set", "lr=1e-3,5e-4")) == {"lr": [1e-3, 5e-4]}


# Planning a sweep (trial ids, packs, the estimate) is data: a dry run, in a fresh interpreter as a user
# runs it, must not wait for torch (whose import pulls torch._dynamo through torchvision.ops).
_PLAN_PROBE = """
import contextlib, io, json, sys
from sweeps import cli
runs = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    runs.append({"rc": rc, "out": out.getvalue(), "err": err.getvalue()})
heavy = sorted(m for m in ("torch", "torchvision", "timm") if m in sys.modules)
print(json.dumps({"runs": runs, "heavy": heavy}))
"""


def test_a_dry_run_plans_every_study_and_a_bad_root_is_refused_without_torch(tmp_path):
    from PIL import Image

    # `pilot` trains on a `folder` set: its classes and image size come from the root (two 16 px classes).
    folder = tmp_path / "folder"
    for split in ("train", "test"):
        for label in ("a", "b"):
            (folder / split / label).mkdir(parents=True)
            Image.new("RGB", (16, 16)).save(folder / split / label / "0.png")
    argvs = [["sweep", "study_l", "--dry-run", "--json"], ["sweep", "study_l", "--dry-run", "--pack", "8"],
             ["sweep", "pilot", "--dry-run", "--json", "--data-root", str(folder)]]
    argvs += [["sweep", name, "--dry-run", "--data-root", str(folder)] for name in STUDIES]
    # A real launch whose data root lacks Tiny-ImageNet is refused by the torch-free root checks.
    argvs += [["sweep", "study_l", "--data-root", str(tmp_path / "none"), "--results", str(tmp_path / "results")]]
    done = subprocess.run([sys.executable, "-c", _PLAN_PROBE, json.dumps(argvs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["heavy"] == [], f"planning a sweep imported {got['heavy']}"
    *plans, launch = got["runs"]
    assert all(run["rc"] == 0 for run in plans), plans
    assert launch["rc"] == 2 and "tinyimagenet: no Tiny-ImageNet under" in launch["err"], launch
    rows = json.loads(got["runs"][0]["out"])
    assert len(rows) == 60 and len({row["trial_id"] for row in rows}) == 60  # 12 conditions x 5 seeds
    assert {row["dataset"] for row in rows} == {"cifar10", "cifar100", "tinyimagenet"}
    assert len({row["protocol"] for row in rows}) == 8 and {row["dim"] for row in rows} == {192}
    assert all(row["pack"] for row in rows)
    assert "60 trials" in got["runs"][1]["out"]
    folder_rows = json.loads(got["runs"][2]["out"])
    assert {(row["num_classes"], row["img_size"], row["patch_size"]) for row in folder_rows} == {(2, 16, 2)}


def test_an_address_without_gpus_per_trial_exits_2_before_ray_is_contacted(monkeypatch, capsys, tmp_path):
    """An autoscaling cluster shows no GPU at launch, so a launch with --address must say what it trains on;
    the refusal comes before Ray (init_ray fails the test if it is reached), so a wrong address answers too."""
    from sweeps import run as launcher
    from trainables.trial import ray_start

    def contacted(*args, **kwargs):
        raise AssertionError("Ray was contacted")

    monkeypatch.setattr(ray_start, "init_ray", contacted)
    for extra in ([], ["--dry-run"]):
        args = _args("study_l", "--address", "ray://10.255.255.1:10001", "--results", str(tmp_path), *extra)
        assert launcher.run(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --address ray://10.255.255.1:10001 needs --gpus-per-trial")
    assert not (tmp_path / "study_l").exists()  # nothing written: no lock, no log
    for gpus in ("0", "1"):  # either answer passes the check
        options.check_cluster_gpus(_args("study_l", "--address", "auto", "--gpus-per-trial", gpus))
