"""MLflow tracking: the one module in vitsweep that talks to MLflow.

Every function takes the tracking URI explicitly and builds its own ``MlflowClient(tracking_uri=uri)``;
nothing here calls ``mlflow.set_tracking_uri`` or uses the fluent ``mlflow.start_run`` state, because several
trials may share one process (Ray actors, tests) and each must write to the store it was given. Ray's
``setup_mlflow`` integration is not used: it fails inside a trial unless the experiment already exists, and it
keeps global state.

Layout in MLflow: one experiment per study, one run per trial. The run's name is the trial id and its tag
``vitsweep.trial_id`` holds the same id, so a Ray retry or ``--resume`` finds and continues the run instead of
making a second one: by the run id its trials row keeps (``mlflow_run_id``), by the tag where the row has none.
Params are the flat run config (every ``RunConfig.to_flat()`` field); tags are study /
dataset / pe / protocol / rpt / seed / code_version (a tag with no value is not set); metrics are laid out for
the UI's charts (``headline_key``, ``epoch_key``, ``layer_key``): the headline numbers first, under
``Headline/`` (``Headline/test_acc``; the analysis scalars at step = checkpoint epoch), per-epoch training
curves under ``epochs/`` (step = epoch), per-layer curves under ``layers/`` (step = layer, the checkpoint
epoch in the name: ``layers/ssdc_rpi_epoch_0100``, see ``analysis.measuring.trial_record``), and counts and times
last, under ``progress/`` (``progress/wall_time_s``); the run's input is its data set
(``log_dataset_input``: name, split sizes, digest) and tag ``vitsweep.device`` the device it trained on;
artifacts are ``config.json``, ``provenance/environment.json``, ``provenance/requirements.txt`` (+
``provenance/git_diff.patch`` when the tree is dirty) and figures (``figures/layers_epoch_0100.{png,svg}``).
The study's report sits on a run of its own, ``<study>-report``, in the experiment ``<study>-reports``, linked
from the study's (``study_run``). Addresses of the UI open its training layout (``experiment_url``,
``run_url``). A trial's runs are opened and closed by ``trainables.trial.lifecycle``.

Stores, and the checks that run before any trial, are in ``records.stores``; the client and its retries in
``records.client``; provenance in ``records.provenance``; the analysis measurements (metric keys, per-layer
curves) in ``records.measurements``.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from records.client import to_str, with_retries
from records.provenance import git_diff, provenance, requirements_txt
from records.stores import redact, scheme, sqlite_path

# Imports inside functions: MLflow loads on the first MLflow call (see records/client.py).

_log = logging.getLogger(__name__)

TRIAL_ID_TAG = "vitsweep.trial_id"
ATTEMPT_TAG = "vitsweep.attempt"  # 1 for a fresh run, +1 every time a retry/resume continues it
RESTARTS_TAG = "vitsweep.restarts"  # times Ray Train restarted the trial from its last checkpoint (trials.restarts)
LAST_RESTART_TAG = "vitsweep.last_restart"  # why it last restarted: the lost worker's node and error
NODE_TAG = "vitsweep.node"  # the Ray node that trained it last (trials.node)
ERROR_TAG = "vitsweep.error"  # why the run ended FAILED/KILLED; cleared when it is continued
ERROR_TEXT_LIMIT = 5000  # characters of that why kept, in the tag and in the trials row (MLflow takes 8,000)
STOPPED_EARLY_TAG = "vitsweep.stopped_early"  # a scheduler (ASHA) stopped the trial; cleared when continued
TRIAL_TAG_FIELDS = ("study", "dataset", "pe", "protocol", "rpt", "seed")
END_STATUSES = ("FINISHED", "FAILED", "KILLED")
# MLflow's chart layout (3.17, RunsChartsUtils.getBaseChartAndSectionConfigs): a metric's section is its
# key up to the last '/'; named sections come sorted by code point (capitals before lower case), then
# the unprefixed keys ("Model metrics"); a section's charts sorted by key. So the headline numbers get
# the capitalised prefix, which sorts first, then the training curves, then one section for every
# per-layer curve (30 charts for the demo, more per snapshot), then the bookkeeping.
HEADLINE_SECTION = "Headline"  # test_acc and the analysis scalars: what a reader opens a run for
EPOCH_SECTION = "epochs"  # per-epoch training curves, as the Parquet table of the same name
LAYER_SECTION = "layers"  # per-layer curves of each measured checkpoint, one section for all
PROGRESS_SECTION = "progress"  # counts and times of an epoch or a measurement, no result
PROGRESS = frozenset({"eval_images", "images_per_s", "wall_time_s", "n_images"})
# MLflow's per-request batch limits (mlflow.utils.validation); larger inputs are chunked.
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_TAGS_PER_BATCH = 100


def _default_artifact_location(uri: str, name: str) -> str | None:
    """Artifacts of a SQLite store live next to the database; servers choose their own."""
    if scheme(uri) != "sqlite":
        return None
    folder = sqlite_path(uri).parent / "mlartifacts" / urllib.parse.quote(name, safe="")
    return folder.as_uri()


def ensure_experiment(uri: str, name: str) -> str:
    """The id of experiment ``name``, created if missing (idempotent, race-safe).

    Two processes creating it at once both get the same id: the loser of the race
    sees RESOURCE_ALREADY_EXISTS and reads the winner's. A new one keeps its artifacts in
    ``<db folder>/mlartifacts/<name>`` for SQLite; a server chooses their place itself.
    Raises ValueError if the experiment exists but was deleted (restore or purge it).
    """
    from mlflow.exceptions import MlflowException

    if not name:
        raise ValueError("empty MLflow experiment name")
    location = _default_artifact_location(uri, name)

    def get_or_create(client) -> str:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return client.create_experiment(name, artifact_location=location)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise ValueError(f"MLflow experiment {name!r} (id {experiment.experiment_id}) on {redact(uri)!r} is "
                             "deleted; restore it (`mlflow experiments restore --experiment-id "
                             f"{experiment.experiment_id}`) or purge it (`mlflow gc --experiment-ids "
                             f"{experiment.experiment_id}`) before logging to that name.")
        return experiment.experiment_id

    return with_retries(f"ensure_experiment({name!r})", uri, get_or_create)


def describe_experiment(uri: str, experiment_id: str, text: str) -> None:
    """The experiment's description in the MLflow UI (its ``mlflow.note.content`` tag, Markdown),
    and its kind: MLflow 3 opens an experiment without one on its GenAI overview; a
    ``custom_model_development`` one opens on the runs, the training view. A link to the study's
    report (``study_run``) is kept. The experiments list shows the tag as it is, cut to its first
    line: ``text``'s first line must be plain text (ValueError naming it otherwise)."""
    _check_plain(text)

    def describe(c):
        link = c.get_experiment(experiment_id).tags.get(REPORT_RUN_TAG)
        c.set_experiment_tag(experiment_id, "mlflow.note.content", _with_report(text, uri, link))
        c.set_experiment_tag(experiment_id, "mlflow.experimentKind", "custom_model_development")

    with_retries("describe experiment", uri, describe)


