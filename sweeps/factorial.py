"""The joint factorial of Study P and Study L.

    vitsweep sweep factorial --datasets cifar100,tinyimagenet --seeds 3      # 56 x 2 x 3 = 336 trials
    ray submit cluster/aws.yaml sweeps/run.py -- factorial --datasets cifar10,cifar100,tinyimagenet --seeds 5 --gpus-per-trial 1 ...

PE {none, ape, sincos2d, rope2d} x token order {fixed, RPT} (less the
redundant none + RPT: 7 conditions; ``--include-none-rpt`` adds it back)
x the 8 protocols of Study L x data sets x
seeds: 56 cells per data set and seed. Each data set uses its native preset
(``study_l`` at 32/64 px, ``study_p`` at 224 px) and Study L's recipe,
``study_l.LEE_RECIPE`` included (decay on every parameter, crop padding 4, CutMix
probability 0.5; at 224 px the random resized crop ignores the padding).

What it is for: every model gets every measurement of both studies, so
cross-study questions become answerable: does CutMix change SSDC? Does RPT
destroy locality? Is RoPE's low fragility stable across protocols?
"""

from sweeps.common import StudyOptions, all_protocols, make_trials
from sweeps.study_l import LEE_RECIPE
from sweeps.study_p import conditions as pe_conditions

DEFAULTS = StudyOptions(datasets=("cifar100",), seeds=1, epochs=100, preset=None)
CHECKPOINTS = "all"  # hook (sweeps/study.py): every snapshot measured, for the emergence figure, as Study L


def add_arguments(group) -> None:  # hook (sweeps/study.py)
    group.add_argument("--include-none-rpt", action="store_true", help="factorial: keep the redundant none + RPT cell")


def trial_options(args) -> dict:  # hook: trials()'s keywords from the flag above
    return {"include_none_rpt": True} if getattr(args, "include_none_rpt", False) else {}


def trials(options: StudyOptions, *, include_none_rpt: bool = False):
    cells = [
        {**pe_cond, "protocol": p.name}
        for pe_cond in pe_conditions(options.datasets, include_none_rpt=include_none_rpt)
        for p in all_protocols()
    ]
    return make_trials("factorial", options, cells, base=LEE_RECIPE)
