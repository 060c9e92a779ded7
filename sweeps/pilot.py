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

Model and scale, chosen by the sizing below: preset ``tiny`` widened to dim
96, depth 4, 4 heads, MLP ratio 2 (~0.3M parameters, 8x8 patches of 4 px), a
class-stratified cap of 5,000 training images, 2 epochs (1 warm-up), and
every log-spaced snapshot (epochs 0, 1, 2) measured on a seeded 250-image
subset of the test split, so the untrained model and the emergence over
training are measured too. Training accuracy (``test_acc``) is always scored
on the whole test split. This is far below both papers' budgets: the issue's
own probe (dim 96, depth 4, 12 epochs on 5,000 images) still left minimum
MAD at 0.400 against 0.417 for uniform attention on the 8x8 grid, so at 2
epochs attention stays near uniform and the results page reports the uniform
value beside every MAD. No budget that leaves uniform fits the 55-90 minutes.

Sizing (2026-12-01, the 2-core development machine shared with other work,
load average 5-30; "direct" = ``trainables.train.train`` in one process):

    what                                        load    measured
    direct, 1 trial, train on 5,000 images      6       434 images/s; epoch 22 s (11.5 s train,
                                                        ~10 s scoring the 10,000 test images)
    direct, folder decode of 60,000 JPEGs       6       ~5 s per trial
    launcher, 8 trials x 1 epoch, 2 at a time   15-30   81-133 s per trial, 7.5 min for 8
    direct, analysis of one checkpoint          7-22    250 images 14 s, 500: 64 s, 1,000: 105 s
    launcher, analysis, one actor, 250 images   11-17   12-20 s per checkpoint
    chosen: 24 trials x 2 epochs, 72 snapshots          ~32 min train + ~17 min analysis + report

The analysis cost is all model forward passes (52 passes per checkpoint:
PE scales x clean/JPEG/blur/RPI, severities), linear in ``EVAL_SIZE``; the
pool holds one actor on 2 cores (one CPU is left free for Ray Data).
"""

from sweeps.common import StudyOptions, make_trials
from sweeps.study_l import LEE_RECIPE

EPOCHS = 2
MAX_TRAIN_IMAGES = 5000
# Hooks (sweeps/study.py). Every snapshot is measured on this seeded subset of the test split (the studies: the whole split);
# 250 images keep 72 checkpoints within ~17 min on 2 loaded cores (see the sizing table).
EVAL_SIZE = 250
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
