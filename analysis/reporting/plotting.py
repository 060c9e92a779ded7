"""Plot helpers of the report's figures (``analysis.reporting.figures``): one colour per condition in every figure
(``colour``), axes fitted to the data, panel letters, captions written from what was drawn (``Drawn``,
``plot``) and the marks (mean lines, seed dots, CI bars). The canvas they draw on (sizes, fonts,
renderings) is ``analysis.measuring.canvas``'s. Titles belong to the page (the report's headings): a figure
carries only its panels' titles, so a title never appears twice.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import offset_copy

from analysis.measuring.canvas import FONT
from analysis.statistics.labels import model_key, model_label, protocol_label
from analysis.statistics.seedstats import INTERVAL, seed_summary
from records.vocab import MODERN, canonical_protocol

LETTER = "panel letter"  # label of the panel-letter texts
PAPER_MARKER = {"marker": "*", "ms": 12, "mec": "k", "mew": 0.7, "ls": "none", "zorder": 5}
UNIFORM_TEXT = "Dotted: the MAD of uniform attention over the patches on the grid (G x G)."


def grids(trials: pd.DataFrame, dataset: str | None = None) -> list[int]:
    """The patch grids G of ``trials`` (of one data set), from their img_size / patch_size columns
    (a trial that lacks either, ``unset`` once the tables are cleaned, adds none)."""
    t = trials if dataset is None else trials[trials["dataset"] == dataset]
    if t.empty or not {"img_size", "patch_size"} <= set(t):
        return []
    size, patch = (pd.to_numeric(t[c], errors="coerce") for c in ("img_size", "patch_size"))
    known = size.notna() & patch.notna() & (patch > 0)
    return sorted({int(i) // int(p) for i, p in zip(size[known], patch[known])})


# -- one colour per condition ------------------------------------------------------------------
# Figures draw two kinds of series: models (pe x token order) at the baseline protocol (Study P) and
# protocols at ape, fixed order (Study L). The two meet at the reference condition (ape, baseline),
# which is one colour in both. Keys are the registries' names (trainables.model.pos_embed.POS_EMBEDS,
# trainables.data.protocols.PROTOCOLS; tests/test_figures.py checks every one has its own colour).
PE_COLOURS = {"none": "#7f7f7f", "ape": "#1f77b4", "sincos2d": "#ff7f0e", "rope2d": "#2ca02c",
              "rope2d_mixed": "#9467bd"}
PROTOCOL_COLOURS = {"baseline": PE_COLOURS["ape"], "label_smoothing": "#bcbd22", "cutmix": "#d62728",
                    "cutmix+label_smoothing": "#e377c2", "autoaugment": "#17becf",
                    "autoaugment+label_smoothing": "#393b79", "autoaugment+cutmix": "#8c564b", MODERN: "#637939"}
COLOURS = {**PE_COLOURS, **PROTOCOL_COLOURS}
# Names the map has not seen: a colour from these, picked by a stable hash of the name (crc32, not
# Python's salted hash), so a new PE or protocol keeps its colour across figures and runs.
_FALLBACK = [to_hex(c) for c in colormaps["tab20b"].colors if to_hex(c) not in COLOURS.values()]
RPT_DARKEN = 0.45  # RPT (random patch order in training): its PE's colour, darker, dashed


def named_colour(name: str) -> str:
    """The colour of a PE or protocol name; a deterministic default for a name not in ``COLOURS``."""
    name = canonical_protocol(str(name))
    return COLOURS.get(name) or _FALLBACK[zlib.crc32(name.encode()) % len(_FALLBACK)]


def colour(pe: str = "ape", rpt: bool = False, protocol: str = "baseline") -> str:
    """The one colour of the condition (pe, token order, protocol) in every figure, as ``#rrggbb``."""
    protocol = canonical_protocol(str(protocol))
    if protocol == "baseline":
        base = named_colour(pe)
    elif pe == "ape":
        base = named_colour(protocol)
    else:  # neither study's series: the pair's own default
        base = named_colour(f"{pe}/{protocol}")
    return to_hex(tuple(c * (1 - RPT_DARKEN) for c in to_rgb(base))) if rpt else base


def model_style(pe: str, rpt: bool, protocol: str = "baseline") -> dict:
    return {"color": colour(pe, rpt, protocol), "ls": "--" if rpt else "-", "marker": "s" if rpt else "o"}


