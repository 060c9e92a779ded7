"""A study's data model: its Parquet tables cleaned and joined, with the views every figure, claim
and table reads (``StudyData``); the summary table and the report both start here.

    data = StudyData.load("results", "study_l")      # <results>/<study>/{trials,epochs,measurements}/
    data.per_trial                                   # one row per counted trial: factors + headline metrics
    data.select("jpeg", "fs", level=5.0)             # measurement rows at each trial's last checkpoint
    data.pin(df, keep={"protocol"})                  # the factors not shown held at one value

Conventions: a *condition* is one value of each factor (dataset, pe, rpt, protocol) and of every other
config field that varies among trials of one factor cell (``condition_fields``: an ``--set lr=...``
run, a second launch with other epochs); a *trial* is one seed of a condition and the unit of every
spread and test. Two trials with the same seed in one condition are not two seeds: one is counted and
the report's Notes name the rest as an error, never pooled (the cleaning: ``analysis.statistics.conditions``).
Figures and claims hold the fields they do not show at one value (``StudyData.pin``). Only finished
trials count. Unless a figure is about training time, each trial contributes its last measured checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pandas.api.types import union_categoricals
from pyarrow import fs as pafs
from scipy import stats

from analysis.statistics.conditions import TRIAL_KEYS, normalise_trials
from analysis.statistics.labels import REFERENCE
from analysis.statistics.seedstats import binomial_se, fragility_se, fragility_se_without_counts
from records import tables, vocab
from records.layout import filesystem, study_dir, table_path
from records.schema import EPOCHS, MEASUREMENTS, PAIRED_COUNTS, SUMMARY_FIELDS, TRIAL_FIELDS
from trainables.config.data_roots import DATASET_SPECS

PE_SCALE_COLLAPSE = 0.4  # Study P: at PE scale <= 0.4 the APE's dSSDC is 0 and FS JPEG at its `none` level
PE_SCALE_LOWEST = 0.1  # the paper's PE-scaling table covers 0.1-1.0 (alpha 0, measured here, equals `none`)
# Minimum MAD falls as heads are added (a minimum over L x H heads: 64 in study_l, 96 in study_p), so
# the mean MAD of these layers stands beside it, comparable across presets (``mad_early``).
EARLY_LAYERS = (0, 1)
# The columns each table is read with (None: all; a trial's config columns are the study's own): every
# row of epochs and measurements is of this study, so its `study` column is not read.
LOADED = {"trials": None, "epochs": [c for c in EPOCHS.names if c != "study"],
          "measurements": [c for c in MEASUREMENTS.names if c != "study"]}


@dataclass
class StudyData:
    """A study's tables, cleaned and joined; every frame carries the factor columns of its trial.

    trials: finished trials, one row each; dataset, pe, rpt (bool), protocol (canonical name), seed,
        model (``ape + RPT``) and the three protocol switches are always present.
    epochs: per-epoch rows of those trials.  raw_trials: the trials table as stored (all statuses), for the
    configuration section.
    measurements: long rows of every measured checkpoint of those trials, lean (11.75 million rows at 10,000
    trials): every column but ``value`` categorical (``trial_id``'s categories are ``trials.trial_id``), and no
    factor columns; ``select`` gives rows as stored, with their trial's factors.
    """

    study: str
    trials: pd.DataFrame
    epochs: pd.DataFrame
    measurements: pd.DataFrame
    raw_trials: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)
    condition_fields: list[str] = field(default_factory=list)  # config fields that split a factor cell
    stored: dict[str, Any] = field(default_factory=dict)  # each measurements column's dtype as stored

    @classmethod
    def load(cls, results: str, study: str) -> StudyData:
        fs, root = filesystem(study_dir(results, study))
        if fs.get_file_info(root).type != pafs.FileType.Directory:
            raise ValueError(f"no study {study!r} under {results!r}; studies there: {tables.list_studies(results)}")
        frames, notes = {}, []
        for name, columns in LOADED.items():
            if name == "measurements":  # categorical batch by batch: its stored form is most of a study's memory
                frames[name] = _categorical(tables.read_batches(results, study, name, columns), columns)
            else:
                table = tables.read_table(results, study, name, columns)
                frames[name] = pd.DataFrame() if table is None else table.to_pandas(self_destruct=True)
            if frames[name].empty:
                notes.append(f"table {name!r} is missing or empty ({table_path(results, study, name)}).")
        return cls.from_frames(study, frames["trials"], frames["epochs"], frames["measurements"], notes=notes)

    @classmethod
    def from_frames(cls, study: str, trials: pd.DataFrame, epochs: pd.DataFrame, measurements: pd.DataFrame,
                    *, notes: list[str] | None = None) -> StudyData:
        """Clean and join raw tables (as ``pandas.read_parquet`` returns them, or the measurements categorical)."""
        notes = list(notes or [])
        clean, extra = normalise_trials(trials, notes)
        keys = clean[[*TRIAL_KEYS, *extra]]
        joined_epochs = epochs.merge(keys, on="trial_id") if "trial_id" in epochs else pd.DataFrame()
        if measurements.empty or "trial_id" not in measurements:
            measurements = pd.DataFrame(columns=MEASUREMENTS.names)
        lean, stored = _lean(measurements, pd.Index(keys["trial_id"]))
        if dropped := len(measurements) - len(lean):
            notes.append(f"{dropped} measurement rows belong to no finished trial and are left out.")
        return cls(study, clean, joined_epochs, lean, trials, notes, extra, stored)

    # -- views ---------------------------------------------------------------------
    @cached_property
    def final(self) -> pd.DataFrame:
        """Measurement rows of each trial's last measured checkpoint (lean, as ``measurements``)."""
        m = self.measurements
        if m.empty:
            return m
        epoch = pd.Series(m["checkpoint_epoch"].cat.codes.to_numpy())  # categories sorted (``_lean``); null: -1
        last = epoch.groupby(m["trial_id"].cat.codes.to_numpy()).transform("max")
        return m[((epoch == last) & (epoch >= 0)).to_numpy()]

    def select(self, intervention: str, metric: str, *, level: float | None = None, per_layer: bool = False,
               per_head: bool = False, final: bool = True) -> pd.DataFrame:
        """Measurement rows of one (intervention, metric), optionally at one level; per_layer/per_head
        keep only rows with a layer / head_index (not null). ``final=False`` keeps every checkpoint. Rows as
        stored (level, layer and head_index as floats: NaN where not per level / layer / head), each with
        its trial's factor columns (``TRIAL_KEYS`` and ``condition_fields``)."""
        m = self.final if final else self.measurements
        if not m.empty:
            mask = (m["intervention"] == intervention) & (m["metric"] == metric)
            if level is not None:
                mask &= _category_mask(m["level"], lambda cats: np.isclose(cats.to_numpy(float), level))
            if per_layer:
                mask &= m["layer"].notna()
            if per_head:
                mask &= m["head_index"].notna()
            m = m[mask]
        return self._as_stored(m)

    def _as_stored(self, lean: pd.DataFrame) -> pd.DataFrame:
        """Lean measurement rows in their stored dtypes, joined to their trial's factor columns."""
        out = pd.DataFrame({c: lean[c].astype(self.stored[c]) for c in lean.columns}, index=lean.index)
        keys = self.trials[[*TRIAL_KEYS, *self.condition_fields]]
        at = lean["trial_id"].cat.codes.to_numpy()  # its categories are the trials' ids, in their order
        for column in keys.columns.drop("trial_id"):
            out[column] = keys[column].array.take(at)
        return out

    @cached_property
    def per_trial(self) -> pd.DataFrame:
        """One row per finished trial: factors plus the headline metrics at the final checkpoint.

        test_acc (trials table; for a test-scored trial without it, the clean accuracy measurement; a
        holdout-scored trial, tuning, has none: its score is eval_acc on the holdout, and no number from the
        test split may stand in for it), eval_acc, min_mad (smallest per-head MAD in the network over heads
        that are no CLS sink, Study L; ``cls_sink_heads`` counts the heads left out, ``all_heads_cls_sinks``
        flags a trial they all are, ``min_mad_all_heads`` keeps them; ``mad_early`` and ``entropy_early`` the
        mean MAD and entropy of every head of ``EARLY_LAYERS``), dssdc (under RPI, one permutation per
        image) and dssdc_per_batch (the paper's estimator, ``analysis.measuring.metrics``), fs_jpeg (q5) and fs_blur
        (sigma 2.5): the PE-scaling rows at alpha 1 (the unscaled model) stand in for fs_* when the severity grid lacks
        the headline level. did_not_learn (trials flag); n_images (evaluation images of the measurements) and
        the standard errors: test_acc_se (binomial) over test_images, the test split test_acc was measured
        on (``trainables.config.data_roots.DATASET_SPECS``; test_acc_se_on_subset marks one over n_images instead:
        split size unknown, or test_acc from the analysis set); fs_jpeg_se, fs_blur_se over the analysis set
        (delta method from the paired counts, ``seedstats.fragility_se``; the binomial approximation for
        measurements stored without them); NaN where no n is known. fs_jpeg_grid, fs_blur_grid: the mean FS
        over every measured severity of the grid. fs_jpeg_pe_scale_rise = FS JPEG at PE scale
        ``PE_SCALE_COLLAPSE`` - FS JPEG at 1.0, dssdc_pe_scale_drop = dSSDC at 1.0 - dSSDC at
        ``PE_SCALE_COLLAPSE``: Study P's PE scaling within one trial (``pe_scale`` rows: additive PEs);
        pe_scale_link: the Spearman correlation of dSSDC and FS JPEG over the paper's PE scales."""
        t = self.trials
        extra = [c for c in ("condition", *self.condition_fields, "img_size", "mlflow_run_id") if c in t]
        out = t[[*TRIAL_KEYS, "did_not_learn", *dict.fromkeys(extra)]].copy().set_index("trial_id")

        def per(df: pd.DataFrame, how: str = "mean") -> pd.Series:
            return df.groupby("trial_id")["value"].agg(how) if not df.empty else pd.Series(dtype=float)

        def column(name: str) -> pd.Series:
            return t.set_index("trial_id")[name].astype(float).reindex(out.index) if name in t else \
                pd.Series(np.nan, index=out.index)

        tuning = (t.set_index("trial_id")["eval_split"].reindex(out.index) == "holdout") if "eval_split" in t else \
            pd.Series(False, index=out.index)
        measured = per(self.select("clean", "acc")).reindex(out.index)
        acc = column("test_acc").where(~tuning)
        out["test_acc"] = acc.combine_first(measured).where(~tuning)
        out["eval_acc"] = column("eval_acc")
        heads, local = self.select("clean", "mad", per_layer=True, per_head=True), self.local_heads()
        out["min_mad"] = per(local, "min")
        out["cls_sink_heads"] = per(heads, "size").sub(per(local, "size"), fill_value=0).reindex(out.index)
        # Every head a sink: no minimum MAD. Flagged, so the claims count the trial instead of losing it.
        out["all_heads_cls_sinks"] = (out["cls_sink_heads"] > 0) & out["min_mad"].isna()
        out["min_mad_all_heads"] = per(heads, "min")  # the same minimum with the sinks kept: a sensitivity check
        out["mad_early"] = per(heads[heads["layer"].isin(EARLY_LAYERS)])
        entropy = self.select("clean", "entropy", per_layer=True, per_head=True)
        out["entropy_early"] = per(entropy[entropy["layer"].isin(EARLY_LAYERS)])
        out["dssdc"] = per(self.select("rpi", "dssdc"))
        out["dssdc_per_batch"] = per(self.select("rpi", "dssdc_per_batch"))
        paired, scaled_from = {}, ("pe_scale", "rope_scale")
        for name, kind, level in (("fs_jpeg", "jpeg", float(vocab.JPEG_HEADLINE)),
                                  ("fs_blur", "blur", vocab.BLUR_HEADLINE[1])):
            headline = per(self.select(kind, "fs", level=level))
            scaled = pd.concat([per(self.select(iv, name, level=1.0)) for iv in scaled_from])
            scaled = scaled[~scaled.index.duplicated()]
            out[name] = headline.reindex(out.index).combine_first(scaled.reindex(out.index))
            counts = []
            for count in PAIRED_COUNTS:  # from the same rows as the value: the headline shift, else alpha 1
                at_alpha = pd.concat([per(self.select(iv, f"{name}_{count}", level=1.0)) for iv in scaled_from])
                at_alpha = at_alpha[~at_alpha.index.duplicated()]
                counts.append(per(self.select(kind, count, level=level)).reindex(out.index)
                              .combine_first(at_alpha.reindex(out.index)))
            paired[name] = counts
        for name, kind in (("fs_jpeg_grid", "jpeg"), ("fs_blur_grid", "blur")):  # every measured severity
            out[name] = per(self.select(kind, "fs")).reindex(out.index)
        at = {(metric, alpha): per(self.select("pe_scale", metric, level=alpha)).reindex(out.index)
              for metric in ("fs_jpeg", "dssdc") for alpha in (PE_SCALE_COLLAPSE, 1.0)}
        out["fs_jpeg_pe_scale_rise"] = at["fs_jpeg", PE_SCALE_COLLAPSE] - at["fs_jpeg", 1.0]
        out["dssdc_pe_scale_drop"] = at["dssdc", 1.0] - at["dssdc", PE_SCALE_COLLAPSE]
        out["pe_scale_link"] = self._pe_scale_link().reindex(out.index)
        clean = self.select("clean", "acc")
        out["n_images"] = (clean.groupby("trial_id")["n_images"].max().reindex(out.index)
                           if "n_images" in clean and not clean.empty else np.nan)
        out["acc_clean"] = measured.where(~tuning)  # on the analysis set (the test split): none for tuning runs
        final = self.final[["trial_id", "checkpoint_epoch"]].drop_duplicates("trial_id")
        last = pd.Series(final["checkpoint_epoch"].astype(self.stored.get("checkpoint_epoch", float)).to_numpy(),
                         index=final["trial_id"].astype(str).to_numpy())
        out["checkpoint_epoch"] = last.reindex(out.index) if not final.empty else np.nan
        acc_clean = measured.combine_first(out["test_acc"])
        # test_acc is over the whole test split (not the analysis set, which may be a capped subset); where
        # it stands in from the clean measurement, or the split's size is unknown, the analysis set's n.
        split = out["dataset"].map(lambda name: DATASET_SPECS[name].test_images if name in DATASET_SPECS else None) \
            .where(acc.notna()).astype(float)
        out["test_images"] = split
        out["test_acc_se_on_subset"] = split.isna() & out["n_images"].notna() & out["test_acc"].notna()
        out["test_acc_se"] = binomial_se(out["test_acc"], split.fillna(out["n_images"]))
        for name, counts in paired.items():
            from_counts = pd.Series(fragility_se(*counts, out["n_images"]), index=out.index)
            approx = pd.Series(fragility_se_without_counts(out[name], acc_clean, out["n_images"]), index=out.index)
            out[f"{name}_se"] = from_counts.where(counts[0].notna(), approx)
        return out.reset_index()

    def _pe_scale_link(self) -> pd.Series:
        """Per trial, the Spearman correlation of dSSDC and FS JPEG over the PE scales of the paper's
        table (alpha 0.1-1.0; alpha 0 is a sanity point): Study P's link between the two, read across
        every level rather than at two endpoints. NaN with fewer than three levels or a constant side."""
        rows = [self.select("pe_scale", m) for m in ("dssdc", "fs_jpeg")]
        if any(r.empty for r in rows):
            return pd.Series(dtype=float)
        both = pd.concat(rows)
        both = both[both["level"] >= PE_SCALE_LOWEST - 1e-9]
        wide = both.pivot_table(index=["trial_id", "level"], columns="metric", values="value").dropna()
        if not {"dssdc", "fs_jpeg"} <= set(wide.columns):  # one side all NaN (e.g. a tiny evaluation set)
            return pd.Series(dtype=float)
        out = {}
        for trial_id, g in wide.groupby(level="trial_id"):
            ok = len(g) >= 3 and g["dssdc"].nunique() > 1 and g["fs_jpeg"].nunique() > 1
            out[trial_id] = float(stats.spearmanr(g["dssdc"], g["fs_jpeg"]).statistic) if ok else np.nan
        return pd.Series(out, dtype=float)

    def local_heads(self, *, final: bool = True) -> pd.DataFrame:
        """(clean, mad) rows per layer and head of the heads that are no CLS sink (``records.vocab.CLS_SINK_MASS``);
        every head where the measurements hold no ``cls_mass``."""
        mad = self.select("clean", "mad", per_layer=True, per_head=True, final=final)
        cls = self.select("clean", "cls_mass", per_layer=True, per_head=True, final=final)
        if mad.empty or cls.empty:
            return mad
        keys = ["trial_id", "checkpoint_epoch", "layer", "head_index"]
        mass = mad[keys].merge(cls[[*keys, "value"]], on=keys, how="left")["value"].to_numpy()
        return mad[~(mass >= vocab.CLS_SINK_MASS)]

    def pin(self, df: pd.DataFrame, keep: set[str]) -> tuple[pd.DataFrame, str]:
        """Hold the factors a figure or claim does not show at one value, so nothing is pooled silently:
        for pe, rpt, protocol and every ``condition_fields`` column outside ``keep`` that takes several
        values in ``df``, keep only the ``REFERENCE`` value (ape, fixed order, baseline), or the most common
        one when there is none or it is absent (ties: the smallest). Returns the slice and a description
        such as ``"pe = ape, protocol = baseline, lr = 0.001"``."""
        said = []
        for factor in ("pe", "rpt", "protocol", *self.condition_fields):
            if factor in keep or factor not in df or df[factor].nunique() < 2:
                continue
            values = set(df[factor].unique())
            ref = REFERENCE.get(factor)
            value = ref if ref in values else min(df[factor].mode(), key=str)
            df = df[df[factor] == value]
            shown = {"rpt": lambda v: "RPT" if v else "fixed"}.get(factor, str)(value)
            said.append(f"{'token order' if factor == 'rpt' else factor} = {shown}")
        return df, ", ".join(said)

    def matches_paper_p(self, dataset: str) -> bool:
        """Study P's numbers compare only at its setting: ImageNet-100 or 224 px images."""
        if dataset == "imagenet100":
            return True
        t = self.trials[self.trials["dataset"] == dataset]
        return "img_size" in t and not t.empty and bool((t["img_size"] == 224).all())


def _categorical(batches: Iterable[pa.RecordBatch], columns: list[str], rows: int = 1 << 17) -> pd.DataFrame:
    """The measurements as pandas, every column but ``value`` categorical (a few distinct values each: 17
    bytes a row where pandas' stored form takes about 220), built about ``rows`` rows at a time."""
    parts: dict[str, list] = {c: [] for c in columns}

    def convert(group: list[pa.RecordBatch]) -> None:
        table = pa.Table.from_batches(group)
        encoded = [a if c == "value" or pa.types.is_dictionary(a.type) else pc.dictionary_encode(a)
                   for c, a in zip(table.column_names, table.columns)]
        frame = pa.table(encoded, names=table.column_names).to_pandas()
        for c in columns:
            parts[c].append(frame[c])

    group, held = [], 0
    for batch in batches:
        group.append(batch)
        held += batch.num_rows
        if held >= rows:
            convert(group)
            group, held = [], 0
    if group:
        convert(group)
    if not parts["value"]:
        return pd.DataFrame()
    # Each column's parts let go as it is joined: the whole stored once, not twice.
    return pd.DataFrame({c: np.concatenate(parts.pop(c)) if c == "value" else union_categoricals(parts.pop(c))
                         for c in columns}, copy=False)


def _lean(m: pd.DataFrame, trial_ids: pd.Index) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(the measurements with every column but ``value`` categorical, ``trial_id``'s categories ``trial_ids``
    (rows of other trials left out), each column's stored dtype: level, layer and head_index float, null
    (NaN) where not per level / layer / head; an integer column with nulls float, as pandas reads it)."""
    lean, stored = {}, {}
    for column in m.columns:
        s = m[column]
        categorical = isinstance(s.dtype, pd.CategoricalDtype)
        if column in ("level", "layer", "head_index"):
            stored[column] = np.dtype(float)
        elif categorical:
            kind = s.cat.categories.dtype
            stored[column] = np.dtype(float) if kind.kind in "iu" and s.hasnans else kind
        else:
            stored[column] = s.dtype
        if column == "trial_id":
            lean[column] = pd.Categorical(s, categories=trial_ids)
        else:
            lean[column] = s if column == "value" or categorical else s.astype("category")
        if column == "checkpoint_epoch":  # sorted: its codes order the epochs (``final``)
            lean[column] = lean[column].cat.reorder_categories(lean[column].cat.categories.sort_values())
    frame = pd.DataFrame(lean, index=m.index, copy=False)
    if "trial_id" in frame and not (inside := frame["trial_id"].notna()).all():
        frame = frame[inside]
    return frame.reset_index(drop=True), stored


def _category_mask(s: pd.Series, test) -> np.ndarray:
    """``test`` on a categorical column's values, computed once per category."""
    return np.isin(s.cat.codes.to_numpy(), np.flatnonzero(test(s.cat.categories)))


def write_summary_table(results: str, study: str) -> int:
    """Write the wide ``summary`` table (one row per counted finished trial: its flat config, final
    accuracies and headline metrics at its last measured checkpoint) through ``records.tables``;
    returns the number of rows. Trials no longer counted (a rerun of a seed) lose their row."""
    data = StudyData.load(results, study)
    if data.trials.empty:
        return 0
    raw = data.raw_trials.drop_duplicates("trial_id", keep="last").set_index("trial_id")
    fixed = set(TRIAL_FIELDS.names) | set(SUMMARY_FIELDS.names)
    config_columns = [c for c in raw.columns if c not in fixed]
    pt = data.per_trial.set_index("trial_id")
    for trial_id, p in pt.iterrows():
        stored = raw.loc[trial_id]
        config = {c: _plain(stored[c]) for c in config_columns}
        headline = {"trial_id": trial_id, "study": study, "eval_acc": _plain(stored.get("eval_acc")),
                    "mlflow_run_id": _plain(stored.get("mlflow_run_id")),
                    **{f.name: _plain(p[f.name]) for f in SUMMARY_FIELDS if f.name in p.index}}
        for name in ("checkpoint_epoch", "n_images", "cls_sink_heads"):
            if headline.get(name) is not None:
                headline[name] = int(headline[name])
        headline["did_not_learn"] = bool(headline.get("did_not_learn"))
        tables.write_summary(results, study, config, headline)
    tables.retain(results, study, "summary", set(pt.index))
    return len(pt)


def _plain(v: Any) -> Any:
    """A Python scalar for the Parquet writer (numpy scalars as int / float / bool; NaN and NA as None)."""
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return None
    return v.item() if isinstance(v, np.generic) else v