MARKDOWN_MARKS = ("*", "`", "[", "#", "<")  # what the experiments list would show raw


def _check_plain(description: str) -> None:
    first = description.split("\n", 1)[0]
    if not first.strip() or any(mark in first for mark in MARKDOWN_MARKS):
        raise ValueError(f"an experiment description's first line is what MLflow's experiments list shows, "
                         f"unrendered: it must be plain text, without {' '.join(MARKDOWN_MARKS)}: {first!r}")


def _check_trial_id(trial_id: str) -> None:
    # The id goes into a search filter string; quotes and backslashes would need escaping
    # that MLflow's filter grammar does not document.
    if not trial_id or any(c in trial_id for c in "'\"`\\\n"):
        raise ValueError(f"trial id {trial_id!r} must be non-empty without quotes or backslashes")


def _search_all(client, experiment_id: str, filter_string: str, order_by=None) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000,
                                  order_by=order_by, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _trial_run(client, experiment_id: str, trial_id: str, run_id: str | None):
    """The trial's run: ``run_id`` (its trials row's ``mlflow_run_id``) with one ``get_run``, where that
    is the trial's active run in this experiment; else a tag search (a trial without a row yet, a
    row of another store): a search costs 12-46 ms CPU at 1,000-10,000 runs, which per trial start and
    per checkpoint measured made hours at 10,000 trials."""
    from mlflow.exceptions import MlflowException

    if run_id:
        try:
            run = client.get_run(run_id)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        else:
            if (run.info.experiment_id == experiment_id and run.info.lifecycle_stage == "active"
                    and run.data.tags.get(TRIAL_ID_TAG) == trial_id):
                return run
    runs = _search_all(client, experiment_id, f"tags.`{TRIAL_ID_TAG}` = '{trial_id}'",
                       order_by=["attributes.start_time ASC"])
    if len(runs) > 1:
        _log.warning("trial %s has %d MLflow runs; using the oldest, %s", trial_id, len(runs), runs[0].info.run_id)
    return runs[0] if runs else None


