"""Pilot II: Study L's headline, baseline vs CutMix, on all of CIFAR-10 at CPU scale.

    vitsweep sweep pilot --data-root DIR --stage all    # 2 conditions x 5 seeds = 10 trials, ~1 h on 2 idle cores
    vitsweep sweep pilot --data-root DIR --dry-run      # the trial table, nothing started
    PYTHONPATH=. python3 bench/pilot_page.py --results results   # docs/pilot/: the page and figures, from the results

DIR holds any ``train/<class>/`` + ``test/<class>/`` layout of images (data set ``folder``); the
pilot is sized on ``cifar10-jpeg`` (``../shared/data/cifar10-jpeg.tar.gz`` unpacked: 50,000
training and 10,000 test images at 32 px). Results: ``docs/pilot/``.

Conditions (2): Lee et al.'s baseline and CutMix, APE, each with 5 seeds, on the whole training
split. Recipe: Lee et al.'s (``sweeps.study_l.LEE_RECIPE``: AdamW lr 1e-3, wd 0.05 on every
parameter, pad-4 crop + flip, CutMix on half the batches, batch 128, 1 warm-up epoch then cosine).
Model: preset ``tiny`` deepened to 4 blocks (dim 64, 4 heads, MLP ratio 2, 8x8 patches of 4 px,
~0.2M parameters): the issue measured it leaving uniform attention within a few epochs on the whole
split (minimum MAD 0.399 after 2 epochs, 0.378 after 4; uniform attention 0.418 on 8x8).

Why these and not more: 5 seeds, because a directional claim ("CutMix lowers minimum MAD") can reach
a verdict only from 5 paired seeds (``analysis.claim_tests.decides``: the exact sign-flip test's
smallest p with 3 pairs is 1/8); 3 seeds would buy AutoAugment as a third condition but no verdict.
5 epochs, the most that 10 trials fit into the hour. Study P's five models left the pilot:
docs/pilot/ states its claims as untestable at this scale, and what they would take.

Every epoch scores a fixed stratified 1,000-image subset of the test split (``epoch_eval_images``),
the last epoch the whole split (``test_acc``). The analysis measures every log-spaced snapshot
(epochs 0, 1, 2, 4, 5) on a seeded 250-image subset of the test split, one single-threaded actor
per core: Study L's claims read the minimum MAD (a mean over 250 images x 64 queries per head) and
the test accuracy of training (the whole split).

Sizing (the rates measured, the plan of ~55 min): docs/operations.md, "Benchmarks".
"""

from sweeps.common import StudyOptions, make_trials
from sweeps.study_l import LEE_RECIPE

EPOCHS = 5
SEEDS = 5
PROTOCOLS = ("baseline", "cutmix")
EPOCH_EVAL_IMAGES = 1000
# Hooks (sweeps/study.py): the analysis measures every snapshot, so the page draws emergence over
# training, on a seeded subset of the test split (the studies: the whole split); see the sizing.
EVAL_SIZE = 250
CHECKPOINTS = "all"
MODEL = {"dim": 64, "depth": 4, "heads": 4, "mlp_ratio": 2.0}
RECIPE = {**LEE_RECIPE, **MODEL, "batch_size": 128, "lr": 1e-3, "weight_decay": 0.05, "warmup_epochs": 1,
          "epoch_eval_images": EPOCH_EVAL_IMAGES}
DEFAULTS = StudyOptions(datasets=("folder",), seeds=SEEDS, epochs=EPOCHS, preset="tiny")


def trials(options: StudyOptions):
    conditions = [{"dataset": dataset, "pe": "ape", "protocol": protocol}
                  for dataset in options.datasets for protocol in PROTOCOLS]
    return make_trials("pilot", options, conditions, base=RECIPE)
