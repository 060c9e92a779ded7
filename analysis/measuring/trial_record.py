"""One checkpoint's measurements on its trial's MLflow run: scalars, per-layer curves, a figure.

The analysis job (``analysis.measuring.job``) calls ``log_checkpoint`` after writing a checkpoint's rows to
Parquet. On the trial's run it logs

- scalars at step = checkpoint epoch (``summarize``), in the run's first chart section with ``test_acc``:
  ``Headline/acc_clean`` (top-1 on the analysis set of ``n_images`` images: ``test_acc``'s set when it is the
  whole test split, the default), ``Headline/dssdc_rpi``, ``Headline/fs_jpeg_q5``, ``Headline/fs_blur_s2.5``,
  ``Headline/mad_min`` (heads that are no CLS sink), ``Headline/ape_norm_ratio`` (a learned APE), and
  ``progress/n_images``;
- per-layer curves with the layer as the step and the checkpoint epoch in the key (``layer_profiles``, keys
  from ``records.tracking.layer_key``): ``layers/ssdc_epoch_0100`` (clean), ``layers/ssdc_rpi_epoch_0100``,
  ``layers/ssdc_rpi_content_epoch_0100``, ``layers/mad_mean_epoch_0100`` and ``layers/mad_min_epoch_0100``
  (over heads), ``layers/entropy_mean_epoch_0100``, so the MLflow UI plots SSDC against depth for each
  checkpoint, all in one ``layers`` section of the run's charts after the headline numbers and the training
  curves (``epochs/...``);
- the figure ``figures/layers_epoch_0100.{png,svg}``: SSDC per layer clean and under RPI, MAD and entropy of
  every head per layer (``trial_figure``, drawn on ``analysis.measuring.canvas``), of the trial's final checkpoint; of
  every checkpoint with ``vitsweep analyze --figures all`` (``FIGURE_CHOICES``): its PNG and SVG take about 0.4 s
  of CPU, 11 hours over 10,000 trials' 10 snapshots.

``record_checkpoint`` finds the run by the id the trials row keeps (``records.tracking.find_trial_run``).
"""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from records import measurements, tracking
from records.vocab import BLUR_HEADLINE, CLS_SINK_MASS, JPEG_HEADLINE

# (intervention, metric) -> MLflow key prefix of a per-layer curve, and how heads are reduced.
_PROFILES = {
    ("clean", "ssdc"): ("ssdc", None),
    ("rpi", "ssdc"): ("ssdc_rpi", None),
    ("rpi", "ssdc_content"): ("ssdc_rpi_content", None),
}
_HEAD_PROFILES = {"mad": (("mad_mean", np.mean), ("mad_min", np.min)), "entropy": (("entropy_mean", np.mean),)}
FIGURE_CHOICES = ("final", "all")  # the checkpoints whose figure goes on the run: each trial's final one, or all