def find_trial_run(uri: str, experiment_id: str, trial_id: str, run_id: str | None = None) -> str | None:
    """The run id of ``trial_id`` in the experiment, or None: ``run_id`` (the trials row's) where it is
    the trial's, else found by its tag (the oldest, should a race have made two). Deleted runs are not
    found."""
    _check_trial_id(trial_id)
    run = with_retries(f"find_trial_run({trial_id!r})", uri,
                        lambda c: _trial_run(c, experiment_id, trial_id, run_id))
    return run.info.run_id if run else None


def start_trial_run(uri: str, experiment_id: str, trial_id: str, *, params: Mapping[str, Any],
                    tags: Mapping[str, Any] | None = None, run_id: str | None = None) -> str:
    """Create the run of ``trial_id`` (run name = trial id), or continue it if it exists: ``run_id``,
    the trials row's ``mlflow_run_id``, finds it without a search (``find_trial_run``).

    Continuing sets the status back to RUNNING, bumps ``vitsweep.attempt`` and clears
    ``vitsweep.error`` and ``vitsweep.stopped_early``.
    ``params`` (the flat run config) are logged as MLflow params; those already on
    the run with the same value are skipped. MLflow params are immutable, so a
    param whose value differs from the run's (a config changed between attempts)
    keeps its first value and the new one is recorded as tag
    ``vitsweep.changed_param.<key>`` with a warning, instead of failing the trial.
    ``tags`` (see ``trial_tags``) are set, overwriting earlier values.
    Returns the run id.
    """
    from mlflow.entities import Param, RunTag

    _check_trial_id(trial_id)
    wanted = {str(k): to_str(v) for k, v in params.items()}

    def find_or_create(client):
        # Looked up again on every attempt, so a create that committed but reported an
        # error (an HTTP timeout) is found instead of duplicated.
        run = _trial_run(client, experiment_id, trial_id, run_id)
        if run is not None:
            return run, False
        return client.create_run(experiment_id, run_name=trial_id,
                                 tags={TRIAL_ID_TAG: trial_id, ATTEMPT_TAG: "1"}), True

    run, created = with_retries(f"start_trial_run({trial_id!r})", uri, find_or_create)
    run_id = run.info.run_id
    new_tags = {str(k): to_str(v) for k, v in (tags or {}).items()}
    if not created:
        attempt = int(run.data.tags.get(ATTEMPT_TAG, "1")) + 1
        new_tags[ATTEMPT_TAG] = str(attempt)
        with_retries(f"resume run {run_id}", uri, lambda c: c.update_run(run_id, status="RUNNING"))
        for stale in (ERROR_TAG, STOPPED_EARLY_TAG):  # the earlier attempt's end no longer describes the run
            if stale in run.data.tags:
                with_retries(f"clear tag {stale}", uri, lambda c, t=stale: c.delete_tag(run_id, t))
        _log.info("continuing MLflow run %s of trial %s (attempt %d)", run_id, trial_id, attempt)
    existing = run.data.params
    missing = [Param(k, v) for k, v in wanted.items() if k not in existing]
    for key in sorted(k for k in wanted if k in existing and existing[k] != wanted[k]):
        _log.warning("trial %s: param %r was %r and is now %r; MLflow params are immutable, "
                     "keeping the first and tagging the new value", trial_id, key, existing[key], wanted[key])
        new_tags[f"vitsweep.changed_param.{key}"] = wanted[key]
    log_batches(uri, run_id, "params", missing, "log params")
    log_batches(uri, run_id, "tags", [RunTag(k, v) for k, v in new_tags.items()], "set tags")
    return run_id


