"""The canvas every figure shares: sizes, fonts, the panel grid, axis style, legends, the uniform-attention
MAD line and PNG (150 dpi), SVG and PDF renderings. The report's figures (``analysis.reporting.plotting``,
``figures_*``) and a checkpoint's own figure, drawn by a Ray Data actor (``analysis.measuring.trial_record``),
both draw on it: the actor needs none of the report's stack (pandas, seed statistics, labels).

Figures are ``matplotlib.figure.Figure`` objects rendered by the Agg / SVG / PDF canvases: no pyplot,
no global state, nothing left open.
"""

from __future__ import annotations

import io

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_pdf import FigureCanvasPdf
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.measuring.uniform_attention import uniform_mad

FONT = 10  # axis labels and panel titles
SMALL = 9  # legends and tick labels: the floor for a printed figure
DPI = 150
# The page shows every figure at PX_PER_IN CSS pixels per figure inch, and no figure is wider than
# PAGE_IN: a 9 pt label then renders at 12.5 px in a one-panel and a four-panel figure alike (a wider
# figure would be shrunk to the page by the browser, and its labels with it).
PX_PER_IN = 100
PAGE_IN = 12.0
# An axis showing a quantity in [0, 1] (accuracy, FS, MAD, entropy, SSDC) spans at least this much,
# so a 0.01 seed spread is not drawn as the full height of the axis.
MIN_SPAN = 0.1
MAD_LABEL = "MAD / max grid distance √2(G−1)"


def uniform_level(ax, grid_sides, axis: str = "y") -> None:
    """Draw the uniform-attention MAD of each grid as a dotted line: horizontal for a MAD on y, vertical on x."""
    for grid in grid_sides:
        draw = ax.axhline if axis == "y" else ax.axvline
        draw(uniform_mad(grid), color="0.35", ls=":", lw=1.2, label=f"uniform attention ({grid} x {grid})")


def render_png(fig: Figure, dpi: int = DPI) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _vector(fig: Figure, canvas, fmt: str) -> bytes:
    # Text stays text: SVG <text> elements, TrueType (Type 42) fonts in the PDF, so labels can be edited
    # and searched. Scoped to this call: nothing else in the process sees the rcParams.
    with matplotlib.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42}):
        canvas(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
    FigureCanvasAgg(fig)  # back on the raster canvas, so a later render_png still works
    return buf.getvalue()


def render_svg(fig: Figure) -> bytes:
    """The figure as SVG: vector lines, text as editable <text>."""
    return _vector(fig, FigureCanvasSVG, "svg")


def render_pdf(fig: Figure) -> bytes:
    """The figure as PDF: vector lines, text as embedded TrueType text."""
    return _vector(fig, FigureCanvasPdf, "pdf")


def display_px(fig: Figure) -> int:
    """Width in CSS pixels the page shows the figure at (PX_PER_IN per inch; never over the page)."""
    return round(fig.get_figwidth() * PX_PER_IN)


def grid(nrows: int, ncols: int, w: float = 4.6, h: float = 3.5, **kw) -> tuple[Figure, np.ndarray]:
    """A figure of nrows x ncols panels, w x h inches each, narrowed so the figure fits PAGE_IN: fonts
    keep their size on the page (a wider figure would be scaled down whole). No figure title."""
    w = min(w, PAGE_IN / ncols)
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


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
