"""The valid names a user types, with no imports: the one torch-free copy of the registries' keys.

`vitsweep --help`, the pre-torch CLI checks (`sweeps/validate.py`) and the report (whose figures and
claims order PEs as the registry does) must not wait 10-40 s for torch. These tuples copy the keys of
the real registries, in their order (`trainables.pos_embed.POS_EMBEDS`, `trainables.protocols.PROTOCOLS`,
`trainables.datasets.DATASETS`, `trainables.vit.PRESETS`); `tests/test_names.py` fails when they drift
apart, so a new registry entry needs its name here too (nowhere else).
"""

PES = ("none", "ape", "sincos2d", "rope2d", "rope2d_mixed")
PROTOCOLS = (
    "baseline", "label_smoothing", "cutmix", "cutmix+label_smoothing", "autoaugment",
    "autoaugment+label_smoothing", "autoaugment+cutmix", "autoaugment+cutmix+label_smoothing", "modern",
)
DATASETS = ("shapes", "cifar10", "cifar100", "tinyimagenet", "imagenet100", "folder")
PRESETS = ("study_l", "study_p", "vit_s", "tiny")
