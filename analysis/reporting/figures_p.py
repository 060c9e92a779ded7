"""Study P's figures (SSDC, fragility, PE and RoPE scaling, accuracy per model): pure functions of a
``StudyData``; series are models (pe x token order), coloured by ``plotting.colour`` at the protocol the
figure holds. Entry points: ``analysis.reporting.figures``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analysis.measuring import canvas
from analysis.reporting import plotting as pl
from analysis.statistics.labels import model_key, model_label
from analysis.statistics.paper_numbers import PAPER_P_APE_SCALING, PAPER_P_MODELS, PAPER_P_SETTING
from analysis.statistics.seedstats import summarise
from records import vocab

if TYPE_CHECKING:
    from analysis.statistics.study_data import StudyData


def _model_lines(ax, df, s, x: str) -> None:
    """One mean line per model of summary ``s`` (columns pe, rpt, ``x``), in the colour of its condition."""
    protocol = pl.held(df, "protocol")
    for (pe, rpt), g in pl.by_model(s):
        pl.line(ax, g[x], g, f"{model_label(pe, rpt)} ({pl.n_label(g['n'])})", **pl.model_style(pe, rpt, protocol))


def _ssdc_depth(data: StudyData, intervention: str, title: str, text: str) -> list[pl.Plot]:
    df = data.select(intervention, "ssdc", per_layer=True)
    if df.empty:
        raise pl.NoData(f"no ({intervention}, ssdc) rows at the final checkpoint")
    df, pinned = data.pin(df, {"pe", "rpt"})
    datasets = pl.datasets(df)
    fig, axes = canvas.grid(1, len(datasets), sharey=True)
    for ax, ds in zip(axes[0], datasets):
        rows = df[df["dataset"] == ds]
        _model_lines(ax, rows, summarise(rows, ["pe", "rpt", "layer"]), "layer")
        ax.axhline(0, color="k", lw=0.6)
        ax.set(title=pl.panel_title(rows), xlabel="layer l (input of block l)", ylabel="SSDC")
        canvas.style(ax, layer_axis="x")
        canvas.legend(ax)
    return [pl.plot(title, fig, text, pinned)]


def ssdc_clean(data: StudyData) -> list[pl.Plot]:
    return _ssdc_depth(data, "clean", "SSDC vs depth (clean)",
                       "Spearman correlation of token cosine similarity with negative grid distance, per layer.")


def ssdc_rpi(data: StudyData) -> list[pl.Plot]:
    return _ssdc_depth(data, "rpi", "SSDC vs depth under RPI (index coordinates)",
                       "Patch tokens permuted at inference, SSDC scored against index coordinates: structure that "
                       "survives is anchored to indices (PE), content-driven structure falls to ~0. Solid: fixed "
                       "token order in training; dashed: RPT.")


def fragility_severity(data: StudyData) -> list[pl.Plot]:
    title = "Fragility vs severity (JPEG and blur)"
    kinds = [(k, label) for k, label in (("jpeg", "JPEG quality (lower = harsher)"), ("blur", "blur sigma (kernel 5)"))
             if not data.select(k, "fs").empty]
    if not kinds:
        raise pl.NoData("no (jpeg, fs) or (blur, fs) rows at the final checkpoint")
    frames = {k: data.pin(data.select(k, "fs"), {"pe", "rpt"}) for k, _ in kinds}
    datasets = sorted(set().union(*(pl.datasets(f) for f, _ in frames.values())))
    fig, axes = canvas.grid(len(datasets), len(kinds))
    for row, ds in enumerate(datasets):
        for col, (kind, xlabel) in enumerate(kinds):
            ax, df = axes[row, col], frames[kind][0]
            rows = df[df["dataset"] == ds]
            s = summarise(rows, ["pe", "rpt", "level"])
            _model_lines(ax, rows, s, "level")
            for (pe, rpt), _ in pl.by_model(s):
                paper = PAPER_P_MODELS.get(model_label(pe, rpt))
                if paper and data.matches_paper_p(ds):
                    x = float(vocab.JPEG_HEADLINE) if kind == "jpeg" else vocab.BLUR_HEADLINE[1]
                    ax.plot([x], [paper[f"fs_{kind}"]], color=pl.colour(pe, rpt, pl.held(rows, "protocol")),
                            **pl.PAPER_MARKER)
            handles, _ = ax.get_legend_handles_labels()
            if data.matches_paper_p(ds):
                handles.append(pl.paper_handle(PAPER_P_SETTING))
            if kind == "jpeg":
                ax.invert_xaxis()
            ax.axhline(0, color="k", lw=0.6)
            ax.set(title=pl.panel_title(rows, kind), xlabel=xlabel, ylabel="FS = 1 - acc_shift / acc_clean")
            canvas.style(ax)
            canvas.legend(ax, handles=handles)
    pinned = "; ".join(p for _, p in frames.values() if p)
    return [pl.plot(title, fig, "Fragility score per severity level. Paper stars (JPEG q5, blur sigma 2.5) only "
                                "where the setting matches (ImageNet-100 / 224 px).", pinned)]


def _alpha_scaling(data: StudyData, intervention: str, title: str, xlabel: str, text: str, *,
                   paper: bool) -> list[pl.Plot]:
    metrics = [(m, label) for m, label in (("dssdc", "dSSDC under RPI"), ("fs_jpeg", "FS JPEG q5"),
                                            ("fs_blur", "FS blur sigma 2.5")) if not data.select(intervention, m).empty]
    if not metrics:
        raise pl.NoData(f"no {intervention} rows at the final checkpoint")
    frames = {m: data.pin(data.select(intervention, m), {"pe", "rpt"}) for m, _ in metrics}
    datasets = sorted(set().union(*(pl.datasets(f) for f, _ in frames.values())))
    fig, axes = canvas.grid(len(datasets), len(metrics))
    for row, ds in enumerate(datasets):
        for col, (metric, ylabel) in enumerate(metrics):
            ax, df = axes[row, col], frames[metric][0]
            rows = df[df["dataset"] == ds]
            _model_lines(ax, rows, summarise(rows, ["pe", "rpt", "level"]), "level")
            handles, _ = ax.get_legend_handles_labels()
            # The paper's dSSDC column is on its own estimator (one permutation per batch); dSSDC under
            # PE scaling is measured per image, another scale, so only its FS JPEG column is drawn here.
            if paper and metric == "fs_jpeg" and data.matches_paper_p(ds):
                alphas = np.array(sorted(PAPER_P_APE_SCALING))
                vals = np.array([PAPER_P_APE_SCALING[a] for a in alphas])
                colour = pl.colour("ape", False, pl.held(rows, "protocol"))
                mid = vals[:, 1:].mean(1)  # alpha <= 0.4 is one published range: drawn as a bar, not a point
                ax.errorbar(alphas, mid, yerr=(vals[:, 2] - vals[:, 1]) / 2, color=colour, capsize=3,
                            **pl.PAPER_MARKER)
                handles.append(pl.paper_handle(f"{PAPER_P_SETTING}, ape"))
            ax.set(title=pl.panel_title(rows), xlabel=xlabel, ylabel=ylabel)
            canvas.style(ax)
            canvas.legend(ax, handles=handles)
    pinned = "; ".join(p for _, p in frames.values() if p)
    return [pl.plot(title, fig, text, pinned)]


def pe_scaling(data: StudyData) -> list[pl.Plot]:
    return _alpha_scaling(
        data, "pe_scale", "PE scaling: dSSDC and FS vs alpha", "alpha (additive PE multiplier at inference)",
        "Study P's PE scaling: the additive PE table (ape, sincos2d) scaled by alpha at inference, no retraining; "
        "clean and shifted accuracy at the same alpha. Alpha 0 is a sanity point (it equals none); the paper's "
        "table covers 0.1-1.0. dSSDC here is per image; the paper's dSSDC per alpha is on its per-batch estimator, "
        "another scale, so it is not drawn. RoPE is not on these axes: see RoPE angle scaling.", paper=True)


def rope_scaling(data: StudyData) -> list[pl.Plot]:
    return _alpha_scaling(
        data, "rope_scale", "RoPE angle scaling (position interpolation): dSSDC and FS vs alpha",
        "alpha (RoPE angle multiplier at inference)",
        "RoPE's rotation angles multiplied by alpha at inference: position interpolation (the logit at alpha 0.5 "
        "for offset (0, 2) is the alpha 1 logit for offset (0, 1); q/k norms do not change), not a weaker "
        "position signal, so not Study P's PE scaling and in none of its claims. Alpha 0 removes the rotation "
        "(equal to none).", paper=False)


def accuracy_fragility(data: StudyData) -> list[pl.Plot]:
    title = "Clean accuracy and fragility per model"
    pt = data.per_trial
    metrics = [(m, label) for m, label in (("test_acc", "clean test accuracy"), ("fs_jpeg", "FS JPEG q5"),
                                            ("fs_blur", "FS blur sigma 2.5")) if m in pt and pt[m].notna().any()]
    pt, pinned = data.pin(pt, {"pe", "rpt"})
    models = sorted({(pe, rpt) for pe, rpt in zip(pt["pe"], pt["rpt"])}, key=lambda k: model_key(*k))
    if not metrics or len(models) < 2:
        raise pl.NoData("needs accuracy or fragility for two or more models")
    datasets = pl.datasets(pt)
    fig, axes = canvas.grid(len(datasets), len(metrics), w=1.0 + 0.75 * len(models))
    protocol = pl.held(pt, "protocol")
    for row, ds in enumerate(datasets):
        g = pt[pt["dataset"] == ds]
        for col, (metric, ylabel) in enumerate(metrics):
            ax, ticks = axes[row, col], []
            for x, (pe, rpt) in enumerate(models):
                t = g[(g["pe"] == pe) & (g["rpt"] == rpt)]
                colour = pl.colour(pe, rpt, protocol)
                se = t[f"{metric}_se"].mean() if f"{metric}_se" in t else float("nan")
                pl.points(ax, x, t[metric], colour, model_label(pe, rpt), se=se)
                paper = PAPER_P_MODELS.get(model_label(pe, rpt))
                if paper and data.matches_paper_p(ds):
                    ax.plot([x + 0.25], [paper[metric]], color=colour, **pl.PAPER_MARKER)
                ticks.append(f"{model_label(pe, rpt)}\nn={t[metric].notna().sum()}")
            ax.set_xticks(range(len(models)), ticks, fontsize=canvas.SMALL)
            ax.set(title=pl.panel_title(g), ylabel=ylabel)
            canvas.style(ax)
            if data.matches_paper_p(ds):
                canvas.legend(ax, handles=[pl.paper_handle(PAPER_P_SETTING)])
    text = "Accuracy on the full test split; FS at JPEG q5 and blur sigma 2.5."
    if pl.drawn(fig).se:
        text += (" Accuracy's SE is over the test split's images, FS's over the analysis set's; every seed sees "
                 "the same images, so the seed spread holds no test-set sampling error.")
    return [pl.plot(title, fig, text, pinned)]
