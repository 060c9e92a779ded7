"""Every measurement of both studies for one checkpoint, as long-format rows (STUDIES.md, records/schema.py).

``evaluate_checkpoint`` runs a model over a fixed evaluation set (by default the whole test split)
under every condition and returns rows ``{intervention, level, layer, head_index, metric, value,
n_images}`` in the measurements vocabulary; the caller adds ``trial_id``, ``study`` and
``checkpoint_epoch`` and hands them to ``records.tables``.

A *pass* is one model forward per batch under one (image intervention, PE scale, RPI) condition,
asking the model only for what that pass feeds (tokens for SSDC, attention maps only for the clean
pass). The loop is batch-major: each batch is transformed once per image intervention (JPEG, blur)
and pushed through every pass that uses it, so no transformed copy of the evaluation set is held.
Passes that coincide (alpha = 1 is the trained model) run once. Accumulators keep SSDC and attention
statistics over the whole subset: one per (pass, layer, coordinate frame).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from analysis.measuring import metrics
from analysis.measuring.interventions import (ALPHAS, BLUR_KERNEL, BLUR_LEVELS, JPEG_LEVELS, PAPER_RPI_BATCH, Clean,
                                              GaussianBlur, Intervention, Jpeg, PEScale, RandomPermutation, RopeScale,
                                              apply_condition)
from records.schema import PAIRED_COUNTS
from records.vocab import BLUR_HEADLINE, JPEG_HEADLINE
from trainables.data.datasets import capped_subset
from trainables.data.images import normalize  # the training loop's normalisation, so both see the same inputs
from trainables.model.pos_embed import POS_EMBEDS

# Alpha scaling per PE, declared by its class (`PositionalEncoding.alpha_scaling`): Study P's `pe_scale`
# multiplies an additive table; on the rotary PEs the same multiplier scales the rotation angles, position
# interpolation, measured as `rope_scale`; None (`none`) has nothing to scale.
ALPHA_SCALES: dict[str, type[PEScale]] = {scale.name: scale for scale in (PEScale, RopeScale)}


def alpha_scale(pe: str | None) -> type[PEScale] | None:
    """The alpha intervention of the registered PE ``pe`` (``PEScale`` or ``RopeScale``), or None: no alpha rows.

    Read from the registry at call time, so a PE registered later (a test's, a plug-in's) is measured too.
    """
    if pe is None or pe not in POS_EMBEDS:
        return None
    scaling = POS_EMBEDS[pe].alpha_scaling
    if scaling is not None and scaling not in ALPHA_SCALES:
        raise ValueError(f"pe={pe!r} declares alpha_scaling={scaling!r}; valid: {[*ALPHA_SCALES, None]}")
    return None if scaling is None else ALPHA_SCALES[scaling]


def evaluation_subset(split: Any, size: int | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluation set of a split: (images uint8 (n, 3, H, W), labels int64 (n,)).

    ``size`` None (the default) or >= len(split): the whole split, as the Study P code measured all 5,000
    ImageNet-100 validation images (a 1,000-image subset leaves a fragility score a binomial standard error of
    ~0.017, the size of the paper's seed spread). A smaller ``size`` is a cap for pilots, demos and tests: the
    class-stratified draw the training loop scores every epoch (``trainables.data.datasets.capped_subset``, a
    function of the labels and ``seed`` only), so every trial and snapshot of a data set is measured on the same
    images, and with the default seed on the images of ``epoch_eval_images`` of the same size (a cap below the
    number of classes: a seeded draw). Indices ascend, so folder-backed splits are read in order. ``split``: a
    Dataset of (uint8 image (3, H, W), int label) with ``.labels`` (``TensorImages``, ``ImageFiles``); in-memory
    ``.images`` are sliced directly.
    """
    if size is not None and size < 1:
        raise ValueError(f"evaluation subset size {size} must be >= 1 (or None: the whole split)")
    labels = torch.as_tensor(split.labels)
    if size is None or size >= labels.unique().numel():
        indices = capped_subset(labels, size or len(split), seed=seed)
    else:  # too few to hold every class (a smoke test's cap): a seeded draw, the same for every trial
        indices = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))[:size].sort().values
    if hasattr(split, "images"):
        return split.images[indices], labels[indices].long()
    items = [split[int(i)] for i in indices]
    return torch.stack([image for image, _ in items]), torch.tensor([int(label) for _, label in items])


