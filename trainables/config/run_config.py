"""RunConfig: everything one trial needs, as one frozen dataclass.

A run config is the unit every layer exchanges: a study file produces a list of them, Tune's param
space carries them as flat dicts, MLflow logs them as params and the Parquet ``trials`` table stores
them as columns. So it flattens to scalar key/values and rebuilds from them:

    cfg = RunConfig.for_dataset("cifar100", preset="study_l", pe="rope2d", cutmix=True)
    flat = cfg.to_flat()            # {"dataset": "cifar100", ..., "pe": "rope2d", "dim": 192, ...}
    assert RunConfig.from_flat(flat) == cfg

Model fields (``ViTConfig``) are flattened beside the run fields without a prefix. Nothing here
imports torch (``ViTConfig`` is ``trainables/config/architecture.py``, ``Protocol`` ``trainables/config/switches.py``,
the data-set rows ``trainables/config/data_roots.py``), so building and listing a sweep's trials is quick.

Defaults are this project's plain choices, not a paper's recipe: AdamW lr 1e-3, weight decay 0.05 with
timm's exemptions (no decay on biases, norms, CLS and learned PE), batch 128, 100 epochs, 10 warm-up
epochs, cosine decay, CutMix on every batch when on, crop padding img_size // 8. The study files set
each paper's recipe: ``sweeps/studies/study_l.py`` (and ``factorial``) Lee et al. 2021's script where Study L
is silent (decay on every parameter, padding 4, CutMix probability 0.5), ``sweeps/studies/study_p.py`` Study
P's optimiser.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from records import vocab
from records.vocab import EXECUTION_FIELDS
from trainables.config import data_roots
from trainables.config.architecture import PRESETS, ViTConfig
from trainables.config.fields import Spec, check_fields, spec, specs
from trainables.config.switches import Protocol

HOLDOUT_FRACTION = 0.05  # a tuning run's holdout, unless it asks for another share

# Fields that say where or how a run executes, not what it computes (records.vocab.EXECUTION_FIELDS)
# stay out of the trial id, so moving the data or changing the device resumes the same trial
# instead of starting a new one.

# The fields every trial id has hashed since ids began. A field added later enters the hash only when it
# differs from its default, so adding a field (cutmix_prob, ...) leaves every existing id, and its results, in place.
_ID_FIELDS_V1 = frozenset((
    "study", "dataset", "preset", "rpt", "rpt_per_image", "autoaugment", "cutmix", "label_smoothing",
    "optimizer", "lr", "weight_decay", "batch_size", "epochs", "warmup_epochs", "schedule", "seed", "eval_split",
    "holdout_fraction", "max_train_images", "checkpoint_every", "amp", "protocol", "img_size", "patch_size",
    "in_chans", "num_classes", "dim", "depth", "heads", "mlp_ratio", "pe", "drop_rate", "attn_drop_rate",
    "proj_drop_rate", "drop_path_rate", "ape_init", "rope_base",
))


@dataclass(frozen=True)
class RunConfig:
    study: str = spec("adhoc")
    dataset: str = spec("shapes", choices=data_roots.DATASET_SPECS.keys())  # live: a row added later is valid
    data_root: str = spec("data")
    preset: str = spec("study_l", choices=PRESETS.keys())
    model: ViTConfig = field(default_factory=ViTConfig)
    rpt: bool = spec(False, help="RPT: shuffle the patch tokens at every forward pass")
    rpt_per_image: bool = spec(False, help="one permutation per image instead of per batch")
    # The three protocol switches of Study L.
    autoaugment: bool = spec(False)
    cutmix: bool = spec(False)
    label_smoothing: bool = spec(False)
    cutmix_prob: float = spec(1.0, ge=0, le=1, help="share of batches CutMix mixes when on (Lee et al.'s "
                              "mix_prob: 0.5, set by Study L)")
    optimizer: str = spec("adamw", choices=("adamw", "adam"), help="adam: Adam with coupled L2 weight decay, "
                          "as in Study P")
    lr: float = spec(1e-3, gt=0)
    weight_decay: float = spec(0.05, ge=0)
    decay_exempt: str = spec("timm", choices=("timm", "none"), help=(
        "which parameters escape weight decay: timm exempts biases, norms, the CLS token and the learned PE "
        "(AdamW/timm/DeiT); none decays every parameter, as Study P's torch.optim.Adam(model.parameters()) and "
        "Lee et al. do (Study L sets it)"))
    batch_size: int = spec(128, ge=1)
    epochs: int = spec(100, ge=1)
    warmup_epochs: int = spec(10, ge=0, help="at most epochs")
    schedule: str = spec("cosine", choices=("cosine", "constant"))
    seed: int = spec(0, ge=0)
    eval_split: str = spec("test", choices=("test", "holdout"), help="holdout for tuning: never tune on the test split")
    holdout_fraction: float = spec(0.0, ge=0, lt=1, help=(
        "share of the training split held out to score a tuning run (eval_split=holdout; 0 there means "
        "HOLDOUT_FRACTION); a test-scored run holds nothing out: 0, whatever was asked"))
    crop_padding: int = spec(0, ge=0, help="zero padding (pixels) of the random crop below 224 px; 0: img_size // 8 "
                             "(Lee et al. pad 4 at every size, which Study L's files set)")
    max_train_images: int = spec(0, ge=0, help="0: the whole train split; a cap for demos and tests")
    epoch_eval_images: int = spec(0, ge=0, help=(
        "images of a fixed class-stratified subset of the evaluation split scored after each epoch but the "
        "last, which scores the whole split (0: the whole split every epoch); the epochs table's eval_images"))
    checkpoint_every: int = spec(1, ge=1, help="epochs between resumable checkpoints")
    checkpoint_interval_s: float = spec(0.0, ge=0, help=(
        "... and at least this many seconds between them (0: every checkpoint_every epochs): at GPU speed an "
        "epoch takes seconds, and a checkpoint per epoch would cost more than the epoch"))
    device: str = spec("auto", choices=("auto", "cpu", "cuda"))
    amp: bool = spec(True, help="bf16 autocast, used on CUDA only (slower on CPU)")
    num_workers: int = spec(-1, ge=-1, help="decode workers for folder-backed sets; -1: the CPUs the trial holds, "
                            "less one")
    gpu_decode: bool = spec(False, help=(
        "folder-backed sets on CUDA: the DataLoader workers only read the files and the JPEGs are decoded on the GPU "
        "(nvjpeg; its pixels may differ from the CPU decoder's by a level): for a run whose CPUs cannot decode "
        "fast enough, at two host syncs per step"))
    compile: bool = spec(False, help="torch.compile the model (CUDA only; slower on CPU); execution only")
    # The fields a `--set KEY=V1,V2` sweep varies (comma-separated), named in the trial id's readable
    # part; set by the launcher, not by --set (no spec). Left out of the flat form while empty, so an
    # unswept trial's id, row and params are what they were.
    swept: str = ""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.gpu_decode and self.device == "cpu":
            raise ValueError("gpu_decode decodes a folder-backed set's JPEGs on CUDA, and device is 'cpu': use "
                             "device 'cuda' or 'auto', or leave gpu_decode off")
        if self.warmup_epochs > self.epochs:
            raise ValueError(f"warmup_epochs must lie in [0, epochs={self.epochs}], got {self.warmup_epochs}")
        # The holdout exists only to score tuning runs: a test-scored run trains on every training image.
        # Normalised here (not only in the study files) so a flat round trip or --set eval_split=... agrees.
        if self.eval_split == "test" and self.holdout_fraction:
            object.__setattr__(self, "holdout_fraction", 0.0)
        elif self.eval_split == "holdout" and not self.holdout_fraction:
            object.__setattr__(self, "holdout_fraction", HOLDOUT_FRACTION)

    # -- derived names ---------------------------------------------------
    @property
    def protocol(self) -> Protocol:
        return Protocol(self.autoaugment, self.cutmix, self.label_smoothing)

    @property
    def pe(self) -> str:
        return self.model.pe

    # Cached: a launch and its dry run ask for it several times per trial (10,080 trials: 60,480 asks,
    # each a to_flat() and a hash). Frozen, model included, so it cannot go stale: a changed field is a
    # new config (dataclasses.replace, with_overrides), with no cached id.
    @cached_property
    def trial_id(self) -> str:
        """Stable, readable id: the headline factors plus a hash of every field that changes what is
        computed, e.g. ``cifar100-ape-rpt-cutmix-s3-1a2b3c4d``."""
        defaults = _defaults()
        whole = self.to_flat()
        flat = {k: v for k, v in whole.items()
                if k not in EXECUTION_FIELDS and (k in _ID_FIELDS_V1 or k not in defaults or v != defaults[k])}
        digest = hashlib.sha1(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:8]
        order = "-rpt" if self.rpt else ""
        # A swept field's value, e.g. `-lr0.0005` (the digest is the same as without the label).
        label = "".join(f"-{k}{_id_value(whole[k])}" for k in self.swept.split(",") if k in whole and k not in _NAMED)
        return f"{self.dataset}-{self.pe}{order}-{self.protocol.name}{label}-s{self.seed}-{digest}"

    # -- flat form ---------------------------------------------------------
    def to_flat(self) -> dict[str, Any]:
        """One flat dict of scalars: run fields, ``protocol`` (derived) and model fields."""
        run = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}
        if not run["swept"]:
            del run["swept"]
        run["protocol"] = self.protocol.name
        return {**run, **self.model.to_flat()}

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> RunConfig:
        """Inverse of ``to_flat``: each value checked and cast as an override is (`_split`); an unknown key
        raises, and so does a ``protocol`` that contradicts the switches."""
        run, model = _split({k: v for k, v in flat.items() if k != "protocol"})
        cfg = cls(**run, model=ViTConfig(**model))
        if "protocol" in flat and flat["protocol"] != cfg.protocol.name:
            raise ValueError(f"protocol {flat['protocol']!r} contradicts the switches (autoaugment={cfg.autoaugment}, "
                             f"cutmix={cfg.cutmix}, label_smoothing={cfg.label_smoothing})")
        return cfg

    def with_overrides(self, overrides: dict[str, Any]) -> RunConfig:
        """Apply flat ``key=value`` overrides (run or model fields), each of its field's type (a ``--set``
        string is typed at the command line's edge, and refused here); ``protocol=NAME`` sets the switches."""
        run, model = _split(overrides)
        return replace(self, **run, model=replace(self.model, **model) if model else self.model)

    @classmethod
    def for_dataset(cls, dataset: str, *, preset: str, **overrides: Any) -> RunConfig:
        """A run config whose model fits ``dataset``: preset architecture with the data
        set's image size, patch size (the study's 8x8 or 14x14 grid) and class count (its row,
        ``trainables.config.data_roots.DATASET_SPECS``; a ``folder`` set's read from ``data_root``)."""
        info = data_roots.dataset_spec(dataset, overrides.get("data_root"))
        run, model = _split(overrides)
        vit = ViTConfig.preset(preset, **{"img_size": info.img_size, "patch_size": info.patch_size,
                                          "num_classes": info.num_classes, **model})
        return cls(**{"dataset": dataset, "preset": preset, **run}, model=vit)