# -- what a figure drew: the caption says that and no more --------------------------------------
@dataclass
class Drawn:
    n: dict[str, int] = field(default_factory=dict)  # condition -> seeds behind its marks (the most)
    lines: bool = False  # mean lines
    points: bool = False  # single-seed dots beside a mean marker
    ci: set[str] = field(default_factory=set)  # "bands", "bars": seedstats.INTERVAL drawn (need n >= 2)
    se: bool = False  # a sampling SE bar (binomial for accuracy, delta method for FS)

    def count(self, name: str, n: int) -> None:
        self.n[name] = max(int(n), self.n.get(name, 0))


_DRAWN: WeakKeyDictionary[Figure, Drawn] = WeakKeyDictionary()


def drawn(fig: Figure) -> Drawn:
    return _DRAWN.setdefault(fig, Drawn())


def spread(fig: Figure) -> str:
    """The caption's sentence on what the marks are: CI wording only where a CI was drawn, n per condition."""
    d = drawn(fig)
    if not d.n:
        return ""
    several = max(d.n.values()) > 1
    parts = []
    if d.lines:
        parts.append("lines: mean over seeds" if several else "lines: one seed each")
    if d.points:
        parts.append("small dots: single seeds; large dots: their mean" if several else "dots: one seed each")
    if d.ci:
        parts.append(f"{' and '.join(sorted(d.ci))}: {INTERVAL} of the mean over seeds"
                     + (" (none where n = 1)" if min(d.n.values()) == 1 else ""))
    elif not several:
        parts.append("no interval over seeds")
    if d.se:
        parts.append("grey bars: ± sampling SE of one trial's value from its evaluation images (binomial for "
                     "accuracy, delta method over the paired counts for FS)")
    ns = sorted(set(d.n.values()))
    if len(ns) == 1:
        counts = f"n = {ns[0]} seed{'s' if ns[0] > 1 else ''} per condition"
    elif len(d.n) <= 8:
        counts = "n (seeds) per condition: " + ", ".join(f"{k} {v}" for k, v in d.n.items())
    else:
        counts = f"n = {ns[0]}-{ns[-1]} seeds per condition (each legend entry or tick names its own)"
    text = "; ".join(parts) + "; " + counts + "."
    return text[0].upper() + text[1:]


def caption(fig: Figure, text: str, pinned: str = "") -> str:
    pinned = "; ".join(dict.fromkeys(p for p in pinned.split("; ") if p))  # panels often pin alike
    return f"{text} {spread(fig)}".strip() + (f" Other factors held at: {pinned}." if pinned else "")


@dataclass
class Plot:
    title: str
    figure: Figure
    caption: str


class NoData(Exception):
    """A figure's inputs are absent; the message is the note shown in its place."""


def plot(title: str, fig: Figure, text: str, pinned: str = "") -> Plot:
    """The finished figure: panel letters on a multi-panel figure, the caption from what was drawn."""
    letter_panels(fig)
    return Plot(title, fig, caption(fig, text, pinned))


def letter_panels(fig: Figure) -> None:
    """a, b, c ... at the top left of each visible panel, in reading order; none on a single panel."""
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    if len(panels) > 1:
        # Above the y tick labels, left of the panel: never on the panel's title, however long.
        for i, ax in enumerate(panels):
            ax.text(0, 1, chr(ord("a") + i), transform=offset_copy(ax.transAxes, fig, x=-6, y=5, units="points"),
                    ha="right", va="bottom", fontweight="bold", fontsize=FONT + 1, label=LETTER)


# -- layout and style ----------------------------------------------------------------------------
def fitted(values, pad: float = 0.06, min_span: float = 0.05) -> tuple[float, float]:
    """Axis limits around the finite ``values`` with ``pad`` of the span on each side (no pinned edge)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    low, high = float(v.min()), float(v.max())
    if high - low < min_span:
        mid = (low + high) / 2
        low, high = mid - min_span / 2, mid + min_span / 2
    margin = (high - low) * pad
    return low - margin, high + margin


def panel_title(rows: pd.DataFrame, *extra: str) -> str:
    """The panel's factor values: its data set, and model and protocol where the panel holds one."""
    parts = [", ".join(datasets(rows))] if "dataset" in rows and not rows.empty else []
    if {"pe", "rpt"} <= set(rows) and rows.groupby(["pe", "rpt"]).ngroups == 1:
        parts.append(model_label(rows["pe"].iloc[0], bool(rows["rpt"].iloc[0])))
    if "protocol" in rows and rows["protocol"].nunique() == 1:
        parts.append(protocol_label(rows["protocol"].iloc[0]))
    return ", ".join([*parts, *filter(None, extra)])


