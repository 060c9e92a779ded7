"""The launcher's command line: its flags, their checks, and the trials and packs they select.

The flags common to every study are here; a study's own flags come from its ``add_arguments`` hook
(``sweeps/studies/study.py``), in a group of their own. ``check`` refuses a bad value before torch is
imported (``sweeps.launch.validate``, then the study's ``check_launch`` hook); ``check_gpus`` refuses, once
Ray is up, a local launch that would train on CPUs on a machine with GPUs (a launch with ``--address``
must say ``--gpus-per-trial`` up front: ``check_cluster_gpus``). ``build_trials`` turns the
flags into the study's run configs, ``build_packs`` groups them (``sweeps.launch.packs``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Mapping
from typing import Any

from records import layout, vocab
from sweeps.launch.packs import form_packs, pack_size
from sweeps.launch.validate import check_args, check_study, check_value
from sweeps.studies import STUDIES, study
from sweeps.studies.common import StudyOptions
from sweeps.studies.hparam import read_defaults
from trainables.config.architecture import PRESETS
from trainables.config.data_roots import DATASET_SPECS

# Imports inside functions: the data model (pandas, SciPy) loads only for a selection that reads results.

STAGES = ("train", "analyze", "report", "all")
GPU_CHECKPOINT_INTERVAL_S = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help=f"one of: {', '.join(STUDIES)}")
    g = parser.add_argument_group("what to run")
    g.add_argument("--datasets",
                   help=f"comma-separated data sets (default: the study's); valid: {', '.join(DATASET_SPECS)}")
    g.add_argument("--seeds", type=int, help="run seeds 0..N-1 (default: the study's)")
    g.add_argument("--epochs", type=int, help="epochs per trial (default: the study's)")
    g.add_argument("--preset", help="model preset for every trial (default: the study's / each data set's native "
                   f"one); valid: {', '.join(PRESETS)}")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any run-config field, e.g. --set lr=5e-4 --set depth=6 (repeatable); "
                   "KEY=V1,V2 sweeps it, crossed with the study's grid; "
                   f"pe: {', '.join(vocab.PES)}; protocol: {', '.join(vocab.PROTOCOLS)}")
    g.add_argument("--defaults-from", metavar="JSON", help="best config written by the hparam study")
    g.add_argument("--stage", choices=STAGES, default="train", help="train (default), analyze, report, or all three")
    g.add_argument("--dry-run", action="store_true", help="print the plan (conditions x seeds, GPU-hours, one line "
                   "per trial); start nothing")
    g.add_argument("--verbose", action="store_true",
                   help="also show per-epoch lines, Tune's tables and Ray's own output (default: one line per trial)")
    g.add_argument("--json", action="store_true", help="with --dry-run: only a JSON list of trial configs on stdout")
    g.add_argument("--wide", action="store_true", help="with --dry-run: every column of every trial, as a table")
    g.add_argument("--pack", type=int, metavar="K",
                   help="train up to K same-shaped trials together in one process (default: 1 without GPUs, "
                        "8 with --gpus-per-trial); see sweeps/launch/packs.py")
    w = parser.add_argument_group("where it runs and writes")
    w.add_argument("--results", default="results",
                   help="local folder or URI (s3://...) for Parquet tables (default ./results)")
    w.add_argument("--storage", help="checkpoints and Tune state, local or URI (default: <results>/storage)")
    w.add_argument("--mlflow-uri", help="tracking URI (default: sqlite:///<results>/mlflow.db for a local --results)")
    w.add_argument("--data-root", default="data", help="where data sets live or are downloaded (default ./data)")
    w.add_argument("--address", help="Ray address; default starts a local Ray, 'auto' joins a running cluster "
                   "(then --gpus-per-trial is required)")
    w.add_argument("--resume", action="store_true",
                   help="continue an interrupted sweep: finished trials are not re-run")
    r = parser.add_argument_group("resources per trial")
    # No default value: unset must differ from an explicit 0 (check_gpus refuses unset on a GPU cluster).
    r.add_argument("--gpus-per-trial", type=float, help="GPUs per Train worker; fractions share a GPU (default 0; "
                   "required when the Ray cluster has GPUs: 0 trains on CPUs there)")
    r.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs per Train worker (default 1)")
    r.add_argument("--workers-per-trial", type=int, default=1, help="Ray Train workers per trial (>1: DDP)")
    r.add_argument("--max-concurrent", type=int, help="cap on trials running at once (default: what fits)")
    r.add_argument("--max-failures", type=int, default=2, help="retries of a failed trial from its last checkpoint")
    r.add_argument("--placement-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a trial's Train workers may wait for a node, at start or after losing theirs; "
                   "tried twice, then the trial fails (default 60; raise it for a cluster that adds nodes slowly)")
    for name in STUDIES:  # each study's own flags (its add_arguments hook)
        study.of(name).add_arguments(parser.add_argument_group(f"{name} only"))


def gpus_per_trial(args: argparse.Namespace) -> float:
    """--gpus-per-trial as a number: unset is 0 (``check_gpus`` tells the two apart)."""
    return getattr(args, "gpus_per_trial", None) or 0.0


def check(args: argparse.Namespace) -> dict[str, list[Any]]:
    """Every flag and ``--set`` value, then what the study itself refuses; before torch is imported.
    Returns the ``--set`` overrides, {field: [values]}."""
    check_study(args.study)
    check_cluster_gpus(args)
    swept = check_args(args)
    study.of(args.study).check_launch(args, swept)
    return swept


def check_cluster_gpus(args: argparse.Namespace) -> None:
    """Refuse (ValueError) a launch with ``--address`` but no ``--gpus-per-trial``, before Ray is contacted:
    an autoscaling cluster shows no GPU at launch (its head has none, its GPU workers start at 0), so
    what Ray reports then cannot tell a CPU sweep from a forgotten flag; the user says which."""
    if getattr(args, "address", None) and getattr(args, "gpus_per_trial", None) is None:
        raise ValueError(f"--address {args.address} needs --gpus-per-trial: pass --gpus-per-trial 1 (a fraction "
                         "shares a GPU), or --gpus-per-trial 0 to train on CPUs on purpose")


def check_gpus(cluster: Mapping[str, float], args: argparse.Namespace) -> str | None:
    """Refuse (ValueError) a launch whose trials would train on CPUs on a Ray cluster with GPUs
    (``cluster``: ``ray.cluster_resources()``) because ``--gpus-per-trial`` was not given; with an
    explicit ``--gpus-per-trial 0``, the warning line to print. None: nothing to say."""
    seen = cluster.get("GPU", 0) or 0
    if seen <= 0 or gpus_per_trial(args) > 0:
        return None
    if getattr(args, "gpus_per_trial", None) is None:
        raise ValueError(f"this Ray cluster has {seen:g} GPU(s) but --gpus-per-trial is not set, so every trial "
                         "would train on CPUs; pass --gpus-per-trial 1 (a fraction shares a GPU), "
                         "or --gpus-per-trial 0 to train on CPUs anyway")
    return f"--gpus-per-trial 0: every trial trains on CPUs, although this Ray cluster has {seen:g} GPU(s)"


def build_trials(args: argparse.Namespace):
    """The study's trial configs; raises ValueError on any bad name or value."""
    swept = check(args)
    spec = study.of(args.study)
    defaults: StudyOptions = spec.defaults
    # At GPU speed an epoch takes seconds: checkpoint by wall time, not every epoch (--set overrides it).
    overrides = {"checkpoint_interval_s": GPU_CHECKPOINT_INTERVAL_S} if gpus_per_trial(args) > 0 else {}
    if args.defaults_from:
        overrides.update({k: check_value(k, v) for k, v in read_defaults(args.defaults_from).items()})
    datasets = tuple(d.strip() for d in args.datasets.split(",") if d.strip()) if args.datasets else defaults.datasets
    configs = []
    for values in itertools.product(*swept.values()):  # one pass of the study's grid per swept combination
        options = StudyOptions(
            datasets=datasets, seeds=defaults.seeds if args.seeds is None else args.seeds,
            epochs=defaults.epochs if args.epochs is None else args.epochs,
            preset=defaults.preset if args.preset is None else args.preset,
            overrides={**overrides, **dict(zip(swept, values)), **swept_label(swept)},
            # Absolute: every Ray worker process has its own working directory.
            data_root=layout.results_location(os.path.expanduser(args.data_root)))
        configs += spec.trials(options, args)
    ids = [c.trial_id for c in configs]
    if len(set(ids)) != len(ids):
        raise ValueError("the study produced duplicate trials; check --set overrides")
    if args.seeds is not None and (notice := seeds_notice(args.seeds, configs)):
        print(notice, file=sys.stderr)
    return configs