@dataclass
class _Pass:
    """One model condition over the evaluation subset and what it accumulates."""

    image: Intervention  # Clean, Jpeg or GaussianBlur: acts on uint8 images
    model: tuple[Intervention, ...]  # PEScale and/or RandomPermutation: act on the model call
    tokens: bool = False  # SSDC at token indices (clean, or RPI scored against index coordinates)
    group: int = 0  # > 0: SSDC of each group of this many images, averaged over groups (the paper's RPI estimator)
    content: bool = False  # SSDC un-permuted to the patches' positions (RPI, content coordinates)
    attention: bool = False  # MAD, entropy, CLS mass
    correct: torch.Tensor | int = 0  # a device tensor while running: no host sync per forward
    total: int = 0
    hits: list[torch.Tensor] = field(default_factory=list)  # per batch, bool (B,): image right? (paired counts)
    ssdc_index: list[metrics.SSDCAccumulator] = field(default_factory=list)  # per layer
    ssdc_content: list[metrics.SSDCAccumulator] = field(default_factory=list)
    ssdc_group: list[metrics.GroupSSDC] = field(default_factory=list)
    attention_stats: list[metrics.AttentionAccumulator] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return int(self.correct) / self.total

    @property
    def right(self) -> torch.Tensor:
        """bool (n,): which evaluation images this pass classified correctly, in evaluation order."""
        return torch.cat(self.hits).cpu()

    def ssdc(self, content: bool = False) -> list[float]:
        return [a.ssdc() for a in (self.ssdc_content if content else self.ssdc_index)]


class APENormRatio:
    """How loud a learned APE is beside the image content: the mean row norm of the APE table (CLS
    slot excluded) over the mean norm of the images' patch embeddings (before the PE). PE scaling
    multiplies the table, so a PE-scaling curve is read beside this ratio; weight decay on the table
    (or on the patch embedding) moves it."""

    def __init__(self, table: torch.Tensor):
        self.table_norm = float(table.detach()[0, 1:].float().norm(dim=-1).mean())  # table: (1, T, D)
        self.patch_norm_sum: torch.Tensor | float = 0.0
        self.count = 0

    def update(self, patches: torch.Tensor) -> None:
        """Add the patch embeddings (B, N, D) of a batch (``model.patch_embed(x)``)."""
        self.patch_norm_sum = self.patch_norm_sum + patches.detach().float().norm(dim=-1).sum()
        self.count += patches.shape[0] * patches.shape[1]

    def ratio(self) -> float:
        return self.table_norm / (float(self.patch_norm_sum) / self.count)


def learned_ape(model: nn.Module) -> torch.Tensor | None:
    """The learned additive table (1, T, D) of ``model`` (``ape``), or None (a fixed table is a buffer)."""
    table = getattr(getattr(model, "pe", None), "table", None)
    return table if isinstance(table, nn.Parameter) else None


class _Plan:
    """The passes an evaluation needs, deduplicated by condition."""

    def __init__(self, seed: int, model: nn.Module):
        table = learned_ape(model)
        self.ape_ratio = APENormRatio(table) if table is not None else None
        self.rpi = RandomPermutation(seed)  # one permutation per image: the RPI rows' estimand
        self.rpi_paper = RandomPermutation(seed, group=PAPER_RPI_BATCH)  # the paper's: one per 1,000 images
        self.passes: dict[tuple, _Pass] = {}

    def need(self, image: Intervention, *, alpha: float = 1.0, scale: type[PEScale] = PEScale,
             rpi: RandomPermutation | None = None, **wants: bool) -> _Pass:
        model = ((scale(alpha),) if alpha != 1.0 else ()) + ((rpi,) if rpi else ())
        run = self.passes.setdefault((image, model), _Pass(image, model))
        for name, wanted in wants.items():
            setattr(run, name, getattr(run, name) or wanted)
        return run

    def by_image(self) -> dict[Intervention, list[_Pass]]:
        groups: dict[Intervention, list[_Pass]] = {}
        for run in self.passes.values():
            groups.setdefault(run.image, []).append(run)
        return groups


