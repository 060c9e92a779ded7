"""Figures of the report, each a pure function of a ``StudyData`` (``analysis.report``).

Every figure draws the mean over seeds with a 95% bootstrap CI (band or bar) and names the number
of seeds behind each line or point (``n=5``; ``n=3-5`` where it varies along the line). A figure
whose data is absent raises ``NoData``; the report shows the reason in its place. Rows of a
figure are data sets (the factorial's facets); factors a figure does not show are held at one
value by ``StudyData.pin`` and named in the caption, so nothing is pooled silently. Style (fonts,
ticks, y ranges, PNG and SVG) is ``analysis.plotting``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from analysis import plotting as pl
from analysis.claims import (
    PAPER_L_MIN_MAD,
    PAPER_L_SETTING,
    PAPER_P_APE_SCALING,
    PAPER_P_MODELS,
    PAPER_P_SETTING,
    model_key,
    model_label,
    protocol_key,
    protocol_label,
    protocol_switches,
    seed_summary,
    summarise,
)
from analysis.plotting import NoData, Plot, render_png, render_svg  # noqa: F401 - the report's entry points

if TYPE_CHECKING:
    from analysis.report import StudyData

# -- Study P -------------------------------------------------------------------------------
def _ssdc_depth(data: StudyData, intervention: str, title: str, text: str) -> list[pl.Plot]:
    df = data.select(intervention, "ssdc", per_layer=True)
    if df.empty:
        raise pl.NoData(f"no ({intervention}, ssdc) rows at the final checkpoint")
    df, pinned = data.pin(df, {"pe", "rpt"})
    datasets = pl.datasets(df)
    fig, axes = pl.grid(1, len(datasets), sharey=True)
    for ax, ds in zip(axes[0], datasets):
        s = summarise(df[df["dataset"] == ds], ["pe", "rpt", "layer"])
        for (pe, rpt), g in pl.by_model(s):
            pl.line(ax, g["layer"], g, f"{model_label(pe, rpt)} ({pl.n_label(g['n'])})", **pl.model_style(pe, rpt))
        ax.axhline(0, color="k", lw=0.6)
        ax.set(title=ds, xlabel="layer l (input of block l)", ylabel="SSDC")
        pl.style(ax, layer_axis="x")
        pl.legend(ax)
    return [pl.Plot(title, fig, pl.caption(text, pinned))]


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
    fig, axes = pl.grid(len(datasets), len(kinds))
    for row, ds in enumerate(datasets):
        for col, (kind, xlabel) in enumerate(kinds):
            ax, df = axes[row, col], frames[kind][0]
            s = summarise(df[df["dataset"] == ds], ["pe", "rpt", "level"])
            for (pe, rpt), g in pl.by_model(s):
                pl.line(ax, g["level"], g, f"{model_label(pe, rpt)} ({pl.n_label(g['n'])})", **pl.model_style(pe, rpt))
                paper = PAPER_P_MODELS.get(model_label(pe, rpt))
                if paper and data.matches_paper_p(ds):
                    x = 5.0 if kind == "jpeg" else 2.5
                    ax.plot([x], [paper[f"fs_{kind}"]], color=pl.model_style(pe, rpt)["color"], **pl.PAPER_MARKER)
            handles, _ = ax.get_legend_handles_labels()
            if data.matches_paper_p(ds):
                handles.append(pl.paper_handle(PAPER_P_SETTING))
            if kind == "jpeg":
                ax.invert_xaxis()
            ax.axhline(0, color="k", lw=0.6)
            ax.set(title=f"{ds}: {kind}", xlabel=xlabel, ylabel="FS = 1 - acc_shift / acc_clean")
            pl.style(ax)
            pl.legend(ax, handles=handles)
    pinned = "; ".join(p for _, p in frames.values() if p)
    return [pl.Plot(title, fig, pl.caption("Fragility score per severity level. Paper stars (JPEG q5, blur sigma 2.5) "
                                      "only where the setting matches (ImageNet-100 / 224 px).", pinned))]


def _alpha_scaling(data: StudyData, intervention: str, title: str, xlabel: str, text: str, *,
                   paper: bool) -> list[pl.Plot]:
    metrics = [(m, label) for m, label in (("dssdc", "dSSDC under RPI"), ("fs_jpeg", "FS JPEG q5"),
                                            ("fs_blur", "FS blur sigma 2.5")) if not data.select(intervention, m).empty]
    if not metrics:
        raise pl.NoData(f"no {intervention} rows at the final checkpoint")
    frames = {m: data.pin(data.select(intervention, m), {"pe", "rpt"}) for m, _ in metrics}
    datasets = sorted(set().union(*(pl.datasets(f) for f, _ in frames.values())))
    fig, axes = pl.grid(len(datasets), len(metrics))
    for row, ds in enumerate(datasets):
        for col, (metric, ylabel) in enumerate(metrics):
            ax, df = axes[row, col], frames[metric][0]
            s = summarise(df[df["dataset"] == ds], ["pe", "rpt", "level"])
            for (pe, rpt), g in pl.by_model(s):
                pl.line(ax, g["level"], g, f"{model_label(pe, rpt)} ({pl.n_label(g['n'])})", **pl.model_style(pe, rpt))
            handles, _ = ax.get_legend_handles_labels()
            if paper and metric in ("dssdc", "fs_jpeg") and data.matches_paper_p(ds):
                alphas = np.array(sorted(PAPER_P_APE_SCALING))
                vals = np.array([PAPER_P_APE_SCALING[a] for a in alphas])
                colour = pl.PE_COLOURS["ape"]
                if metric == "dssdc":
                    ax.plot(alphas, vals[:, 0], color=colour, **pl.PAPER_MARKER)
                else:  # alpha <= 0.4 is one published range: draw it as a bar, not a point
                    mid = vals[:, 1:].mean(1)
                    ax.errorbar(alphas, mid, yerr=(vals[:, 2] - vals[:, 1]) / 2, color=colour, capsize=3,
                                **pl.PAPER_MARKER)
                handles.append(pl.paper_handle(f"{PAPER_P_SETTING}, ape"))
            ax.set(title=ds, xlabel=xlabel, ylabel=ylabel)
            pl.style(ax)
            pl.legend(ax, handles=handles)
    pinned = "; ".join(p for _, p in frames.values() if p)
    return [pl.Plot(title, fig, pl.caption(text, pinned))]


def pe_scaling(data: StudyData) -> list[pl.Plot]:
    return _alpha_scaling(
        data, "pe_scale", "PE scaling: dSSDC and FS vs alpha", "alpha (additive PE multiplier at inference)",
        "Study P's PE scaling: the additive PE table (ape, sincos2d) scaled by alpha at inference, no retraining; "
        "clean and shifted accuracy at the same alpha. Alpha 0 is a sanity point (it equals none); the paper's "
        "table covers 0.1-1.0. RoPE is not on these axes: see RoPE angle scaling.", paper=True)


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
    fig, axes = pl.grid(len(datasets), len(metrics), w=1.0 + 0.75 * len(models))
    for row, ds in enumerate(datasets):
        g = pt[pt["dataset"] == ds]
        for col, (metric, ylabel) in enumerate(metrics):
            ax, ticks = axes[row, col], []
            for x, (pe, rpt) in enumerate(models):
                t = g[(g["pe"] == pe) & (g["rpt"] == rpt)]
                colour = pl.model_style(pe, rpt)["color"]
                se = t[f"{metric}_se"].mean() if f"{metric}_se" in t else float("nan")
                pl.points(ax, x, t[metric], colour, se=se)
                paper = PAPER_P_MODELS.get(model_label(pe, rpt))
                if paper and data.matches_paper_p(ds):
                    ax.plot([x + 0.25], [paper[metric]], color=colour, **pl.PAPER_MARKER)
                ticks.append(f"{model_label(pe, rpt)}\nn={t[metric].notna().sum()}")
            ax.set_xticks(range(len(models)), ticks, fontsize=pl.SMALL)
            ax.set(title=ds, ylabel=ylabel)
            pl.style(ax)
            if data.matches_paper_p(ds):
                pl.legend(ax, handles=[pl.paper_handle(PAPER_P_SETTING)])
    return [pl.Plot(title, fig, pl.caption("Dots: single seeds; bars: mean ± 95% bootstrap CI over seeds; grey bars: "
                                           "± "
                                      "sampling SE of one trial's value from its n evaluation images (binomial for "
                                      "accuracy, delta method over the paired counts for FS; every seed "
                                      "sees the same images, so the seed spread holds no test-set sampling error). "
                                      "Accuracy on the full test split; FS at JPEG q5 and blur sigma 2.5.", pinned,
                                      spread=""))]


# -- Study L -----------------------------------------------------------------------------
def _attention_per_layer(data: StudyData, metric: str, title: str, ylabel: str) -> list[pl.Plot]:
    df = data.select("clean", metric, per_layer=True, per_head=True)
    if df.empty:
        raise pl.NoData(f"no (clean, {metric}) rows per layer and head")
    df, pinned = data.pin(df, {"protocol"})
    plots = []
    for ds in pl.datasets(df):
        d = df[df["dataset"] == ds]
        protocols = sorted(d["protocol"].unique(), key=protocol_key)
        ncols = min(4, len(protocols))
        fig, axes = pl.grid(math.ceil(len(protocols) / ncols), ncols, w=3.6, h=2.9,
                          sharey=True, sharex=True)
        heads = max(int(d["head_index"].max()) + 1, 1)
        for ax, proto in zip(axes.flat, protocols):
            p = d[d["protocol"] == proto]
            jitter = (p["head_index"].to_numpy() / max(heads - 1, 1) - 0.5) * 0.5
            ax.scatter(p["layer"] + jitter, p["value"], s=5, color="0.55", alpha=0.45, lw=0,
                       label="single heads (all seeds)")
            for how, colour, ls in (("mean", "C0", "-"), ("min", "C3", "--")):
                per_layer = p.groupby(["trial_id", "layer"])["value"].agg(how).reset_index()
                s = summarise(per_layer, ["layer"])
                pl.line(ax, s["layer"], s, f"{how} over heads ({pl.n_label(s['n'])})", color=colour, ls=ls, marker="o")
            ax.set_title(f"{protocol_label(proto)} (n={p['trial_id'].nunique()})")
            ax.set_xlabel("layer")
            ax.set_ylabel(ylabel)
            pl.style(ax, layer_axis="x")
        for ax in axes.flat[len(protocols):]:
            ax.set_visible(False)
        pl.legend(axes.flat[0])
        plots.append(pl.Plot(f"{title} ({ds})", fig, pl.caption(
            "Grey dots: every head of every seed (head index is arbitrary across seeds, so heads are not averaged "
            "by index); blue: mean over heads per layer; red dashed: the layer's most local head.", pinned)))
    return plots


def mad_per_layer(data: StudyData) -> list[pl.Plot]:
    return _attention_per_layer(data, "mad", "Mean attention distance per layer and head", pl.MAD_LABEL)


def entropy_per_layer(data: StudyData) -> list[pl.Plot]:
    return _attention_per_layer(data, "entropy", "Attention entropy per layer and head", "normalised entropy")


def mad_entropy(data: StudyData) -> list[pl.Plot]:
    title = "MAD-entropy space per protocol"
    mad = data.select("clean", "mad", per_layer=True, per_head=True)
    ent = data.select("clean", "entropy", per_layer=True, per_head=True)
    keys = ["trial_id", "dataset", "pe", "rpt", "protocol", *data.condition_fields, "layer", "head_index"]
    if mad.empty or ent.empty:
        raise pl.NoData("needs clean mad and entropy per layer and head")
    both = mad[keys + ["value"]].merge(ent[keys + ["value"]], on=keys, suffixes=("_mad", "_ent"))
    both, pinned = data.pin(both, {"protocol"})
    protocols = sorted(both["protocol"].unique(), key=protocol_key)  # every protocol: one panel each
    datasets = pl.datasets(both)
    ncols = min(4, len(protocols))
    rows_per_ds = math.ceil(len(protocols) / ncols)
    fig, axes = pl.grid(len(datasets) * rows_per_ds, ncols, w=3.6, h=3.2, sharex=True, sharey=True)
    n_layers = int(both["layer"].max()) + 1
    cmap = colormaps["viridis"]
    norm = BoundaryNorm(np.arange(n_layers + 1) - 0.5, cmap.N)
    for row, ds in enumerate(datasets):
        panels = axes[row * rows_per_ds:(row + 1) * rows_per_ds].flat
        for i, ax in enumerate(panels):
            if i >= len(protocols):
                ax.set_visible(False)
                continue
            proto = protocols[i]
            p = both[(both["dataset"] == ds) & (both["protocol"] == proto)]
            ax.scatter(p["value_mad"], p["value_ent"], c=p["layer"], cmap=cmap, norm=norm, s=7, alpha=0.35, lw=0)
            # Per layer: mean over heads within a seed, then mean ± CI over seeds on both axes.
            per = p.groupby(["trial_id", "layer"])[["value_mad", "value_ent"]].mean().reset_index()
            for layer, g in per.groupby("layer"):
                sx, sy = seed_summary(g["value_mad"]), seed_summary(g["value_ent"])
                ax.errorbar([sx.mean], [sy.mean], xerr=pl.ci_bar(sx), yerr=pl.ci_bar(sy), fmt="o", ms=6,
                            color=cmap(norm(layer)), mec="k", mew=0.6, elinewidth=1)
            ax.set(title=f"{ds}: {protocol_label(proto)} (n={p['trial_id'].nunique()})", xlabel=pl.MAD_LABEL,
                   ylabel="normalised entropy", xlim=(0, None), ylim=(0, 1.02))
            pl.style(ax, min_span=None)
    handles = [Line2D([], [], marker="o", ls="none", color=cmap(norm(layer)), mec="k", mew=0.6, label=f"layer {layer}")
               for layer in range(n_layers)]
    fig.legend(handles=handles, loc="outside right upper", fontsize=pl.SMALL, title="layer", title_fontsize=pl.SMALL)
    text = ("Small dots: every head of every seed, coloured by layer; large dots: per-layer mean over heads, "
            "averaged over seeds, with 95% CI on both axes; n = seeds. MAD is divided by the largest grid "
            "distance √2(G−1) (Study L's own normalisation is unpublished); entropy by log N.")
    return [pl.Plot(title, fig, pl.caption(text, pinned, spread=""))]


def protocol_summary(data: StudyData) -> list[pl.Plot]:
    title = "Minimum MAD and accuracy per protocol"
    pt, pinned = data.pin(data.per_trial, {"protocol"})
    metrics = [(m, label) for m, label in (("min_mad", "minimum MAD (most local head)"),
                                            ("test_acc", "test accuracy")) if pt[m].notna().any()]
    protocols = sorted(pt["protocol"].unique(), key=protocol_key)
    if not metrics or len(protocols) < 2:
        raise pl.NoData("needs minimum MAD or accuracy for two or more protocols")
    datasets = pl.datasets(pt)
    fig, axes = pl.grid(len(datasets), len(metrics), w=1.2 + 0.62 * len(protocols), h=3.6)
    colours = {True: "tab:red", False: "tab:blue"}
    for row, ds in enumerate(datasets):
        g = pt[pt["dataset"] == ds]
        for col, (metric, ylabel) in enumerate(metrics):
            ax, ticks = axes[row, col], []
            for x, proto in enumerate(protocols):
                t = g.loc[g["protocol"] == proto, metric]
                pl.points(ax, x, t, colours[protocol_switches(proto)["cutmix"]])
                if metric == "min_mad" and ds == "cifar100" and proto in PAPER_L_MIN_MAD:
                    ax.plot([x + 0.25], [PAPER_L_MIN_MAD[proto]], color="0.3", **pl.PAPER_MARKER)
                ticks.append(f"{protocol_label(proto)}\nn={t.notna().sum()}")
            ax.set_xticks(range(len(protocols)), ticks, fontsize=pl.SMALL, rotation=30, ha="right")
            ax.set(title=ds, ylabel=ylabel)
            pl.style(ax)
            handles = [Line2D([], [], marker="o", ls="none", color=c, label=f"{'with' if k else 'without'} CutMix")
                       for k, c in colours.items()]
            if metric == "min_mad" and ds == "cifar100":
                handles.append(pl.paper_handle(PAPER_L_SETTING))
            pl.legend(ax, handles=handles)
    return [pl.Plot(title, fig, pl.caption("Dots: single seeds; bars: mean ± 95% bootstrap CI. Minimum MAD = smallest "
                                      "per-head MAD in the network; paper stars only on CIFAR-100 (its MAD "
                                      "normalisation is unpublished: compare shape, not digits).", pinned, spread=""))]


# -- training time -----------------------------------------------------------------------
def emergence(data: StudyData) -> list[pl.Plot]:
    title = "Emergence over training (measured checkpoints)"
    m = data.measurements
    if m.empty:
        raise pl.NoData("no measurements")
    counts = m.groupby("trial_id")["checkpoint_epoch"].nunique()
    several = set(counts[counts > 1].index)
    if not several:
        raise pl.NoData("every trial has a single measured checkpoint")
    panels = []
    for label, rows, how, keep in (
        ("minimum MAD", data.select("clean", "mad", per_layer=True, per_head=True, final=False), "min", {"protocol"}),
        ("clean SSDC, mean over layers", data.select("clean", "ssdc", per_layer=True, final=False), "mean",
         {"pe", "rpt"}),
        ("dSSDC under RPI", data.select("rpi", "dssdc", final=False), "mean", {"pe", "rpt"}),
    ):
        rows = rows[rows["trial_id"].isin(several)]
        if not rows.empty:
            series = ["protocol"] if keep == {"protocol"} else ["pe", "rpt"]
            keys = ["trial_id", "dataset", "pe", "rpt", "protocol", *data.condition_fields,
                    "checkpoint_epoch"]  # every condition field, for pin
            per = rows.groupby(keys)["value"].agg(how).reset_index()
            per, pinned = data.pin(per, keep)
            panels.append((label, per, series, pinned))
    if not panels:
        raise pl.NoData("no MAD or SSDC rows at several checkpoints")
    datasets = sorted(set().union(*(pl.datasets(p[1]) for p in panels)))
    fig, axes = pl.grid(len(datasets), len(panels))
    for row, ds in enumerate(datasets):
        for col, (label, per, series, _) in enumerate(panels):
            ax = axes[row, col]
            s = summarise(per[per["dataset"] == ds], [*series, "checkpoint_epoch"])
            if series == ["protocol"]:
                for proto in sorted(s["protocol"].unique(), key=protocol_key):
                    g = s[s["protocol"] == proto]
                    pl.line(ax, g["checkpoint_epoch"], g, f"{protocol_label(proto)} ({pl.n_label(g['n'])})",
                          color=pl.protocol_colour(proto), marker="o")
            else:
                for (pe, rpt), g in pl.by_model(s):
                    pl.line(ax, g["checkpoint_epoch"], g, f"{model_label(pe, rpt)} ({pl.n_label(g['n'])})",
                          **pl.model_style(pe, rpt))
            ax.set_xscale("symlog", linthresh=1)  # epoch 0 (untrained) stays on the axis
            epochs = sorted({int(e) for e in per["checkpoint_epoch"]})  # log-spaced snapshots: every one fits
            ax.set_xticks(epochs, [str(e) for e in epochs])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set(title=ds, xlabel="checkpoint epoch (0 = untrained)", ylabel=label)
            pl.style(ax)
            pl.legend(ax)
    pinned = "; ".join(p[3] for p in panels if p[3])
    return [pl.Plot(title, fig, pl.caption("Trials measured at two or more checkpoints; x is symmetric-log.", pinned))]


def training_curves(data: StudyData) -> list[pl.Plot]:
    title = "Training curves (accuracy per epoch)"
    e = data.epochs
    value = next((c for c in ("eval_acc", "train_acc") if c in e and e[c].notna().any()), None)
    if e.empty or value is None:
        raise pl.NoData("no epochs rows with eval_acc or train_acc")
    e = e.rename(columns={value: "value"})
    # Condition fields beyond the factors are always held at one value; the factors too past 10 lines.
    e, pinned = data.pin(e, {"protocol"} if e.groupby(["pe", "rpt", "protocol"]).ngroups > 10
                         else {"pe", "rpt", "protocol"})
    varying = [f for f in ("pe", "rpt", "protocol") if e[f].nunique() > 1] or ["protocol"]
    datasets = pl.datasets(e)
    fig, axes = pl.grid(1, len(datasets), w=5.2, h=3.6, sharey=True)
    cmap = colormaps["tab10" if e.groupby(varying).ngroups <= 10 else "tab20"]
    for ax, ds in zip(axes[0], datasets):
        s = summarise(e[e["dataset"] == ds], [*varying, "epoch"])
        groups = [(dict(zip(varying, k if isinstance(k, tuple) else (k,))), g) for k, g in s.groupby(varying)]
        groups.sort(key=lambda kg: (model_key(kg[0].get("pe", ""), kg[0].get("rpt", False)),
                                    protocol_key(kg[0].get("protocol", "baseline"))))
        for i, (key, g) in enumerate(groups):
            name = " / ".join(filter(None, [
                model_label(key["pe"], key.get("rpt", False)) if "pe" in key else ("RPT" if key.get("rpt") else ""),
                protocol_label(key["protocol"]) if "protocol" in key else ""]))
            colour = pl.protocol_colour(key["protocol"]) if varying == ["protocol"] else cmap(i % cmap.N)
            pl.line(ax, g["epoch"], g, f"{name} ({pl.n_label(g['n'])})", color=colour)
        ax.set(title=ds, xlabel="epoch", ylabel=value.replace("_", " "))
        pl.style(ax, layer_axis="x")  # integer epochs
        pl.legend(ax)
    return [pl.Plot(title, fig, pl.caption(f"{value} after each epoch.", pinned))]


# (section, title for the omission note, function) in page order; sections are report.SECTIONS keys.
FIGURES: tuple[tuple[str, str, Callable[[StudyData], list[pl.Plot]]], ...] = (
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
