"""Pilot III: Study L's CutMix claims, baseline vs CutMix on every batch, on all of CIFAR-10 at CPU scale.

    vitsweep sweep pilot --data-root DIR --stage all    # 2 conditions x 5 seeds = 10 trials, ~70 min on 2 idle cores
    vitsweep sweep pilot --data-root DIR --dry-run      # the trial table, nothing started
    PYTHONPATH=. python3 bench/pilot_page.py --results results   # docs/pilot/: tables kept, page and figures

DIR holds any ``train/<class>/`` + ``test/<class>/`` layout of images (data set ``folder``); the pilot is sized
on ``cifar10-jpeg`` (``../shared/data/cifar10-jpeg.tar.gz`` unpacked: 50,000 training and 10,000 test images at
32 px). Results: ``docs/pilot/`` (the page, its figures and the pilot's tables, kept so the page can be rebuilt).

Conditions (2): Study L's baseline and CutMix, APE, each with 5 seeds, on the whole training split. Recipe: Lee
et al.'s (``sweeps.studies.study_l.LEE_RECIPE``: AdamW lr 1e-3, wd 0.05 on every parameter, pad-4 crop + flip, batch
128, 1 warm-up epoch then cosine) but CutMix mixes every batch (``cutmix_prob`` 1, Lee's is 0.5): an amplifier of Study
L's mechanism, not Lee's recipe. Pilot II (CutMix on half the batches, 5 epochs) left the baseline's minimum MAD 0.029
below uniform and CutMix's estimate 0.005 above it; a single seed trained 10 epochs took the baseline 0.051 below
uniform. Model: preset ``tiny`` deepened to 4 blocks (dim 64, 4 heads, MLP ratio 2, 8x8 patches of 4 px, ~0.2M
parameters; uniform attention has MAD 0.418 on 8x8).

Claims tested (``analysis.statistics.claims``, registered before the run): CutMix vs baseline on the network's minimum
MAD (and its separation form), the early layers' mean MAD and mean entropy, and test accuracy: one Holm family of 5
rows, so at 5 paired seeds the first Holm step's MDE is 2.2 sd of the paired differences (1.36 sd unadjusted).
5 seeds: the fewest at which a directional claim can decide (the exact sign-flip test's smallest p with 5 pairs
is 1/32).

Every epoch scores a fixed class-stratified 1,000-image subset of the test split (``epoch_eval_images``), the
last the whole split (``test_acc``). The analysis measures every snapshot training writes (log-spaced: epochs 0,
1, 2, 4, 8 and the last) on the same 1,000 test images (``EVAL_SIZE``: the stratified subset every epoch
scores, the same for every snapshot and trial), one single-threaded actor per core.

Sizing, measured 2026-12-06 on this machine (2 cores, AMD EPYC; shared with five other helpers, so wall rates say
little and the idle rates are estimated from CPU seconds, user + sys): one epoch of the CutMix arm on the whole
split (the command below), and the analysis of its snapshots (``analysis.measuring.evaluate.evaluate_checkpoint``):

    what                                        threads  load avg  wall    CPU s   idle estimate
    one epoch, whole split (+ start-up, and     2        1.4-12    702 s   336     325 img/s (a floor: 2 threads
      the 10,000 test images scored after it)                                       spin-wait while the machine is
                                                                                    oversubscribed)
    the same                                    1        11-31     316 s   75.3    806 img/s per core
    start-up + 10 steps + the 10,000 images     1        12-16      84 s   13.7    (62 CPU s for the epoch's
                                                                                    50,000 images)
    analysis of one snapshot, 1,000 images      1        18-35     ~100 s  23.5    23.5 s per snapshot

The launcher trains one trial per core with one thread (two at once), so an idle machine trains ~1,600 images/s.
Plan for ``EPOCHS`` = 10:

    training  10 trials x (10 epochs x 62 s + 14 s) / 2 cores                = 53 min
    analysis  10 trials x 6 snapshots (0, 1, 2, 4, 8, 10) x 23.5 s / 2 actors  = 12 min
    Ray start-up per trial (~15 s) and the report                              = ~3 min; ~68 min in all idle

10 epochs fit the 110 minutes down to ~900 images/s for the machine (Pilot II's run reached about that with the
machine shared: 325-565 images/s per trial): 93 + 12 min. 12 would fit only above ~1,030 images/s, 8 is the
choice at 850 or less. The timed epoch (1 thread: ``OMP_NUM_THREADS=1``):

    python -m trainables.loop.train --dataset folder --data-root DIR --preset tiny --protocol cutmix --epochs 1 \\
        --set dim=64 --set depth=4 --set heads=4 --set mlp_ratio=2.0 --set decay_exempt=none \\
        --set crop_padding=4 --set cutmix_prob=1.0 --set epoch_eval_images=1000 --set study=pilot
"""

from sweeps.studies.common import StudyOptions, make_trials
from sweeps.studies.study_l import LEE_RECIPE

EPOCHS = 10
SEEDS = 5
PROTOCOLS = ("baseline", "cutmix")
EPOCH_EVAL_IMAGES = 1000
# Hooks (sweeps/studies/study.py): the analysis measures every snapshot on the same 1,000 test images, so the page
# draws emergence over training and the per-layer table at each snapshot.
EVAL_SIZE = 1000
CHECKPOINTS = "all"
MODEL = {"dim": 64, "depth": 4, "heads": 4, "mlp_ratio": 2.0}
RECIPE = {**LEE_RECIPE, "cutmix_prob": 1.0, **MODEL, "batch_size": 128, "lr": 1e-3, "weight_decay": 0.05,
          "warmup_epochs": 1, "epoch_eval_images": EPOCH_EVAL_IMAGES}
DEFAULTS = StudyOptions(datasets=("folder",), seeds=SEEDS, epochs=EPOCHS, preset="tiny")


def trials(options: StudyOptions):
    conditions = [{"dataset": dataset, "pe": "ape", "protocol": protocol}
                  for dataset in options.datasets for protocol in PROTOCOLS]
    return make_trials("pilot", options, conditions, base=RECIPE)
