"""Plot style and helpers shared by the report's figures (``analysis.figures``) and each trial's
own figures (``analysis.figures_trial``): sizes and fonts fit for a paper (legends and ticks at
9 pt or more, integer layer ticks, PNG at 150 dpi with an SVG beside it), seed-spread lines and
points, and y ranges that never blow seed noise up to the full height of an axis.

Figures are ``matplotlib.figure.Figure`` objects rendered by the Agg / SVG canvases: no pyplot,
no global state, nothing left open. Titles belong to the page (the report's headings): a figure
carries only its panels' titles, so a title never appears twice.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from analysis.claims import MODERN, model_key, protocol_key, seed_summary

FONT = 10  # axis labels and panel titles
SMALL = 9  # legends and tick labels: the floor for a printed figure
DPI = 150
# An axis showing a quantity in [0, 1] (accuracy, FS, MAD, entropy, SSDC) spans at least this much,
# so a 0.01 seed spread is not drawn as the full height of the axis.
MIN_SPAN = 0.1
MAD_LABEL = "MAD / max grid distance √2(G−1)"


SPREAD = "Lines: mean over seeds; bands/bars: 95% bootstrap CI of the mean; n = seeds."
PE_COLOURS = {"none": "#7f7f7f", "ape": "#1f77b4", "sincos2d": "#ff7f0e", "rope2d": "#2ca02c",
              "rope2d_mixed": "#9467bd"}
PAPER_MARKER = {"marker": "*", "ms": 12, "mec": "k", "mew": 0.7, "ls": "none", "zorder": 5}


class NoData(Exception):
    """A figure's inputs are absent; the message is the note shown in its place."""


@dataclass
class Plot:
    title: str
    figure: Figure
    caption: str


def render_png(fig: Figure, dpi: int = DPI) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def render_svg(fig: Figure) -> bytes:
    """The figure as SVG (vector: text stays text, lines stay lines)."""
    FigureCanvasSVG(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    FigureCanvasAgg(fig)  # back on the raster canvas, so a later render_png still works
    return buf.getvalue()


def style(ax, *, layer_axis: str | None = None, min_span: float | None = MIN_SPAN) -> None:
    """Paper-size fonts on one axis; integer ticks on ``layer_axis`` ("x" or "y"); a y range of at
    least ``min_span`` around the data (None: leave it), clipped to where the data can go."""
    ax.tick_params(labelsize=SMALL)
    ax.title.set_fontsize(FONT)
    ax.xaxis.label.set_fontsize(FONT)
    ax.yaxis.label.set_fontsize(FONT)
    if layer_axis:
        getattr(ax, f"{layer_axis}axis").set_major_locator(MaxNLocator(integer=True))
    if min_span:
        low, high = ax.get_ylim()
        if high - low < min_span:
            mid = (low + high) / 2
            ax.set_ylim(mid - min_span / 2, mid + min_span / 2)


def legend(ax, **kw) -> None:
    """A legend at the paper floor size (never smaller than ``SMALL``)."""
    if kw.get("handles") is not None or ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=SMALL, **kw)


# -- helpers -------------------------------------------------------------------------
def grid(nrows: int, ncols: int, w: float = 4.6, h: float = 3.5, **kw) -> tuple[Figure, np.ndarray]:
    """A figure of nrows x ncols panels, w x h inches each; no figure title (the page has it)."""
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def n_label(ns) -> str:
    ns = [int(n) for n in ns]
    lo, hi = min(ns), max(ns)
    return f"n={lo}" if lo == hi else f"n={lo}-{hi}"


def caption(text: str, pinned: str, spread: str = SPREAD) -> str:
    pinned = "; ".join(dict.fromkeys(p for p in pinned.split("; ") if p))  # panels often pin alike
    return f"{text} {spread}".strip() + (f" Other factors held at: {pinned}." if pinned else "")


def model_style(pe: str, rpt: bool) -> dict:
    return {"color": PE_COLOURS.get(pe, "#8c564b"), "ls": "--" if rpt else "-", "marker": "s" if rpt else "o"}


def protocol_colour(name: str) -> str:
    order = sorted(["baseline", "autoaugment", "cutmix", "label_smoothing", "autoaugment+cutmix",
                    "autoaugment+label_smoothing", "cutmix+label_smoothing", MODERN], key=protocol_key)
    return colormaps["tab10"](order.index(name) if name in order else 9)


def line(ax, x, s: pd.DataFrame, label: str, **style) -> None:
    """Mean line with its CI band; x and s aligned."""
    x = np.asarray(x, dtype=float)
    ax.plot(x, s["mean"], label=label, ms=4, lw=1.6, **style)
    low, high = s["low"].to_numpy(float), s["high"].to_numpy(float)
    ok = np.isfinite(low) & np.isfinite(high)
    if ok.any():
        ax.fill_between(x[ok], low[ok], high[ok], color=style.get("color"), alpha=0.15, lw=0)


def ci_bar(s) -> list | None:
    """Asymmetric error bar [[below], [above]] of a ``Summary``'s CI; none for a single seed."""
    return [[s.mean - s.low], [s.high - s.mean]] if s.n > 1 else None


def points(ax, x: float, values, colour, label: str | None = None, se: float = float("nan")) -> None:
    """Every seed as a dot beside the mean ± 95% CI bar; ``se``, when known, as a grey ± bar beside it."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    s = seed_summary(v)
    if s.n == 0:
        return
    offsets = np.linspace(-0.12, 0.12, v.size) if v.size > 1 else np.zeros(1)
    ax.plot(x - 0.2 + offsets, v, "o", ms=3, color=colour, alpha=0.45, mew=0)
    ax.errorbar([x], [s.mean], yerr=ci_bar(s), fmt="o", color=colour, ms=6, capsize=4, lw=1.5, label=label)
    if np.isfinite(se):
        ax.errorbar([x + 0.14], [s.mean], yerr=[[se], [se]], fmt="none", ecolor="0.45", capsize=2, lw=1)


def by_model(s: pd.DataFrame):
    groups = {k: g for k, g in s.groupby(["pe", "rpt"])}
    for key in sorted(groups, key=lambda k: model_key(*k)):
        yield key, groups[key]


def datasets(df: pd.DataFrame) -> list[str]:
    return sorted(map(str, df["dataset"].unique()))


def paper_handle(label: str) -> Line2D:
    return Line2D([], [], color="w", markerfacecolor="w", label=label, **{k: v for k, v in PAPER_MARKER.items()
                                                                         if k != "ls"})
