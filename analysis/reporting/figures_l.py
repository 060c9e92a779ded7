"""Study L's figures (attention distance and entropy, the protocol summary) and the training-time
figures (emergence, training curves): pure functions of a ``StudyData``; protocols and models are
coloured by ``plotting.colour``, the same condition in the same colour as in Study P's figures.
Entry points: ``analysis.reporting.figures``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from analysis.measuring import canvas
from analysis.measuring.uniform_attention import uniform_mad
from analysis.reporting import plotting as pl
from analysis.statistics.labels import model_key, model_label, protocol_key, protocol_label
from analysis.statistics.paper_numbers import PAPER_L_MIN_MAD, PAPER_L_SETTING
from analysis.statistics.seedstats import summarise

if TYPE_CHECKING:
    from analysis.statistics.study_data import StudyData


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
        fig, axes = canvas.grid(math.ceil(len(protocols) / ncols), ncols, w=3.6, h=2.9, sharey=True, sharex=True)
        heads = max(int(d["head_index"].max()) + 1, 1)
        pe = pl.held(d, "pe", "ape")
        for ax, proto in zip(axes.flat, protocols):
            p = d[d["protocol"] == proto]
            jitter = (p["head_index"].to_numpy() / max(heads - 1, 1) - 0.5) * 0.5
            ax.scatter(p["layer"] + jitter, p["value"], s=5, color="0.55", alpha=0.45, lw=0,
                       label="single heads (all seeds)")
            for how, ls in (("mean", "-"), ("min", "--")):
                per_layer = p.groupby(["trial_id", "layer"])["value"].agg(how).reset_index()
                s = summarise(per_layer, ["layer"])
                pl.line(ax, s["layer"], s, f"{how} over heads ({pl.n_label(s['n'])})", name=protocol_label(proto),
                        color=pl.colour(pe, False, proto), ls=ls, marker="o" if how == "mean" else "v")
            if metric == "mad":
                canvas.uniform_level(ax, pl.grids(data.trials, ds))
            ax.set(title=pl.panel_title(p, f"n={p['trial_id'].nunique()}"), xlabel="layer", ylabel=ylabel)
            canvas.style(ax, layer_axis="x")
        for ax in axes.flat[len(protocols):]:
            ax.set_visible(False)
        canvas.legend(axes.flat[0])
        plots.append(pl.plot(f"{title} ({ds})", fig,
                             "Grey dots: every head of every seed (head index is arbitrary across seeds, so heads are "
                             "not averaged by index); solid: mean over heads per layer; dashed: the layer's most "
                             "local head; colour: the protocol's, as in every figure."
                             + (f" {pl.UNIFORM_TEXT}" if metric == "mad" else ""), pinned))
    return plots


def mad_per_layer(data: StudyData) -> list[pl.Plot]:
    return _attention_per_layer(data, "mad", "Mean attention distance per layer and head", canvas.MAD_LABEL)


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
    fig, axes = canvas.grid(len(datasets) * rows_per_ds, ncols, w=3.6, h=3.2, sharex=True, sharey=True)
    n_layers = int(both["layer"].max()) + 1
    cmap = colormaps["viridis"]  # colour here is the layer, a scale: the legend says so
    norm = BoundaryNorm(np.arange(n_layers + 1) - 0.5, cmap.N)
    for row, ds in enumerate(datasets):
        panels = axes[row * rows_per_ds:(row + 1) * rows_per_ds].ravel()
        for ax in panels[len(protocols):]:
            ax.set_visible(False)
        for ax, proto in zip(panels, protocols):
            p = both[(both["dataset"] == ds) & (both["protocol"] == proto)]
            ax.scatter(p["value_mad"], p["value_ent"], c=p["layer"], cmap=cmap, norm=norm, s=7, alpha=0.35, lw=0)
            canvas.uniform_level(ax, pl.grids(data.trials, ds), axis="x")
            # Per layer: mean over heads within a seed, then the mean over seeds on both axes.
            per = p.groupby(["trial_id", "layer"])[["value_mad", "value_ent"]].mean().reset_index()
            for layer, g in per.groupby("layer"):
                pl.mean_point(ax, g["value_mad"], g["value_ent"], protocol_label(proto), color=cmap(norm(layer)),
                              mec="k", mew=0.6)
            ax.set(title=pl.panel_title(p, f"n={p['trial_id'].nunique()}"), xlabel=canvas.MAD_LABEL,
                   ylabel="normalised entropy")
            canvas.style(ax, min_span=None)
    # Shared axes fitted to every point of every panel: nothing pinned to an edge, nothing cut off.
    axes.flat[0].set_xlim(*pl.fitted([*both["value_mad"], *map(uniform_mad, pl.grids(data.trials))]))
    axes.flat[0].set_ylim(*pl.fitted(both["value_ent"]))
    handles = [Line2D([], [], marker="o", ls="none", color=cmap(norm(layer)), mec="k", mew=0.6, label=f"layer {layer}")
               for layer in range(n_layers)]
    fig.legend(handles=handles, loc="outside right upper", fontsize=canvas.SMALL, title="layer",
               title_fontsize=canvas.SMALL)
    text = ("Small dots: every head of every seed, coloured by layer; large dots: per-layer mean over heads, then "
            "over seeds. MAD is divided by the largest grid distance √2(G−1) (Study L's own normalisation is "
            f"unpublished); entropy by log N. {pl.UNIFORM_TEXT}")
    return [pl.plot(title, fig, text, pinned)]


def protocol_summary(data: StudyData) -> list[pl.Plot]:
    title = "Minimum MAD and accuracy per protocol"
    pt, pinned = data.pin(data.per_trial, {"protocol"})
    metrics = [(m, label) for m, label in (("min_mad", "minimum MAD (most local head)"),
                                            ("test_acc", "test accuracy")) if pt[m].notna().any()]
    protocols = sorted(pt["protocol"].unique(), key=protocol_key)
    if not metrics or len(protocols) < 2:
        raise pl.NoData("needs minimum MAD or accuracy for two or more protocols")
    datasets = pl.datasets(pt)
    fig, axes = canvas.grid(len(datasets), len(metrics), w=1.2 + 0.62 * len(protocols), h=3.6)
    pe = pl.held(pt, "pe", "ape")
    for row, ds in enumerate(datasets):
        g = pt[pt["dataset"] == ds]
        for col, (metric, ylabel) in enumerate(metrics):
            ax, ticks = axes[row, col], []
            for x, proto in enumerate(protocols):
                t = g.loc[g["protocol"] == proto, metric]
                pl.points(ax, x, t, pl.colour(pe, False, proto), protocol_label(proto))
                if metric == "min_mad" and ds == "cifar100" and proto in PAPER_L_MIN_MAD:
                    ax.plot([x + 0.25], [PAPER_L_MIN_MAD[proto]], color="0.3", **pl.PAPER_MARKER)
                ticks.append(f"{protocol_label(proto)}\nn={t.notna().sum()}")
            ax.set_xticks(range(len(protocols)), ticks, fontsize=canvas.SMALL, rotation=30, ha="right")
            ax.set(title=pl.panel_title(g), ylabel=ylabel)
            canvas.style(ax)
            if metric == "min_mad":
                canvas.uniform_level(ax, pl.grids(data.trials, ds))
            if metric == "min_mad" and ds == "cifar100":
                canvas.legend(ax, handles=[pl.paper_handle(PAPER_L_SETTING)])
    return [pl.plot(title, fig, "Minimum MAD = smallest per-head MAD in the network over the heads that are no "
                                "CLS sink (CLS mass < 0.5); colour: the protocol's, as in every figure; paper "
                                "stars only on CIFAR-100 (its MAD normalisation is unpublished: compare shape, "
                                f"not digits). {pl.UNIFORM_TEXT}", pinned)]


# -- training time -----------------------------------------------------------------------
def emergence(data: StudyData) -> list[pl.Plot]:
    title = "Emergence over training (measured checkpoints)"
    m = data.measurements
    if m.empty:
        raise pl.NoData("no measurements")
    counts = m.groupby("trial_id")["checkpoint_epoch"].nunique()
    several = set(counts[counts > 1].index)
    if not several:
        raise pl.NoData(f"every trial has a single measured checkpoint; `vitsweep analyze {data.study} --checkpoints "
                        f"all` measures every snapshot, then `vitsweep report {data.study}` draws it")
    panels = []
    for label, rows, how, keep in (
        ("minimum MAD", data.local_heads(final=False), "min", {"protocol"}),
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
    fig, axes = canvas.grid(len(datasets), len(panels))
    for row, ds in enumerate(datasets):
        for col, (label, per, series, _) in enumerate(panels):
            ax = axes[row, col]
            rows = per[per["dataset"] == ds]
            s = summarise(rows, [*series, "checkpoint_epoch"])
            if series == ["protocol"]:
                pe = pl.held(rows, "pe", "ape")
                for proto in sorted(s["protocol"].unique(), key=protocol_key):
                    g = s[s["protocol"] == proto]
                    pl.line(ax, g["checkpoint_epoch"], g, f"{protocol_label(proto)} ({pl.n_label(g['n'])})",
                            color=pl.colour(pe, False, proto), marker="o")
            else:
                protocol = pl.held(rows, "protocol")
                for (pe, rpt), g in pl.by_model(s):
                    pl.line(ax, g["checkpoint_epoch"], g, f"{model_label(pe, rpt)} ({pl.n_label(g['n'])})",
                            **pl.model_style(pe, rpt, protocol))
            ax.set_xscale("symlog", linthresh=1)  # epoch 0 (untrained) stays on the axis
            epochs = sorted({int(e) for e in per["checkpoint_epoch"]})  # log-spaced snapshots: every one fits
            ax.set_xticks(epochs, [str(e) for e in epochs])
            ax.xaxis.set_minor_locator(NullLocator())
            if label == "minimum MAD":
                canvas.uniform_level(ax, pl.grids(data.trials, ds))
            ax.set(title=pl.panel_title(rows), xlabel="checkpoint epoch (0 = untrained)", ylabel=label)
            canvas.style(ax)
            canvas.legend(ax)
    pinned = "; ".join(p[3] for p in panels if p[3])
    text = ("Trials measured at two or more checkpoints; x is symmetric-log; minimum MAD over heads that are no CLS "
            "sink.")
    return [pl.plot(title, fig, f"{text} {pl.UNIFORM_TEXT}" if panels[0][0] == "minimum MAD" else text, pinned)]


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
    datasets = pl.datasets(e)
    fig, axes = canvas.grid(1, len(datasets), w=5.2, h=3.6, sharey=True)
    for ax, ds in zip(axes[0], datasets):
        rows = e[e["dataset"] == ds]
        s = summarise(rows, ["pe", "rpt", "protocol", "epoch"])
        models_vary = rows.groupby(["pe", "rpt"]).ngroups > 1
        protocols_vary = rows["protocol"].nunique() > 1
        for (pe, rpt, proto), g in sorted(s.groupby(["pe", "rpt", "protocol"]),
                                          key=lambda kg: (model_key(kg[0][0], kg[0][1]), protocol_key(kg[0][2]))):
            # The legend names what varies in the panel (the title names what it holds).
            name = " / ".join([model_label(pe, rpt)] * (models_vary or not protocols_vary)
                              + [protocol_label(proto)] * (protocols_vary or not models_vary))
            pl.line(ax, g["epoch"], g, f"{name} ({pl.n_label(g['n'])})", color=pl.colour(pe, rpt, proto),
                    ls="--" if rpt else "-")
        ax.set(title=pl.panel_title(rows), xlabel="epoch", ylabel=value.replace("_", " "))
        canvas.style(ax, layer_axis="x")  # integer epochs
        canvas.legend(ax)
    return [pl.plot(title, fig, f"{value} after each epoch.", pinned)]