def log_batches(uri: str, run_id: str, kind: str, items: list, what: str) -> None:
    """``items`` (MLflow ``Metric``, ``Param`` or ``RunTag`` entities) as the run's ``kind`` ("metrics",
    "params" or "tags"), in batches of MLflow's size limits; ``what`` names the call in a TrackingError."""
    size = _MAX_METRICS_PER_BATCH if kind == "metrics" else _MAX_PARAMS_TAGS_PER_BATCH
    for i in range(0, len(items), size):
        with_retries(what, uri, lambda c, b=items[i : i + size]: c.log_batch(run_id, synchronous=True, **{kind: b}))


def log_metrics(uri: str, run_id: str, metrics: Mapping[str, Any], step: int) -> None:
    """Log ``{key: number}`` at ``step`` in batches (log_batch). None values are skipped
    so optional metrics can be passed as they are; NaN/inf are kept (MLflow stores them).
    Raises ValueError naming a key whose value is not a number."""
    from mlflow.entities import Metric

    timestamp = int(time.time() * 1000)
    points = []
    for key, value in metrics.items():
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {key!r} has non-numeric value {value!r}") from None
        # Fixed timestamp per point: a retried batch repeats exact duplicates, which MLflow drops.
        points.append(Metric(str(key), number, timestamp, int(step)))
    log_batches(uri, run_id, "metrics", points, f"log_metrics(step={step})")


def epoch_key(name: str) -> str:
    """The MLflow key of a per-epoch training metric: ``epochs/train_loss``; ``progress/wall_time_s`` for
    a count or a time (``PROGRESS``)."""
    return f"{PROGRESS_SECTION if name in PROGRESS else EPOCH_SECTION}/{name}"


def headline_key(name: str) -> str:
    """The MLflow key of a headline number (``test_acc``, an analysis scalar): ``Headline/test_acc``;
    ``progress/n_images`` for a count (``PROGRESS``)."""
    return f"{PROGRESS_SECTION if name in PROGRESS else HEADLINE_SECTION}/{name}"


def layer_key(name: str, epoch: int) -> str:
    """The MLflow key of a per-layer curve measured at checkpoint ``epoch``: ``layers/ssdc_epoch_0100``."""
    return f"{LAYER_SECTION}/{name}_epoch_{int(epoch):04d}"


def log_epoch_metrics(uri: str, run_id: str, metrics: Mapping[str, Any], epoch: int) -> None:
    """One epoch's training metrics (``{"train_loss": ..., ...}``) under their ``epoch_key``, step = epoch."""
    log_metrics(uri, run_id, {epoch_key(k): v for k, v in metrics.items()}, step=epoch)


DEVICE_TAG = "vitsweep.device"