def _set(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Scalar MLflow metrics of one checkpoint's rows, by their ``records.tracking.headline_key``:
    acc_clean, dssdc_rpi, fs_jpeg_q5, fs_blur_s2.5, mad_min (over heads that are no CLS sink,
    ``records.vocab.CLS_SINK_MASS``), ape_norm_ratio (a learned APE only) under ``Headline/``, n_images
    under ``progress/``; NaNs left out."""
    out: dict[str, float] = {}
    mads, cls_mass = {}, {}
    for r in rows:
        iv, lvl, metric, value = r["intervention"], r.get("level"), r["metric"], r["value"]
        if iv == "clean" and metric == "acc":
            out["acc_clean"] = value
            if r.get("n_images") is not None:
                out["n_images"] = r["n_images"]
        elif iv == "clean" and metric in ("mad", "cls_mass"):
            (mads if metric == "mad" else cls_mass)[(r["layer"], r["head_index"])] = value
        elif iv == "clean" and metric == "ape_norm_ratio":
            out["ape_norm_ratio"] = value
        elif iv == "rpi" and metric == "dssdc":
            out["dssdc_rpi"] = value
        elif iv == "jpeg" and metric == "fs" and lvl == JPEG_HEADLINE:
            out[f"fs_jpeg_q{JPEG_HEADLINE}"] = value
        elif iv == "blur" and metric == "fs" and lvl == BLUR_HEADLINE[1]:
            out[f"fs_blur_s{BLUR_HEADLINE[1]}"] = value
    local = [v for head, v in mads.items() if not cls_mass.get(head, 0.0) >= CLS_SINK_MASS]
    if local:
        out["mad_min"] = float(min(local))
    return {tracking.headline_key(k): float(v) for k, v in out.items() if v is not None and not math.isnan(v)}


def layer_profiles(rows: list[dict[str, Any]], epoch: int) -> dict[str, dict[int, float]]:
    """{``layers/<name>_epoch_<EEEE>``: {layer: value}}: the per-layer curves of one checkpoint."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    heads: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if not _set(r.get("layer")) or not np.isfinite(r["value"]):
            continue
        layer = int(r["layer"])
        key = (r["intervention"], r["metric"])
        if key in _PROFILES and not _set(r.get("head_index")):
            out[tracking.layer_key(_PROFILES[key][0], epoch)][layer] = float(r["value"])
        elif r["intervention"] == "clean" and r["metric"] in _HEAD_PROFILES and _set(r.get("head_index")):
            heads[r["metric"]][layer].append(float(r["value"]))
    for metric, per_layer in heads.items():
        for name, how in _HEAD_PROFILES[metric]:
            out[tracking.layer_key(name, epoch)] = {layer: float(how(v)) for layer, v in sorted(per_layer.items())}
    return dict(out)


def trial_figure(rows: list[dict[str, Any]], title: str, grid: int):
    """Three panels of one checkpoint: SSDC per layer (clean, under RPI), MAD and entropy per head
    (MAD beside uniform attention's on the G x G ``grid``)."""
    from analysis.measuring import canvas  # matplotlib: imported when a figure is drawn, not by `vitsweep --help`

    fig, axes = canvas.grid(1, 3, w=3.8, h=3.2)
    ssdc = {k: {} for k in (("clean", "ssdc"), ("rpi", "ssdc"))}
    per_head: dict[str, dict[int, dict[int, float]]] = {"mad": defaultdict(dict), "entropy": defaultdict(dict)}
    for r in rows:
        if not _set(r.get("layer")):
            continue
        key = (r["intervention"], r["metric"])
        if key in ssdc and not _set(r.get("head_index")):
            ssdc[key][int(r["layer"])] = r["value"]
        elif r["intervention"] == "clean" and r["metric"] in per_head and _set(r.get("head_index")):
            per_head[r["metric"]][int(r["head_index"])][int(r["layer"])] = r["value"]
    ax = axes[0, 0]
    for (iv, _), label, colour in ((("clean", "ssdc"), "clean", "C0"), (("rpi", "ssdc"), "under RPI", "C3")):
        layers = sorted(ssdc[(iv, "ssdc")])
        ax.plot(layers, [ssdc[(iv, "ssdc")][layer] for layer in layers], "o-", color=colour, label=label)
    ax.axhline(0, color="k", lw=0.6)
    ax.set(title="SSDC per layer", xlabel="layer", ylabel="SSDC")
    canvas.style(ax, layer_axis="x")
    canvas.legend(ax)
    for ax, (metric, ylabel) in zip(axes[0, 1:], (("mad", canvas.MAD_LABEL), ("entropy", "normalised entropy"))):
        for head, values in sorted(per_head[metric].items()):
            layers = sorted(values)
            ax.plot(layers, [values[layer] for layer in layers], "o-", ms=3, lw=1, color=f"C{head % 10}",
                    label=f"head {head}")
        ax.set(title=f"{'MAD' if metric == 'mad' else 'entropy'} per head", xlabel="layer", ylabel=ylabel,
               ylim=(0, 1.02))
        if metric == "mad":
            canvas.uniform_level(ax, [grid])
        canvas.style(ax, layer_axis="x", min_span=None)
    canvas.legend(axes[0, 2], ncols=2)
    fig.suptitle(title, fontsize=canvas.FONT)  # shown alone in MLflow, so it names its trial and checkpoint
    return fig


def record_checkpoint(uri: str, experiment_id: str, trial_id: str, run_id: str | None, epoch: int,
                      rows: list[dict[str, Any]], grid: int, *, figure: bool, table: str) -> str:
    """``log_checkpoint`` on the trial's run: ``run_id`` (its trials row's ``mlflow_run_id``), a search only
    where it is missing or not the trial's. Returns a note naming the points whose earlier value MLflow
    keeps, which this measurement changed (its new values are in the measurements ``table``), or ""."""
    run_id = tracking.find_trial_run(uri, experiment_id, trial_id, run_id)
    if run_id is None:
        return ""
    changed = log_checkpoint(uri, run_id, trial_id, epoch, rows, grid, figure=figure)
    if not changed:
        return ""
    keys = sorted({k for k, *_ in changed})
    return (f"MLflow run {run_id} keeps the earlier value of {len(changed)} metric point(s) at checkpoint epoch "
            f"{epoch} ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}), which this measurement changed; "
            f"the new values are in {table}")


def log_checkpoint(uri: str, run_id: str, trial_id: str, epoch: int, rows: list[dict[str, Any]], grid: int,
                   *, figure: bool = True) -> list[tuple[str, int, float, float]]:
    """Scalars, per-layer curves and (``figure``) the figure of one checkpoint (a G x G ``grid``) on the
    trial's run; a (key, step) the run already has is not logged again. Returns the points whose kept
    value differs (``records.measurements.log_new_points``)."""
    scalars = {key: {epoch: value} for key, value in summarize(rows).items()}
    changed = measurements.log_new_points(uri, run_id, {**scalars, **layer_profiles(rows, epoch)})
    if not figure:
        return changed
    from analysis.measuring import canvas  # (see trial_figure)

    fig = trial_figure(rows, f"{trial_id}, checkpoint epoch {epoch}", grid)
    with tempfile.TemporaryDirectory(prefix="vitsweep-fig-") as tmp:
        for ext, render in (("png", canvas.render_png), ("svg", canvas.render_svg)):
            path = Path(tmp) / f"layers_epoch_{int(epoch):04d}.{ext}"
            path.write_bytes(render(fig))
            tracking.log_artifact_file(uri, run_id, path, "figures")
    return changed
