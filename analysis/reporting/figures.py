"""Figures of the report, each a pure function of a ``StudyData`` (``analysis.statistics.study_data``): Study P's in
``analysis.reporting.figures_p``, Study L's and the training-time ones in ``analysis.reporting.figures_l``; this module
is their registry (``FIGURES``, in page order) and the report's entry point.

Every figure draws the mean over seeds, its 95% t interval (``seedstats.INTERVAL``; band or bar)
where a condition has two or more seeds, and names the number of seeds behind each line or point
(``n=5``; ``n=3-5`` where it varies along the line); its caption is written from what was drawn (``plotting.Drawn``). A
figure whose data is absent raises ``NoData``; the report shows the reason in its place. Rows of a figure are data sets
(the factorial's facets); factors a figure does not show are held at one value by ``StudyData.pin``, named in the panel
titles and the caption, so nothing is pooled silently. A condition has one colour in every figure (``plotting.colour``).
Style (fonts, ticks, axes, PNG, SVG and PDF) is ``analysis.reporting.plotting``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from analysis.reporting.figures_l import (emergence, entropy_per_layer, mad_entropy, mad_per_layer, protocol_summary,
                                          training_curves)
from analysis.reporting.figures_p import (accuracy_fragility, fragility_severity, pe_scaling, rope_scaling, ssdc_clean,
                                          ssdc_rpi)
from analysis.reporting.plotting import Plot

if TYPE_CHECKING:
    from analysis.statistics.study_data import StudyData

# (section, title for the omission note, function) in page order; sections are page.SECTIONS keys.
FIGURES: tuple[tuple[str, str, Callable[[StudyData], list[Plot]]], ...] = (
    ("P", "SSDC vs depth (clean)", ssdc_clean),
    ("P", "SSDC vs depth under RPI (index coordinates)", ssdc_rpi),
    ("P", "Fragility vs severity (JPEG and blur)", fragility_severity),
    ("P", "Clean accuracy and fragility per model", accuracy_fragility),
    ("P", "PE scaling: dSSDC and FS vs alpha", pe_scaling),
    ("P", "RoPE angle scaling (position interpolation): dSSDC and FS vs alpha", rope_scaling),
    ("L", "Mean attention distance per layer and head", mad_per_layer),
    ("L", "Attention entropy per layer and head", entropy_per_layer),
    ("L", "MAD-entropy space per protocol", mad_entropy),
    ("L", "Minimum MAD and accuracy per protocol", protocol_summary),
    ("T", "Emergence over training (measured checkpoints)", emergence),
    ("T", "Training curves (accuracy per epoch)", training_curves),
)

# What a figure needs beyond its trials' measured checkpoints (``vitsweep analyze``), where a study may
# lack it: (the table it reads, what produces the rest; "" for that table alone). The report's note
# names it where the figure is omitted (``report._to_fill``).
NEEDS: dict[str, tuple[str, str]] = {
    "Clean accuracy and fragility per model": (
        "measurements", "It compares two or more PEs: Study P trains four, with and without RPT "
                        "(`vitsweep sweep study_p`)."),
    "PE scaling: dSSDC and FS vs alpha": (
        "measurements", "Only trials with an additive PE (ape, sincos2d) are measured at PE scales: Study P trains "
                        "them (`vitsweep sweep study_p`)."),
    "RoPE angle scaling (position interpolation): dSSDC and FS vs alpha": (
        "measurements", "Only trials with a RoPE PE (rope2d, rope2d_mixed) are measured at angle scales: Study P "
                        "trains rope2d (`vitsweep sweep study_p`)."),
    "Minimum MAD and accuracy per protocol": (
        "measurements", "It compares two or more protocols: Study L trains eight (`vitsweep sweep study_l`)."),
    "Training curves (accuracy per epoch)": ("epochs", ""),
}
