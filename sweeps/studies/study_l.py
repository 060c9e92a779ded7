r"""Study L: the training protocol induces locality (arXiv 2605.16390).

    vitsweep sweep study_l --data-root /data            # 12 conditions x 5 seeds = 60 trials
    ray submit cluster/aws.yaml sweeps/run.py -- study_l --address auto --results s3://BUCKET/vitsweep \
        --mlflow-uri '$VITSWEEP_MLFLOW_URI' --data-root /data --gpus-per-trial 1

Conditions: {cifar10, cifar100, tinyimagenet} x {baseline, modern}, plus the
other six on/off combinations of {AutoAugment, CutMix, label smoothing} on
CIFAR-100: 12 distinct conditions (cifar100 baseline and modern are shared
between the two parts). Preset ``study_l`` (depth 8, dim 192, 8 heads, MLP
ratio 2: ~2.4M parameters, 8x8 patches), APE, Lee et al.'s recipe (AdamW lr
1e-3, wd 0.05, batch 128, 100 epochs, 10 warm-up, cosine). Where Study L is
silent, ``LEE_RECIPE`` follows Lee et al.'s script (aanna0701/SPT_LSA_ViT,
main.py): ``AdamW(model.parameters(), weight_decay=0.05)`` decays every
parameter (``decay_exempt=none``), ``RandomCrop(img_size, padding=4)`` pads 4
px at 32 and 64 px alike (``crop_padding=4``), CutMix mixes a batch with
probability 0.5 (``cutmix_prob``). Test-scored runs train on the whole
training split (no holdout). Lee's Mixup, random erasing, repeated
augmentation, stochastic depth and PIL AutoAugment port stay out: Study L
defines its protocols without them (docs/studies.md, "Protocol choices").

Expected (paper, one seed): CIFAR-100 minimum MAD 0.316 (baseline) -> 0.008
(modern); every CutMix condition <= 0.024, every other >= 0.210; CutMix and
AutoAugment each add ~6-7 accuracy points.
"""

from records.vocab import SETTINGS
from sweeps.studies.common import StudyOptions, make_trials

# 5 seeds: the fewest at which a claim's exact sign-flip check can reach p < 0.05 (1/32) beside its t test.
DEFAULTS = StudyOptions(datasets=("cifar10", "cifar100", "tinyimagenet"), seeds=5, epochs=100, preset="study_l")
ABLATION_DATASET = "cifar100"
LEE_RECIPE = {"decay_exempt": "none", "crop_padding": 4, "cutmix_prob": 0.5}
# Hook (sweeps/studies/study.py): the analysis stage measures every snapshot, so `--stage all` draws Study L's
# emergence of locality over training, not only the final checkpoint.
CHECKPOINTS = "all"


def trials(options: StudyOptions):
    conditions = []
    for dataset in options.datasets:
        protocols = SETTINGS if dataset == ABLATION_DATASET else (SETTINGS[0], SETTINGS[-1])  # baseline, modern
        conditions += [{"dataset": dataset, "protocol": p, "pe": "ape"} for p in protocols]
    return make_trials("study_l", options, conditions, base=LEE_RECIPE)