# Every key of `to_flat()` a user may set, with its spec: the run fields, the derived protocol, the ViT's.
FIELD_SPECS: dict[str, Spec] = {**specs(RunConfig), "protocol": Spec(str, choices=vocab.PROTOCOLS), **specs(ViTConfig)}

_MODEL_FIELDS = frozenset(f.name for f in fields(ViTConfig))
# Fields the trial id names already (a sweep over them adds no label).
_NAMED = frozenset(("dataset", "pe", "rpt", "protocol", "autoaugment", "cutmix", "label_smoothing", "seed", "swept"))


def _split(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run fields, model fields) of flat overrides, each checked by its spec and cast to its type (Tune
    samples numpy numbers); ``protocol`` becomes its switches; an unknown key raises ValueError."""
    run: dict[str, Any] = {}
    model: dict[str, Any] = {}
    for key, value in overrides.items():
        spec = FIELD_SPECS.get(key)
        if spec is None and key != "swept":  # (`swept`, set by the launcher, has no spec)
            raise ValueError(f"unknown run-config field {key!r}; valid fields: {sorted(FIELD_SPECS)}")
        if spec is not None and not spec.valid(value):
            raise spec.error(key, value)
        if key == "protocol":
            run.update(vocab.protocol_switches(value))
        else:
            (model if key in _MODEL_FIELDS else run)[key] = value if spec is None else spec.kind(value)
    return run, model


def _id_value(value: Any) -> str:
    """A field's value as a trial id's readable part writes it: `0.0005`, `6`, `_adam`, `_true`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        text = str(value).lower() if isinstance(value, bool) else str(value)
        return "_" + "".join(c if c.isalnum() or c in "._+" else "_" for c in text)
    return f"{value:g}"


def _defaults() -> dict[str, Any]:
    """Each run and model field's dataclass default (fields without one are absent)."""
    return {f.name: f.default for cls in (RunConfig, ViTConfig) for f in fields(cls)
            if f.default is not dataclasses.MISSING}
