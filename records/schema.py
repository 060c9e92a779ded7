"""The columns of a study's Parquet tables. Their files (one per writer unit, settled ones compacted) are
``records.layout``'s, written and read, each row once, by ``records.tables``. Read a whole table as a directory::

    pyarrow.parquet.read_table("results/demo/trials")
    pandas.read_parquet("results/demo/epochs")
    duckdb.sql("SELECT * FROM read_parquet('results/demo/measurements/*.parquet', union_by_name=true)")

``trials`` and ``summary`` carry every flat run-config field as a column (see
``trainables.config.run_config.RunConfig.to_flat``), so their schema is the fixed columns
below plus the config's; ``epochs`` and ``measurements`` are fully fixed.

``measurements`` is long format: one row per trial x checkpoint epoch x intervention x level x
layer x head x metric (``head_index``, not ``head``: that name is ``DataFrame.head``); its vocabulary
(each intervention's level and metrics, ``PAIRED_COUNTS``) is docs/studies.md, "Measurement
vocabulary", checked against what ``analysis/measuring/evaluate.py`` emits. Every row carries ``n_images``, the
evaluation images behind it (the whole test split unless the analysis job was given a cap), so the
clean ``acc`` row equals ``trials.test_acc`` uncapped. ``summary`` is wide: one row per finished
trial, written after the analysis stage (``analysis.statistics.study_data.write_summary_table``): the trial's
config and final accuracies beside its headline measurements at its last measured checkpoint.
"""

from __future__ import annotations

import pyarrow as pa

# Columns of `trials` beside the flat run config.
TRIAL_FIELDS = pa.schema([
    ("trial_id", pa.string()),
    ("study", pa.string()),
    ("status", pa.string()),  # finished | failed | running
    ("epochs_completed", pa.int64()),
    ("train_loss", pa.float64()),
    ("train_acc", pa.float64()),
    ("eval_loss", pa.float64()),
    ("eval_acc", pa.float64()),
    ("test_acc", pa.float64()),  # top-1 on the full official test split
    ("did_not_learn", pa.bool_()),  # final eval_acc within 2 points of chance (records.vocab.did_not_learn)
    ("checkpoint_path", pa.string()),
    ("snapshot_dir", pa.string()),
    ("wall_time_s", pa.float64()),
    ("code_version", pa.string()),  # git commit (+ "-dirty") of the code that trained it
    ("pack", pa.string()),  # id of the pack it trained in (sweeps/launch/packs.py); null when trained alone
    ("error", pa.string()),  # why it failed, e.g. "training loss is nan at epoch 7: diverged"; else null
    ("mlflow_run_id", pa.string()),  # the trial's MLflow run: joins Parquet to MLflow without a search
    ("restarts", pa.int64()),  # Ray Train's restarts from its last checkpoint (a lost node, a crash), all launches
    ("node", pa.string()),  # the Ray node that trained it last: "<ip> <node id>" (a restart may move it)
    ("started_at", pa.timestamp("us", tz="UTC")),  # when its (latest) launch started it
    ("ended_at", pa.timestamp("us", tz="UTC")),  # when it finished or failed; null while running
])

EPOCHS = pa.schema([
    ("trial_id", pa.string()),
    ("study", pa.string()),
    ("epoch", pa.int64()),  # 1-based: metrics after that many epochs
    ("train_loss", pa.float64()),
    ("train_acc", pa.float64()),
    ("eval_loss", pa.float64()),
    ("eval_acc", pa.float64()),
    ("eval_images", pa.int64()),  # images eval_loss/eval_acc were scored on (trainables.data.inputs.EpochEval)
    ("lr", pa.float64()),
    ("images_per_s", pa.float64()),
    ("wall_time_s", pa.float64()),
])

MEASUREMENTS = pa.schema([
    ("trial_id", pa.string()),
    ("study", pa.string()),
    ("checkpoint_epoch", pa.int64()),  # 0 = untrained snapshot
    ("intervention", pa.string()),
    ("level", pa.float64()),  # null when the intervention has no level
    ("layer", pa.int64()),  # null: whole model
    ("head_index", pa.int64()),  # null: not per head
    ("metric", pa.string()),
    ("value", pa.float64()),
    ("n_images", pa.int64()),  # evaluation images behind the value
])

# Columns of `summary` beside the flat run config (one row per finished trial).
SUMMARY_FIELDS = pa.schema([
    ("trial_id", pa.string()),
    ("study", pa.string()),
    ("condition", pa.string()),  # every varying config field but the seed, e.g. "ape, baseline, lr=0.001"
    ("test_acc", pa.float64()),  # top-1 on the full official test split (trials.test_acc)
    ("eval_acc", pa.float64()),  # final-epoch accuracy on the evaluation split of training
    ("did_not_learn", pa.bool_()),
    ("checkpoint_epoch", pa.int64()),  # the last measured checkpoint, source of the columns below
    ("acc_clean", pa.float64()),  # clean accuracy on the analysis set of n_images images
    ("n_images", pa.int64()),  # images of the analysis set (== the test split unless capped)
    ("min_mad", pa.float64()),  # smallest per-head MAD over heads that are no CLS sink (Study L's minimum MAD)
    ("cls_sink_heads", pa.int64()),  # heads left out of min_mad: CLS mass >= 0.5
    ("mad_early", pa.float64()),  # mean MAD of every head of layers 0-1: comparable across head counts
    ("dssdc", pa.float64()),  # dSSDC under RPI
    ("fs_jpeg", pa.float64()),  # FS at JPEG q5 (PE-scaling alpha 1 where the grid lacks it)
    ("fs_blur", pa.float64()),  # FS at blur sigma 2.5, kernel 5
    ("mlflow_run_id", pa.string()),
])

PAIRED_COUNTS = ("right_both", "right_clean_only", "right_shift_only")  # per shift: FS's paired cells