# -- marks ---------------------------------------------------------------------------------------
def n_label(ns) -> str:
    ns = [int(n) for n in ns]
    lo, hi = min(ns), max(ns)
    return f"n={lo}" if lo == hi else f"n={lo}-{hi}"


def line(ax, x, s: pd.DataFrame, label: str, name: str | None = None, **style) -> None:
    """Mean line with its CI band where n >= 2; x and s aligned. ``name``: the condition the caption
    counts (default: the label without its n)."""
    x = np.asarray(x, dtype=float)
    ax.plot(x, s["mean"], label=label, ms=4, lw=1.6, **style)
    low, high = s["low"].to_numpy(float), s["high"].to_numpy(float)
    ok = np.isfinite(low) & np.isfinite(high)
    d = drawn(ax.figure)
    d.lines = True
    d.count(name or label.split(" (n=")[0], s["n"].max() if len(s) else 0)
    if ok.any():
        ax.fill_between(x[ok], low[ok], high[ok], color=style.get("color"), alpha=0.15, lw=0)
        d.ci.add("bands")


def ci_bar(s) -> list | None:
    """Asymmetric error bar [[below], [above]] of a ``Summary``'s CI; none for a single seed."""
    return [[s.mean - s.low], [s.high - s.mean]] if s.n > 1 else None


def points(ax, x: float, values, colour, name: str, label: str | None = None, se: float = float("nan")) -> None:
    """Every seed as a dot beside the mean (± its 95% t interval where n >= 2); ``se``, when known, as a grey ±
    bar beside it. ``name``: the condition the caption counts."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    s = seed_summary(v)
    if s.n == 0:
        return
    d = drawn(ax.figure)
    d.points = True
    if s.n > 1:
        d.ci.add("bars")
    d.count(name, s.n)
    offsets = np.linspace(-0.12, 0.12, v.size) if v.size > 1 else np.zeros(1)
    # A category owns the unit around its x: the outermost mean never sits on the axis spine.
    ax.update_datalim([(x - 0.5, s.mean), (x + 0.5, s.mean)], updatey=False)
    ax.plot(x - 0.2 + offsets, v, "o", ms=3, color=colour, alpha=0.45, mew=0)
    ax.errorbar([x], [s.mean], yerr=ci_bar(s), fmt="o", color=colour, ms=6, capsize=4, lw=1.5, label=label)
    if np.isfinite(se):
        ax.errorbar([x + 0.14], [s.mean], yerr=[[se], [se]], fmt="none", ecolor="0.45", capsize=2, lw=1)
        d.se = True


def mean_point(ax, xs, ys, name: str, **style) -> None:
    """The mean over seeds of (x, y), with 95% t intervals on both axes where n >= 2."""
    sx, sy = seed_summary(xs), seed_summary(ys)
    if sx.n == 0 or sy.n == 0:
        return
    d = drawn(ax.figure)
    d.count(name, min(sx.n, sy.n))
    if sx.n > 1:
        d.ci.add("bars")
    ax.errorbar([sx.mean], [sy.mean], xerr=ci_bar(sx), yerr=ci_bar(sy), fmt="o", ms=6, elinewidth=1, **style)


def by_model(s: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    return sorted(s.groupby(["pe", "rpt"]), key=lambda kg: model_key(*kg[0]))


def datasets(df: pd.DataFrame) -> list[str]:
    return sorted(map(str, df["dataset"].unique()))


def held(df: pd.DataFrame, factor: str, default: str = "baseline") -> str:
    """The one value a pinned frame holds ``factor`` at (the colour of its series depends on it)."""
    values = df[factor].unique() if factor in df else []
    return str(values[0]) if len(values) == 1 else default


def paper_handle(label: str) -> Line2D:
    return Line2D([], [], color="w", markerfacecolor="w", label=label, **{k: v for k, v in PAPER_MARKER.items()
                                                                         if k != "ls"})
