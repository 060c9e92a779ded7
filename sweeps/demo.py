"""Demo: the embedded default that ``make demo`` runs; a few minutes on a 2-core CPU.

    vitsweep demo                     # train + analyse + report, everything local
    vitsweep sweep demo --dry-run     # 4 trials

Four tiny ViTs (preset ``tiny``: depth 2, dim 64) on the procedural ``shapes``
data set (no download): PE {none, ape} x protocol {baseline, cutmix}, one seed,
a few epochs on a 2,000-image subset. Enough for every stage to produce real
numbers: ``ape`` should reach higher accuracy than ``none`` on shapes whose
class depends on layout, and SSDC under RPI should collapse for ``none``.
"""

from sweeps.common import StudyOptions, make_trials

DEFAULTS = StudyOptions(datasets=("shapes",), seeds=1, epochs=3, preset="tiny")
RECIPE = {"max_train_images": 2000, "batch_size": 64, "warmup_epochs": 1, "checkpoint_every": 1}


def trials(options: StudyOptions):
    conditions = [
        {"dataset": dataset, "pe": pe, "protocol": protocol}
        for dataset in options.datasets
        for pe in ("none", "ape")
        for protocol in ("baseline", "cutmix")
    ]
    return make_trials("demo", options, conditions, base=RECIPE)