def log_dataset_input(uri: str, run_id: str, dataset: Mapping[str, Any]) -> None:
    """The run's input, as ``mlflow.log_input`` records it: ``dataset`` holds ``name``, ``digest``,
    ``source`` (where it was read) and the split sizes (``train_images``, ``eval_images``,
    ``test_images``, ...), which go in its profile; context ``training``. Idempotent: MLflow keeps
    one input per (name, digest) and context of a run, so a retried trial logs it again harmlessly."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    sizes = {k: v for k, v in dataset.items() if k not in ("name", "digest", "source")}
    entry = Dataset(name=str(dataset["name"]), digest=str(dataset["digest"]), source_type="local",
                    source=json.dumps({"uri": str(dataset.get("source", ""))}),
                    profile=json.dumps(sizes, sort_keys=True, default=str))
    inputs = [DatasetInput(entry, tags=[InputTag("mlflow.data.context", "training")])]
    with_retries("log dataset input", uri, lambda c: c.log_inputs(run_id, datasets=inputs))


def logged_steps(uri: str, run_id: str, key: str) -> set[int]:
    """Steps at which ``key`` was already logged in the run (a retried or resumed trial
    skips them, so each step is logged once)."""
    history = with_retries(f"metric history {key}", uri, lambda c: c.get_metric_history(run_id, key))
    return {int(m.step) for m in history}


def set_tags(uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    """Set run tags (overwrites earlier values); a tag whose value is None or "" is left unset, so the
    UI shows no empty tag (e.g. ``vitsweep.error`` of a finished run)."""
    from mlflow.entities import RunTag

    log_batches(uri, run_id, "tags", [RunTag(str(k), to_str(v)) for k, v in tags.items()
                                      if v is not None and to_str(v) != ""], "set_tags")


def log_artifact_text(uri: str, run_id: str, name: str, text: str) -> None:
    """Write ``text`` to artifact path ``name`` (e.g. 'provenance/requirements.txt')."""
    with_retries(f"log artifact {name}", uri, lambda c: c.log_text(run_id, text, name))


def log_artifact_dict(uri: str, run_id: str, name: str, obj: Any) -> None:
    """Write ``obj`` as indented JSON to artifact path ``name`` (e.g. 'config.json');
    values JSON cannot hold are written with ``str``."""
    log_artifact_text(uri, run_id, name, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def log_artifact_file(uri: str, run_id: str, path: str | os.PathLike,
                      artifact_dir: str | None = None) -> None:
    """Upload a local file (a figure, a table) under ``artifact_dir`` (e.g. 'figures')."""
    if not Path(path).is_file():
        raise ValueError(f"artifact file {os.fspath(path)!r} does not exist")
    with_retries(f"log artifact {os.fspath(path)}", uri,
                  lambda c: c.log_artifact(run_id, os.fspath(path), artifact_dir))


def end_trial_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    """Mark the run ended with ``status`` in FINISHED, FAILED, KILLED."""
    if status not in END_STATUSES:
        raise ValueError(f"run end status {status!r} is not one of {', '.join(END_STATUSES)}")
    with_retries(f"end run {run_id}", uri, lambda c: c.set_terminated(run_id, status=status))


def end_orphaned_runs(uri: str, experiment_id: str, *, keep_trial_ids: Iterable[str] = (),
                      finished_trial_ids: Iterable[str] = ()) -> list[str]:
    """Close every run whose process is gone: call it when no trial of the experiment runs except
    those in ``keep_trial_ids`` (e.g. after the sweep returns, or before it starts).

    A run whose trial's record says finished (``finished_trial_ids``: the trials table, the
    record of truth) ends FINISHED, error tag cleared, whatever its status, so a row written
    ``finished`` whose run could not be closed (an MLflow outage) is not called failed later.
    Any other RUNNING run (SIGKILL, OOM, a lost node) ends FAILED "orphaned". One search.
    Returns the trial ids (or run ids) it ended FAILED."""
    keep, finished = set(keep_trial_ids), set(finished_trial_ids)
    where = "attributes.status != 'FINISHED'" if finished else "attributes.status = 'RUNNING'"
    runs = with_retries("search unfinished runs", uri, lambda c: _search_all(c, experiment_id, where))
    ended = []
    for run in runs:
        trial_id = run.data.tags.get(TRIAL_ID_TAG, run.info.run_id)
        if trial_id in keep or STUDY_RUN_TAG in run.data.tags:  # a report being written is no orphan
            continue
        if trial_id in finished:
            if ERROR_TAG in run.data.tags:
                with_retries("clear error tag", uri, lambda c, r=run.info.run_id: c.delete_tag(r, ERROR_TAG))
            end_trial_run(uri, run.info.run_id, "FINISHED")
            continue
        if run.info.status != "RUNNING":
            continue
        set_tags(uri, run.info.run_id, {ERROR_TAG: "orphaned: its process ended without ending the run"})
        end_trial_run(uri, run.info.run_id, "FAILED")
        ended.append(trial_id)
    return ended


STUDY_RUN_TAG = "vitsweep.study_run"  # marks a study's own run (the report), which is no trial
REPORTS_SUFFIX = "-reports"  # the experiment of a study's own runs: `demo` -> `demo-reports`
REPORT_RUN_TAG = "vitsweep.report_run"  # on the study's experiment: "<experiment id>/<run id>" of its report


def study_run(uri: str, experiment_id: str, name: str) -> str:
    """The run named ``name`` (e.g. ``demo-report``) of the study whose experiment is
    ``experiment_id``, created (tagged ``vitsweep.study_run``) if missing, so a second report
    overwrites the first one's artifacts instead of adding a run. It lives in the experiment
    ``<study>-reports``, not among the trial runs (where it would sit in every chart's legend with
    no data), and the study's experiment links it (tag ``vitsweep.report_run``, and its
    description). It carries no trial-id tag: ``end_orphaned_runs`` never sees it. The caller ends it
    (``end_trial_run``)."""
    _check_trial_id(name)
    study = with_retries("get experiment", uri, lambda c: c.get_experiment(experiment_id))
    reports_id = ensure_experiment(uri, study.name + REPORTS_SUFFIX)

    def find_or_create(client):
        runs = _search_all(client, reports_id, f"tags.`{STUDY_RUN_TAG}` = '{name}'",
                           order_by=["attributes.start_time ASC"])
        if runs:
            client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id
        return client.create_run(reports_id, run_name=name, tags={STUDY_RUN_TAG: name}).info.run_id

    run_id = with_retries(f"study_run({name!r})", uri, find_or_create)
    link = f"{reports_id}/{run_id}"
    with_retries("link the report", uri, lambda c: (
        c.set_experiment_tag(experiment_id, REPORT_RUN_TAG, link),
        c.set_experiment_tag(reports_id, "mlflow.experimentKind", "custom_model_development"),
        c.set_experiment_tag(reports_id, "mlflow.note.content",
                             f"The reports of study {study.name}, whose trial runs are in experiment {study.name}.\n\n"
                             f"[The report]({run_path(reports_id, run_id, 'index.html')}) (`index.html` of run "
                             f"`{run_id}`); [the trial runs]({experiment_path(experiment_id)})."),
        c.set_experiment_tag(experiment_id, "mlflow.note.content",
                             _with_report(study.tags.get("mlflow.note.content", ""), uri, link))))
    return run_id


def _with_report(note: str, uri: str, link: str | None) -> str:
    """An experiment's description with its report paragraph (the last one) set to ``link``: a link
    relative to the UI (the description is read there, on whatever host and port serves it) that
    opens the report run's ``index.html``."""
    head = note.split("\n\n**Report**:", 1)[0]
    if not link:
        return head
    reports_id, run_id = link.split("/", 1)
    return (f"{head}\n\n**Report**: [index.html]({run_path(reports_id, run_id, 'index.html')}) of run "
            f"`{run_id}` in experiment {reports_id}, with `claims.csv`, the tables and `figures/`.")


