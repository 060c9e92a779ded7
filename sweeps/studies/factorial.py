r"""The joint factorial of Study P and Study L.

    vitsweep sweep factorial --datasets cifar100,tinyimagenet --seeds 3      # 56 x 2 x 3 = 336 trials
    ray submit cluster/aws.yaml sweeps/run.py -- factorial --datasets cifar10,cifar100,tinyimagenet --seeds 5 \
        --gpus-per-trial 1 ...

PE {none, ape, sincos2d, rope2d} x token order {fixed, RPT} (less the
redundant none + RPT: 7 conditions; ``--include-none-rpt`` adds it back)
x the 8 protocols of Study L x data sets x
seeds: 56 cells per data set and seed. Each data set uses its native preset
(``study_l`` at 32/64 px, ``study_p`` at 224 px) and that study's recipe
(``RECIPES``): at 32 and 64 px Lee et al.'s (``study_l.LEE_RECIPE``: decay on
every parameter, crop padding 4, CutMix probability 0.5, 100 epochs); at 224 px
Study P's (``study_p.RECIPE``: AdamW with biases, norms, CLS and the APE table
exempt from decay, 60 epochs, the random resized crop), so a cross-study
statement at 224 px compares models trained as Study P trains them. CutMix keeps
Lee's probability at every size: it is part of what Study L's protocols mean.
``--epochs`` sets every trial's epochs; ``--dry-run --wide`` shows each trial's
recipe fields.

What it is for: every model gets every measurement of both studies, so
cross-study questions become answerable: does CutMix change SSDC? Does RPT
destroy locality? Is RoPE's low fragility stable across protocols?
"""

from records.vocab import SETTINGS
from sweeps.studies import study_l, study_p
from sweeps.studies.common import StudyOptions, make_trials, native_preset
from sweeps.studies.study_p import conditions as pe_conditions

DEFAULTS = StudyOptions(datasets=("cifar100",), seeds=1, epochs=None, preset=None)  # epochs: each recipe's
# The recipe of each native preset (so of each image size), from the study that owns it.
RECIPES = {
    "study_l": {**study_l.LEE_RECIPE, "epochs": study_l.DEFAULTS.epochs},
    "study_p": {**study_p.RECIPE, "epochs": study_p.DEFAULTS.epochs,
                "cutmix_prob": study_l.LEE_RECIPE["cutmix_prob"]},
}
CHECKPOINTS = "all"  # hook (sweeps/studies/study.py): every snapshot measured, for the emergence figure, as Study L


def add_arguments(group) -> None:  # hook (sweeps/studies/study.py)
    group.add_argument("--include-none-rpt", action="store_true", help="factorial: keep the redundant none + RPT cell")


def trial_options(args) -> dict:  # hook: trials()'s keywords from the flag above
    return {"include_none_rpt": True} if getattr(args, "include_none_rpt", False) else {}


def trials(options: StudyOptions, *, include_none_rpt: bool = False):
    configs = []
    for dataset in options.datasets:
        cells = [{**pe_cond, "protocol": p}  # the cell's protocol wins over Study P's baseline
                 for pe_cond in pe_conditions((dataset,), include_none_rpt=include_none_rpt) for p in SETTINGS]
        recipe = RECIPES[native_preset(dataset, options.data_root)]
        configs += make_trials("factorial", options, cells, base=recipe)
    return configs
