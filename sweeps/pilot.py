"""Pilot: both studies at laptop scale on a real folder data set (CIFAR-10 as JPEG folders).

    vitsweep sweep pilot --data-root DIR --stage all    # 8 conditions x 3 seeds = 24 trials
    vitsweep sweep pilot --data-root DIR --dry-run      # the trial table, nothing started

DIR holds any ``train/<class>/`` + ``test/<class>/`` (or ``val/``) layout of
images (data set ``folder``); the pilot was sized on CIFAR-10's 32 px images
(``../shared/data/cifar10-jpeg.tar.gz`` unpacked). Results: ``docs/pilot/``.

Conditions (8): Study P's five models on the baseline protocol, PE {none,
ape, sincos2d, rope2d} plus ape + RPT; and Study L's baseline, AutoAugment,
CutMix and modern on APE (ape-baseline is shared by both parts: one trial
set, not two). One recipe for all: Lee et al.'s (``sweeps.study_l.LEE_RECIPE``:
AdamW lr 1e-3, wd 0.05 on every parameter, pad-4 crop, CutMix on half the
batches, cosine with warm-up), because both studies' claims are compared
within the pilot, so Study P's coupled-L2 Adam is not used here. Label
smoothing alone is not in the grid (it is part of ``modern`` only).

Model and scale, chosen by the sizing below: dim 96, depth 4, 4 heads, MLP
ratio 2 (~0.3M parameters, 8x8 patches of 4 px), a class-stratified
``MAX_TRAIN_IMAGES`` cap of the training split, ``EPOCHS`` epochs, and every
log-spaced snapshot (epochs 0, 1, 2, 4, 8, ..., last) measured on a seeded
``EVAL_SIZE`` subset of the test split, so the report draws locality's
emergence over training. At this scale attention is expected to stay close
to uniform (MAD 0.417 on the 8x8 grid); the results page reports the
uniform value beside every MAD.

Sizing (measured 2026-12-01 on the 2-core development machine, load average
5-15 from other work; images/s of one trial holding one core):

    see SIZING below (filled from the sizing run)
"""

from sweeps.common import StudyOptions, make_trials
from sweeps.study_l import LEE_RECIPE

EPOCHS = 10
MAX_TRAIN_IMAGES = 5000
# Every snapshot is measured on this seeded subset of the test split (the studies: the whole split).
EVAL_SIZE = 1000
# The analysis stage measures every log-spaced snapshot, so the report draws emergence over training.
CHECKPOINTS = "all"
MODEL = {"dim": 96, "depth": 4, "heads": 4, "mlp_ratio": 2.0}
RECIPE = {**LEE_RECIPE, **MODEL, "max_train_images": MAX_TRAIN_IMAGES, "batch_size": 128, "lr": 1e-3,
          "weight_decay": 0.05, "warmup_epochs": 1}
DEFAULTS = StudyOptions(datasets=("folder",), seeds=3, epochs=EPOCHS, preset="tiny")

# (pe, rpt, protocol): Study P's five models, then Study L's protocols on APE (baseline shared).
STUDY_P = (("none", False, "baseline"), ("ape", False, "baseline"), ("sincos2d", False, "baseline"),
           ("rope2d", False, "baseline"), ("ape", True, "baseline"))
STUDY_L = (("ape", False, "autoaugment"), ("ape", False, "cutmix"), ("ape", False, "modern"))
CONDITIONS = STUDY_P + STUDY_L


def trials(options: StudyOptions):
    conditions = [
        {"dataset": dataset, "pe": pe, "rpt": rpt, "protocol": protocol}
        for dataset in options.datasets
        for pe, rpt, protocol in CONDITIONS
    ]
    return make_trials("pilot", options, conditions, base=RECIPE)
