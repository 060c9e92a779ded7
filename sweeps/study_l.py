"""Study L: the training protocol induces locality (arXiv 2605.16390).

    vitsweep sweep study_l --data-root /data            # 12 conditions x 5 seeds = 60 trials
    ray submit cluster/aws.yaml sweeps/run.py -- study_l --address auto --results s3://BUCKET/vitsweep --mlflow-uri '$VITSWEEP_MLFLOW_URI' --data-root /data

Conditions: {cifar10, cifar100, tinyimagenet} x {baseline, modern}, plus the
other six on/off combinations of {AutoAugment, CutMix, label smoothing} on
CIFAR-100: 12 distinct conditions (cifar100 baseline and modern are shared
between the two parts). Preset ``study_l`` (depth 8, dim 192, 8 heads, MLP
ratio 2: ~2.4M parameters, 8x8 patches), APE, Lee et al.'s recipe (AdamW lr
1e-3, wd 0.05, batch 128, 100 epochs, 10 warm-up, cosine).

Expected (paper, one seed): CIFAR-100 minimum MAD 0.316 (baseline) -> 0.008
(modern); every CutMix condition <= 0.024, every other >= 0.210; CutMix and
AutoAugment each add ~6-7 accuracy points.
"""

from sweeps.common import ALL_PROTOCOLS, StudyOptions, make_trials

DEFAULTS = StudyOptions(datasets=("cifar10", "cifar100", "tinyimagenet"), seeds=5, epochs=100, preset="study_l")
ABLATION_DATASET = "cifar100"


def trials(options: StudyOptions):
    conditions = []
    for dataset in options.datasets:
        protocols = ALL_PROTOCOLS if dataset == ABLATION_DATASET else (ALL_PROTOCOLS[0], ALL_PROTOCOLS[-1])
        conditions += [{"dataset": dataset, "protocol": p.name, "pe": "ape"} for p in protocols]
    return make_trials("study_l", options, conditions)
