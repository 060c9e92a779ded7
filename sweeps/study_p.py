"""Study P: positional encodings anchor spatial structure (arXiv 2606.00124).

    vitsweep sweep study_p --data-root /data --gpus-per-trial 1      # 7 conditions x 4 seeds = 28 trials
    ray submit cluster/aws.yaml sweeps/run.py -- study_p --address auto --results s3://BUCKET/vitsweep --mlflow-uri '$VITSWEEP_MLFLOW_URI' --data-root /data --gpus-per-trial 1

Conditions: PE {none, ape, sincos2d, rope2d} with fixed token order, plus
{ape, sincos2d, rope2d} with RPT (random patch permutation in training); the
redundant none + RPT is left out (``none`` is permutation-equivariant, so RPT
trains the same model). ImageNet-100 at 224 px with preset ``study_p`` (D 384,
12 blocks, 8 heads, dropout 0.15, drop path 0.2, APE init N(0, 1)); lr 1e-3,
wd 5e-2, batch 128, 60 epochs, baseline protocol.

Optimiser: the paper's literal recipe, ``torch.optim.Adam(model.parameters(),
lr=1e-3, weight_decay=5e-2)``: coupled L2 added to the gradient of *every*
parameter (``optimizer=adam``, ``decay_exempt=none``), the APE table, CLS token,
norms and biases included. That is the paper's words, not a measured choice:
whether ViT-S at 224 px learns under it is not known (on ``tiny``/``shapes`` the
coupled-L2 mix stays at chance where AdamW learns, and at init the decay term is
~126x the gradient of the N(0, 1) APE table). ``bench/recipe_pilot.py`` compares
it with today's mix (Adam, timm exemptions) and AdamW 0.05 on real images; until
its GPU run exists this default stands, and trials that end within 2 points of
chance are flagged ``did_not_learn`` and left out of the claims. Try another arm
with ``--set optimizer=adamw --set decay_exempt=timm``.

Expected (paper, 4 seeds): clean accuracy rope2d 0.690 > sincos2d 0.657 >
ape 0.641 > none 0.568 ~ ape+RPT 0.560; FS under JPEG q5 lowest for rope2d
(0.299), highest for none (0.646) and ape+RPT (0.630); under RPI, none and RPT
collapse to SSDC ~0 while ape/sincos2d recover early (dSSDC ~0.47 for APE).
"""

from sweeps.common import StudyOptions, make_trials

DEFAULTS = StudyOptions(datasets=("imagenet100",), seeds=4, epochs=60, preset="study_p")
PES = ("none", "ape", "sincos2d", "rope2d")
RECIPE = {"optimizer": "adam", "decay_exempt": "none", "lr": 1e-3, "weight_decay": 5e-2, "batch_size": 128,
          "protocol": "baseline"}


def conditions(datasets, *, include_none_rpt: bool = False):
    for dataset in datasets:
        for pe in PES:
            yield {"dataset": dataset, "pe": pe, "rpt": False}
        for pe in PES:
            if pe != "none" or include_none_rpt:
                yield {"dataset": dataset, "pe": pe, "rpt": True}


def trials(options: StudyOptions):
    return make_trials("study_p", options, conditions(options.datasets), base=RECIPE)