def _run_passes(model: nn.Module, plan: _Plan, images: torch.Tensor, labels: torch.Tensor, *, mean: Sequence[float],
                std: Sequence[float], grid: int, batch_size: int, device: torch.device) -> None:
    num_patches = grid * grid
    groups = plan.by_image()
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size].to(device)
        target = labels[start : start + batch_size].to(device)
        positions = range(start, start + len(batch))
        for image_intervention, runs in groups.items():
            x = normalize(image_intervention.images(batch), mean, std)
            if image_intervention == Clean() and plan.ape_ratio is not None:
                plan.ape_ratio.update(model.patch_embed(x))
            for run in runs:
                _, kwargs = apply_condition(run.model, x, positions=positions, num_patches=num_patches, device=device)
                wants_tokens = run.tokens or run.content or run.group > 0
                out = model(x, return_tokens=wants_tokens, return_attention=run.attention, **kwargs)
                hit = out.logits.argmax(-1) == target
                run.correct = run.correct + hit.sum()
                run.hits.append(hit)
                run.total += len(target)
                if wants_tokens:
                    _update_ssdc(run, out.tokens, kwargs.get("perm"), grid, positions)
                if run.attention:
                    if not run.attention_stats:
                        run.attention_stats = [metrics.AttentionAccumulator(grid) for _ in out.attention]
                    for accumulator, attn in zip(run.attention_stats, out.attention):
                        accumulator.update(attn)


