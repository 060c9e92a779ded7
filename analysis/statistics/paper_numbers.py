"""The two papers' reported numbers, and where a study's setting matches them.

References: ``PAPERS`` (``docs/studies.md`` gives the account of both). Figures draw these beside
ours as markers, claims and the conditions table print them, and the page lists them all
(``paper_reference_table``); only where the setting matches (Study P: ImageNet-100 or 224 px; Study L:
CIFAR-100) are they set beside a measured number.
"""

from __future__ import annotations

import pandas as pd

from analysis.statistics.labels import protocol_label
from records.vocab import MODERN

PAPERS = ("Study P, \"Positional Encodings Anchor Spatial Structure in Vision Transformers\" (arXiv 2606.00124); "
          "Study L, \"Inducing Spatial Locality in Vision Transformers through the Training Protocol\" "
          "(arXiv 2605.16390)")

# Study P, "Reported results (4 seeds, mean)": ImageNet-100 at 224 px; FS at JPEG q5 and blur k5 s2.5.
PAPER_P_SETTING = "paper (224 px)"
PAPER_P_MODELS = {
    "ape": {"test_acc": 0.641, "fs_jpeg": 0.435, "fs_blur": 0.184},
    "sincos2d": {"test_acc": 0.657, "fs_jpeg": 0.435, "fs_blur": 0.208},
    "rope2d": {"test_acc": 0.690, "fs_jpeg": 0.299, "fs_blur": 0.147},
    "none": {"test_acc": 0.568, "fs_jpeg": 0.646, "fs_blur": 0.298},
    "ape + RPT": {"test_acc": 0.560, "fs_jpeg": 0.630, "fs_blur": 0.243},
}
# Study P, APE scaling (4 seeds): alpha -> (dSSDC, FS JPEG low, FS JPEG high). Its dSSDC is on the
# paper's estimator (one permutation per batch): it compares with ``dssdc_per_batch`` only. For alpha <= 0.4 the
# paper gives one range, .627-.652, for FS JPEG: kept as a range, not a made-up point. The paper's
# table covers 0.1-1.0: alpha 0 (measured here as a sanity point, equal to `none`) has no reference.
PAPER_P_APE_SCALING = {
    1.0: (0.473, 0.434, 0.434),
    0.9: (0.385, 0.452, 0.452),
    0.8: (0.313, 0.478, 0.478),
    0.7: (0.185, 0.515, 0.515),
    0.6: (0.098, 0.560, 0.560),
    0.5: (0.048, 0.598, 0.598),
    **{a: (0.0, 0.627, 0.652) for a in (0.4, 0.3, 0.2, 0.1)},
}
# Study L, CIFAR-100, one seed; its MAD normalisation is not published, so compare shapes, not digits.
PAPER_L_SETTING = "paper (CIFAR-100, 1 seed)"
PAPER_L_MIN_MAD = {"baseline": 0.316, MODERN: 0.008}
PAPER_L_CUTMIX_MAX, PAPER_L_NO_CUTMIX_MIN = 0.024, 0.210
# Study L, CIFAR-100: "CutMix and AutoAugment each add about 6-7 accuracy points" over baseline (fractions).
PAPER_L_ACC_GAIN = {"cutmix": (0.06, 0.07), "autoaugment": (0.06, 0.07)}


def paper_reference_table() -> pd.DataFrame:
    """The papers' numbers in one table, for reading beside ours when no setting matches."""
    p_setting, l_setting = "ImageNet-100, 224 px, 4 seeds", "CIFAR-100, 1 seed"
    rows = [("Study P", p_setting, m, q, v) for m, d in PAPER_P_MODELS.items()
            for q, v in (("clean acc", d["test_acc"]), ("FS JPEG q5", d["fs_jpeg"]), ("FS blur s2.5", d["fs_blur"]))]
    for alpha, (d, lo, hi) in sorted(PAPER_P_APE_SCALING.items(), reverse=True):
        rows += [("Study P", p_setting, f"ape, alpha {alpha:.1f}",
                  "dSSDC (RPI), the paper's estimator (one permutation per batch)", f"{d:.3f}"),
                 ("Study P", p_setting, f"ape, alpha {alpha:.1f}", "FS JPEG q5",
                  f"{lo:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}")]
    rows += [("Study L", l_setting, protocol_label(proto), "min MAD", v) for proto, v in PAPER_L_MIN_MAD.items()]
    rows += [("Study L", l_setting, "every CutMix condition", "min MAD", f"<= {PAPER_L_CUTMIX_MAX}"),
             ("Study L", l_setting, "every non-CutMix condition", "min MAD", f">= {PAPER_L_NO_CUTMIX_MIN}")]
    rows += [("Study L", l_setting, protocol_label(proto), "accuracy gain over baseline", f"{low:.2f}-{high:.2f}")
             for proto, (low, high) in PAPER_L_ACC_GAIN.items()]
    return pd.DataFrame(rows, columns=["paper", "setting", "condition", "quantity", "value"]).astype({"value": str})


def condition_numbers(dataset: str, model: str, protocol: str, matches_p: bool) -> str:
    """The paper's numbers for one condition where the setting matches (Study P: ``matches_p``,
    ImageNet-100 or 224 px, its models at the baseline protocol; Study L: CIFAR-100), else a dash."""
    said = []
    if protocol == "baseline" and model in PAPER_P_MODELS and matches_p:
        p = PAPER_P_MODELS[model]
        said.append(f"acc {p['test_acc']:.3f}, FS JPEG {p['fs_jpeg']:.3f}, FS blur {p['fs_blur']:.3f}")
    if dataset == "cifar100" and model == "ape" and protocol in PAPER_L_MIN_MAD:
        said.append(f"min MAD {PAPER_L_MIN_MAD[protocol]:.3f}")
    return "; ".join(said) or "—"
