"""hparam: an Optuna search over lr, weight decay and warm-up for one condition.

    vitsweep sweep hparam --datasets cifar100 --set pe=rope2d --set protocol=modern --samples 32
    vitsweep sweep study_l --defaults-from results/hparam/best_config.json

Tune's ``OptunaSearch`` (TPE) proposes trials and ``ASHAScheduler`` stops the
weak ones early. Every trial is scored on the ``holdout`` split (a fixed 5% of
the training set), never on the test split. The best trial's values are
written to ``<results>/hparam/best_config.json``, which ``--defaults-from``
feeds to any other study as its defaults (``--set`` still wins). Its trials
are MLflow runs and Parquet rows like any other study's. Unlike a grid study, it declares its own hooks
(``sweeps/studies/study.py``): its trials are sampled as the search goes by its own Tuner, train alone and are
not resumed, and the best config is written after the sweep.

Expected: on CIFAR-100 with the study_l preset, the best lr lies near Lee et
al.'s 1e-3 with weight decay 0.05; a flat optimum means the studies' shared
recipe is a fair choice for every condition.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from records import layout
from sweeps.studies.common import StudyOptions, make_trials

# Imports inside functions: importing a study imports no Ray (sweeps/studies/study.py); its tuner does.

DEFAULTS = StudyOptions(datasets=("cifar100",), seeds=1, epochs=30, preset=None)
METRIC, MODE = "eval_acc", "max"  # holdout accuracy: eval_split is forced to "holdout"
SEARCHED = ("lr", "weight_decay", "warmup_epochs")
DEFAULT_SAMPLES = 24

# Hooks (sweeps/studies/study.py).
PLANNED = False  # the searcher proposes trials as it goes: there is no list to record or check off
UNPACKED = "the hparam study's searcher proposes and ASHA stops trials one at a time"
RESUME_REFUSED = "the hparam study cannot be resumed; start a new search (results go to a new run)"


def add_arguments(group) -> None:
    group.add_argument("--samples", type=int, help=f"hparam: number of Optuna trials (default {DEFAULT_SAMPLES})")


def check_launch(args, swept: dict[str, list[Any]]) -> None:
    if any(len(values) > 1 for values in swept.values()):
        raise ValueError("the hparam study searches one condition; --set KEY=V1,V2 sweeps are for grid studies")


def trials(options: StudyOptions):
    """The one base condition the search varies (its first data set, seed 0)."""
    base = {"dataset": options.datasets[0], "eval_split": "holdout"}
    return make_trials("hparam", StudyOptions(**{**options.__dict__, "seeds": 1}), [base])


def search_space(epochs: int) -> dict:
    from ray import tune

    return {
        "lr": tune.loguniform(1e-4, 3e-3),
        "weight_decay": tune.loguniform(1e-3, 0.3),
        "warmup_epochs": tune.randint(0, max(1, epochs // 5) + 1),  # upper bound exclusive
    }


def scheduler(epochs: int):
    from ray.tune.schedulers import ASHAScheduler

    # Rungs at epochs grace, 3 grace, 9 grace, ... below the full budget. max_t lies one
    # past the last epoch: ASHA stops a trial that reaches max_t, and a trial that
    # completes its epochs should finish (final metrics, checkpoint), not be cut off.
    return ASHAScheduler(time_attr="epoch", max_t=epochs + 1, grace_period=max(1, epochs // 9), reduction_factor=3)


def searcher(seed: int = 0):
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(metric=METRIC, mode=MODE, seed=seed)


def tuner(setup):
    """Optuna (TPE) proposals + ASHA early stopping around one base condition; every trial ASHA stops
    goes into ``setup.stopped``: only those may be recorded as stopped early."""
    from ray import tune
    from ray.tune.schedulers import TrialScheduler

    base = setup.base
    asha = scheduler(base.epochs)
    decide = asha.on_trial_result

    def on_trial_result(tune_controller, trial, result):
        decision = decide(tune_controller, trial, result)
        if decision == TrialScheduler.STOP:
            setup.stopped.add(base.with_overrides(trial.config).trial_id)
        return decision

    asha.on_trial_result = on_trial_result
    return tune.Tuner(
        setup.trainable, param_space=search_space(base.epochs),
        tune_config=tune.TuneConfig(search_alg=searcher(seed=base.seed), scheduler=asha, metric=METRIC, mode=MODE,
                                    num_samples=setup.args.samples or DEFAULT_SAMPLES,
                                    max_concurrent_trials=setup.max_concurrent),
        run_config=tune.RunConfig(**setup.run_config),
    )


def after_sweep(results: str, grid, configs) -> None:
    """The best trial's values to ``best_config.json``, for ``--defaults-from``."""
    best = grid.get_best_result(metric=METRIC, mode=MODE, scope="last")
    path = write_best(results, best.config, score=best.metrics[METRIC], condition=configs[0].to_flat(),
                      n_trials=len(grid))
    logging.getLogger("vitsweep").info("best %s %.4f with %s -> %s", METRIC, best.metrics[METRIC],
                                       {k: best.config[k] for k in SEARCHED}, path)


def write_best(results: str, best: dict, *, score: float, condition: dict, n_trials: int) -> str:
    """Write the winner where ``--defaults-from`` reads it."""
    doc = {"best_config": {k: best[k] for k in SEARCHED},
           "score": {"metric": METRIC, "split": "holdout", "value": score}, "condition": condition, "trials": n_trials}
    path = layout.best_config_path(results)
    fs, local = layout.filesystem(path)
    fs.create_dir(local.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(local) as f:
        f.write(json.dumps(doc, indent=1).encode())
    return path


def read_defaults(path: str) -> dict:
    """Run-config defaults from a best_config.json (or a plain flat JSON dict)."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--defaults-from {path!r} does not exist; run the hparam study first") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--defaults-from {path!r} is not JSON: {exc}") from None
    return dict(doc.get("best_config", doc))