def seeds_notice(seeds: int, configs) -> str | None:
    """With ``--seeds N``: one line naming the claims that read "not enough seeds" at N seeds whatever
    the results (``analysis.statistics.claims.undecided`` on the planned trials); None when every claim can decide."""
    import pandas as pd  # here, as in sweeps/cli.py: the report's stack stays out of a launch's first checks

    from analysis.statistics.claims import undecided
    from analysis.statistics.study_data import StudyData

    factors = ["pe", "rpt", "protocol", "seed"]
    trials = pd.DataFrame([(c.trial_id, c.dataset, c.pe, c.rpt, c.protocol.name, c.seed) for c in configs],
                          columns=["trial_id", "dataset", *factors]).assign(status="finished")
    # A data set's verdicts hang on its conditions and their seeds only, not on its name: data sets that
    # plan the same ones (the factorial's three: 3 x 3,360 trials at 60 seeds) are read once.
    plans = trials.groupby("dataset", sort=False)[factors].apply(lambda g: tuple(sorted(g.itertuples(index=False))))
    trials = trials[trials["dataset"].isin(plans.drop_duplicates().index)]
    names = undecided(StudyData.from_frames("plan", trials, pd.DataFrame(), pd.DataFrame()))
    if not names:
        return None
    return (f"--seeds {seeds}: {len(names)} claim(s) cannot reach a verdict at {seeds} seed(s) (\"not enough seeds\"): "
            + "; ".join(names))


def swept_label(swept) -> dict:
    """The fields a --set sweep varies, for the trial ids' readable part (``RunConfig.swept``)."""
    varied = ",".join(k for k, v in swept.items() if len(v) > 1)
    return {"swept": varied} if varied else {}


def build_packs(args: argparse.Namespace, configs, resume_epochs=None):
    """The study's trials grouped into packs (``--pack``); raises ValueError on a bad size."""
    k = pack_size(getattr(args, "pack", None), gpus_per_trial(args))
    return form_packs(configs, k, workers_per_trial=args.workers_per_trial, resume_epochs=resume_epochs)