def _update_ssdc(run: _Pass, tokens: list[torch.Tensor], perm: torch.Tensor | None, grid: int,
                 positions: range) -> None:
    """Feed each layer's patch tokens (B, N, D) (CLS dropped) to the pass's SSDC accumulators."""
    if run.tokens and not run.ssdc_index:
        run.ssdc_index = [metrics.SSDCAccumulator(grid) for _ in tokens]
    if run.content and not run.ssdc_content:
        if perm is None:
            raise ValueError("content-coordinate SSDC needs a permuted pass (RPI)")
        run.ssdc_content = [metrics.SSDCAccumulator(grid) for _ in tokens]
    if run.group and not run.ssdc_group:
        run.ssdc_group = [metrics.GroupSSDC(grid) for _ in tokens]
    for layer, layer_tokens in enumerate(tokens):
        patches = layer_tokens[:, 1:]
        if run.group:
            run.ssdc_group[layer].update(patches, [p // run.group for p in positions])
        if run.tokens:
            run.ssdc_index[layer].update(patches)  # scored where the tokens sit: index coordinates
        if run.content:
            run.ssdc_content[layer].update(patches, perm=perm)


_WHOLE = None  # layer / head_index of a row that is not per layer / not per head (null in Parquet)


def _row(intervention: str, level: float | None, layer: int | None, head: int | None, metric: str,
         value: float) -> dict[str, Any]:
    return {"intervention": intervention, "level": None if level is None else float(level),
            "layer": None if layer is None else int(layer), "head_index": None if head is None else int(head),
            "metric": metric, "value": float(value)}


def _paired_rows(intervention: str, level: float, clean: _Pass, shifted: _Pass, prefix: str = "") -> list[dict]:
    """The paired counts of one shift against its clean pass (``PAIRED_COUNTS``), FS's sampling error."""
    counts = metrics.paired_counts(clean.right, shifted.right)
    return [_row(intervention, level, _WHOLE, _WHOLE, prefix + name, v)
            for name, v in zip(PAIRED_COUNTS, counts)]


def _delta_ssdc(per_layer: list[float]) -> float:
    """dSSDC, NaN for a one-block model (it has no layer 1)."""
    return metrics.delta_ssdc(per_layer) if len(per_layer) >= 2 else math.nan


def evaluate_checkpoint(model: nn.Module, images_uint8: torch.Tensor, labels: torch.Tensor, *, mean: Sequence[float],
                        std: Sequence[float], grid: int, seed: int = 0, batch_size: int = 128,
                        jpeg_levels: Sequence[int] = JPEG_LEVELS, blur_levels: Sequence[float] = BLUR_LEVELS,
                        alphas: Sequence[float] = ALPHAS,
                        device: torch.device | str | None = None) -> list[dict[str, Any]]:
    """All Study P and Study L measurements of one model, as measurement rows.

    model: a ``trainables.model.vit.ViT`` (forward with perm / pe_scale / return_tokens / return_attention;
    ``model.config.pe`` decides whether alphas apply). images_uint8: (n, 3, H, W) uint8, labels: (n,)
    int; mean, std: the data set's normalisation; grid: G (N = G*G patches). seed: RPI permutations (one
    per image, a function of seed and the image's position, so the same for every model, batch size and
    evaluation size; the ``*_per_batch`` rows: one per ``PAPER_RPI_BATCH`` images, of seed and group
    index). jpeg_levels: qualities; blur_levels: sigmas at kernel ``BLUR_KERNEL``; alphas: PE scales,
    skipped when the model has no PE (``none``): ``pe_scale`` rows for additive PEs, ``rope_scale`` rows
    (position interpolation) for rotary ones.

    Returns rows {intervention, level, layer, head_index, metric, value, n_images} (layer None =
    whole model, head_index None = not per head; n_images = len(labels), the images behind every row):
      clean/None:    acc; ssdc per layer; mad, mad_raw, mad_no_renorm, entropy, cls_mass per layer x head;
                     ape_norm_ratio (``APENormRatio``) for a learned APE
      jpeg/quality:  acc, fs          blur/sigma: acc, fs
                     and per shift the paired counts right_both, right_clean_only, right_shift_only
                     (``metrics.paired_counts``: FS's sampling error, ``seedstats.fragility_se``)
      rpi/None:      acc; ssdc (index coordinates), ssdc_content, ssdc_per_batch per layer; dssdc,
                     dssdc_per_batch
      pe_scale/alpha: acc; fs_jpeg (q JPEG_HEADLINE); fs_blur (BLUR_HEADLINE); ssdc per layer under
                      RPI (index coordinates); dssdc; fs_jpeg_right_both, ... (their paired counts)
      rope_scale/alpha: the same metrics as pe_scale, for rope2d / rope2d_mixed
    Which of the two (or neither) a PE gets is its class's ``alpha_scaling`` (``alpha_scale``).
    The model is put in eval mode for the evaluation and its previous mode restored.
    """
    if images_uint8.dtype != torch.uint8:
        raise ValueError(f"images_uint8 must be uint8 (n, 3, H, W): interventions act before normalisation; "
                         f"got {images_uint8.dtype}")
    if len(images_uint8) != len(labels) or len(labels) == 0:
        raise ValueError(f"need as many labels as images (>0); got {len(images_uint8)} images, {len(labels)} labels")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    pe = getattr(getattr(model, "config", None), "pe", None)
    scale = alpha_scale(pe)
    scaled_alphas = [float(a) for a in alphas] if scale is not None else []
    scale = scale or PEScale

    clean = Clean()
    jpeg_headline, blur_headline = Jpeg(JPEG_HEADLINE), GaussianBlur(BLUR_HEADLINE[1], BLUR_HEADLINE[0])

    plan = _Plan(seed, model)
    clean_pass = plan.need(clean, tokens=True, attention=True)
    rpi_pass = plan.need(clean, rpi=plan.rpi, tokens=True, content=True)
    rpi_paper_pass = plan.need(clean, rpi=plan.rpi_paper, group=plan.rpi_paper.group)
    jpeg_passes = {q: plan.need(Jpeg(q)) for q in jpeg_levels}
    blur_passes = {s: plan.need(GaussianBlur(s, BLUR_KERNEL)) for s in blur_levels}
    alpha_passes = {a: (plan.need(clean, alpha=a, scale=scale), plan.need(jpeg_headline, alpha=a, scale=scale),
                        plan.need(blur_headline, alpha=a, scale=scale),
                        plan.need(clean, alpha=a, scale=scale, rpi=plan.rpi, tokens=True))
                    for a in scaled_alphas}

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _run_passes(model, plan, images_uint8, labels, mean=mean, std=std, grid=grid, batch_size=batch_size,
                        device=device)
    finally:
        model.train(was_training)

    rows: list[dict[str, Any]] = []
    acc_clean = clean_pass.accuracy
    rows.append(_row("clean", None, _WHOLE, _WHOLE, "acc", acc_clean))
    rows.extend(_row("clean", None, layer, _WHOLE, "ssdc", v) for layer, v in enumerate(clean_pass.ssdc()))
    if plan.ape_ratio is not None:
        rows.append(_row("clean", None, _WHOLE, _WHOLE, "ape_norm_ratio", plan.ape_ratio.ratio()))
    for layer, stats in enumerate(clean_pass.attention_stats):
        per_head = {
            "mad": stats.mean_attention_distance(normalize=True),
            "mad_raw": stats.mean_attention_distance(normalize=False),
            "mad_no_renorm": stats.mean_attention_distance(normalize=True, renormalize=False),
            "entropy": stats.entropy(),
            "cls_mass": stats.cls_mass(),
        }
        for metric, values in per_head.items():
            rows.extend(_row("clean", None, layer, head, metric, v) for head, v in enumerate(values.tolist()))

    for name, passes in (("jpeg", jpeg_passes), ("blur", blur_passes)):
        for level, run in passes.items():
            rows.append(_row(name, level, _WHOLE, _WHOLE, "acc", run.accuracy))
            rows.append(_row(name, level, _WHOLE, _WHOLE, "fs", metrics.fragility(acc_clean, run.accuracy)))
            rows.extend(_paired_rows(name, level, clean_pass, run))

    rpi_index = rpi_pass.ssdc()
    rows.append(_row("rpi", None, _WHOLE, _WHOLE, "acc", rpi_pass.accuracy))
    rows.extend(_row("rpi", None, layer, _WHOLE, "ssdc", v) for layer, v in enumerate(rpi_index))
    rows.extend(_row("rpi", None, layer, _WHOLE, "ssdc_content", v)
                for layer, v in enumerate(rpi_pass.ssdc(content=True)))
    rows.append(_row("rpi", None, _WHOLE, _WHOLE, "dssdc", _delta_ssdc(rpi_index)))
    rpi_batches = [a.ssdc() for a in rpi_paper_pass.ssdc_group]
    rows.extend(_row("rpi", None, layer, _WHOLE, "ssdc_per_batch", v) for layer, v in enumerate(rpi_batches))
    rows.append(_row("rpi", None, _WHOLE, _WHOLE, "dssdc_per_batch", _delta_ssdc(rpi_batches)))

    name = scale.name
    for alpha, (plain, jpeg, blur, rpi) in alpha_passes.items():
        rows.append(_row(name, alpha, _WHOLE, _WHOLE, "acc", plain.accuracy))
        rows.append(_row(name, alpha, _WHOLE, _WHOLE, "fs_jpeg", metrics.fragility(plain.accuracy, jpeg.accuracy)))
        rows.append(_row(name, alpha, _WHOLE, _WHOLE, "fs_blur", metrics.fragility(plain.accuracy, blur.accuracy)))
        rows.extend(_paired_rows(name, alpha, plain, jpeg, "fs_jpeg_"))
        rows.extend(_paired_rows(name, alpha, plain, blur, "fs_blur_"))
        ssdc_rpi = rpi.ssdc()
        rows.extend(_row(name, alpha, layer, _WHOLE, "ssdc", v) for layer, v in enumerate(ssdc_rpi))
        rows.append(_row(name, alpha, _WHOLE, _WHOLE, "dssdc", _delta_ssdc(ssdc_rpi)))
    for row in rows:  # every value here is over the same images: the n behind its binomial standard error
        row["n_images"] = len(labels)
    return rows
