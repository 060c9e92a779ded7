"""The valid names a user types, without importing torch: for `--help` and early checks.

`vitsweep --help` must answer in a moment, and importing torch, torchvision,
Ray or MLflow costs 10-40 s cold. These tuples copy the keys of the real
registries (`trainables.pos_embed.POS_EMBEDS`, `trainables.protocols.PROTOCOLS`,
`trainables.datasets.DATASETS`, `trainables.vit.PRESETS`);
`tests/test_names.py` fails when they drift apart, so a new registry entry
needs one line here too.
"""

from sweeps import STUDIES

PES = ("none", "ape", "sincos2d", "rope2d", "rope2d_mixed")
PROTOCOLS = (
    "baseline", "label_smoothing", "cutmix", "cutmix+label_smoothing", "autoaugment",
    "autoaugment+label_smoothing", "autoaugment+cutmix", "autoaugment+cutmix+label_smoothing", "modern",
)
DATASETS = ("shapes", "cifar10", "cifar100", "tinyimagenet", "imagenet100", "folder")
PRESETS = ("study_l", "study_p", "vit_s", "tiny")

__all__ = ["STUDIES", "PES", "PROTOCOLS", "DATASETS", "PRESETS"]