UI_LAYOUT = "workflowType=machine_learning"  # MLflow 3 opens its GenAI layout unless told (or remembered)
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui --backend-store-uri ...` serves a local store


def ui_base(uri: str) -> str:
    """The UI's address: the tracking server itself (password redacted), else a local `mlflow ui`."""
    return redact(uri).rstrip("/") if uri.startswith(("http://", "https://")) else LOCAL_UI


def ui_command(uri: str) -> str | None:
    """The command that serves a local store's UI at ``LOCAL_UI``; None for a tracking server (its own UI)."""
    if uri.startswith(("http://", "https://")):
        return None
    return shlex.join(["mlflow", "ui", "--backend-store-uri", uri, "--workers", "1"])


def experiment_path(experiment_id: str) -> str:
    """The experiment's runs table in the training layout (``?workflowType=machine_learning``), relative to
    the UI's address: what a link inside the UI (an experiment's description) holds."""
    return f"#/experiments/{experiment_id}/runs?{UI_LAYOUT}"


def run_path(experiment_id: str, run_id: str, artifact: str | None = None) -> str:
    """One run's page in the training layout, relative to the UI's address; ``artifact``: that artifact
    opened in the run's Artifacts tab (``index.html``)."""
    tab = f"/artifacts/{artifact}" if artifact else ""
    return f"#/experiments/{experiment_id}/runs/{run_id}{tab}?{UI_LAYOUT}"


def experiment_url(uri: str, experiment_id: str) -> str:
    """The experiment's runs table in the training layout, at the UI's address (``ui_base``)."""
    return f"{ui_base(uri)}/{experiment_path(experiment_id)}"


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """One run's page in the training layout (its headline numbers, then its training curves, first)."""
    return f"{ui_base(uri)}/{run_path(experiment_id, run_id)}"


def experiment_id_of(uri: str, name: str) -> str | None:
    """The id of experiment ``name``, or None when there is none (nothing is created)."""
    experiment = with_retries("get experiment", uri, lambda c: c.get_experiment_by_name(name))
    return experiment.experiment_id if experiment is not None else None


def trial_tags(config: Mapping[str, Any], *, code_version: str | None = None) -> dict[str, str]:
    """The run tags the MLflow UI filters on, taken from the flat run config:
    study, dataset, pe, protocol, rpt, seed (those present), plus code_version."""
    tags = {k: to_str(config[k]) for k in TRIAL_TAG_FIELDS if k in config}
    if code_version is not None:
        tags["code_version"] = code_version
    return tags


def log_provenance(uri: str, run_id: str, config: Mapping[str, Any] | None = None,
                   info: Mapping[str, Any] | None = None) -> dict:
    """Log ``provenance()`` as provenance/environment.json, the package list as
    provenance/requirements.txt, ``git diff HEAD`` as provenance/git_diff.patch when the
    checkout is dirty, ``config`` (the resolved flat run config) as config.json, and tags
    code_version, mlflow.source.git.commit (shown by the UI), vitsweep.host.
    ``info``: a ``provenance()`` taken once for a whole sweep (it costs seconds: it
    imports torch and lists every package); taken here when None.
    Returns the provenance dict."""
    info = dict(info) if info is not None else provenance()
    log_artifact_dict(uri, run_id, "provenance/environment.json", info)
    log_artifact_text(uri, run_id, "provenance/requirements.txt", requirements_txt(info["packages"]))
    git = info["git"]
    if git and git["dirty"]:
        diff = git_diff()
        if diff:
            log_artifact_text(uri, run_id, "provenance/git_diff.patch", diff[:5_000_000])
    if config is not None:
        log_artifact_dict(uri, run_id, "config.json", dict(config))
    tags = {"code_version": info["code_version"], "vitsweep.host": info["hostname"]}
    if git:
        tags["mlflow.source.git.commit"] = git["commit"]
    set_tags(uri, run_id, tags)
    return info

