"""The demo study on a real local Ray: Tune + Train, checkpoints, Parquet, MLflow, analysis, report."""

import json

import pyarrow.parquet as pq
import pytest
from conftest import FAST_DEMO, FAST_EVAL_SIZE
from mlflow_runs import search_trial_runs

from records import stores, tables
from trainables.loop import checkpoints

pytestmark = pytest.mark.ray


def test_every_trial_finished_with_parquet_rows(demo_results):
    trials = pq.read_table(demo_results / "demo" / "trials").to_pandas()
    assert len(trials) == 4 and set(trials["status"]) == {"finished"}
    assert set(trials["pe"]) == {"none", "ape"} and set(trials["protocol"]) == {"baseline", "cutmix"}
    assert trials["test_acc"].between(0, 1).all() and (trials["epochs_completed"] == 2).all()
    # every config field is a column
    assert {"lr", "depth", "dim", "rpt", "seed", "max_train_images", "code_version"} <= set(trials.columns)
    epochs = pq.read_table(demo_results / "demo" / "epochs").to_pandas()
    assert len(epochs) == 4 * 2 and not epochs.duplicated(["trial_id", "epoch"]).any()
    assert (epochs["images_per_s"] > 0).all()


def test_checkpoints_and_snapshots_are_on_storage(demo_results):
    from pathlib import Path

    trials = tables.read_table(str(demo_results), "demo", "trials").to_pylist()
    for t in trials:
        assert Path(checkpoints.checkpoint_file(t["checkpoint_path"])).exists()
        snaps = sorted(p.name for p in Path(t["snapshot_dir"]).iterdir()
                       if checkpoints.snapshot_epoch(p.name) is not None)
        assert snaps == ["epoch_0000.pt", "epoch_0001.pt", "epoch_0002.pt"]


def test_each_trial_is_one_finished_mlflow_run(demo_results):
    uri = stores.default_tracking_uri(str(demo_results))
    runs = search_trial_runs(uri, "demo")
    trials = tables.read_table(str(demo_results), "demo", "trials").to_pandas()
    assert sorted(runs["trial_id"]) == sorted(trials["trial_id"])
    assert set(runs["status"]) == {"FINISHED"}
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(runs["run_id"].iloc[0])
    assert run.data.params["pe"] in ("none", "ape") and "lr" in run.data.params
    assert [m.step for m in client.get_metric_history(run.info.run_id, "epochs/eval_acc")] == [1, 2]
    assert "Headline/mad_min" in run.data.metrics and "Headline/dssdc_rpi" in run.data.metrics  # the analysis'
    assert run.data.tags["study"] == "demo"
    # Per-layer curves: the layer is the step, the checkpoint epoch is in the key, one per snapshot.
    for epoch in (0, 1, 2):
        history = client.get_metric_history(run.info.run_id, f"layers/ssdc_rpi_epoch_{epoch:04d}")
        assert [m.step for m in history] == [0, 1]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "layers/mad_min_epoch_0002")] == [0, 1]
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert figures == {"figures/layers_epoch_0002.png", "figures/layers_epoch_0002.svg"}  # the final checkpoint's only
    # The report and claims.csv sit on the study's own run, in its own experiment (out of the trial
    # runs' charts), linked from the study's.
    reports = client.get_experiment_by_name("demo-reports").experiment_id
    (report,) = client.search_runs([reports], "attributes.run_name = 'demo-report'")
    assert (client.get_experiment(run.info.experiment_id).tags["vitsweep.report_run"]
            == f"{reports}/{report.info.run_id}")
    # Each run's input is its data set, with its split sizes; its device is a tag.
    (given,) = run.inputs.dataset_inputs
    assert given.dataset.name == "shapes" and json.loads(given.dataset.profile)["train_images"] == 1024
    assert run.data.tags["vitsweep.device"] == "cpu"
    assert {"index.html", "claims.csv"} <= {a.path for a in client.list_artifacts(report.info.run_id)}


def test_trials_ran_concurrently(demo_results):
    """Two 1-CPU packs fit a 2-CPU Ray at once: runs of different packs must overlap in time (a driver
    holding even a sliver of a CPU would serialise them)."""
    import itertools

    runs = search_trial_runs(stores.default_tracking_uri(str(demo_results)), "demo")
    pack = pq.read_table(demo_results / "demo" / "trials").to_pandas().set_index("trial_id")["pack"]
    spans = [(start, end, pack[t]) for start, end, t in zip(runs["start_time"], runs["end_time"], runs["trial_id"])]
    assert pack.nunique() == 2
    assert any(p != q and s < f and t < e for (s, e, p), (t, f, q) in itertools.combinations(spans, 2)), spans


def test_analysis_rows_cover_the_vocabulary(demo_results):
    m = pq.read_table(demo_results / "demo" / "measurements").to_pandas()
    assert m["trial_id"].nunique() == 4 and set(m["checkpoint_epoch"]) == {0, 1, 2}  # every snapshot
    assert {"clean", "jpeg", "blur", "rpi", "pe_scale"} == set(m["intervention"])
    assert not m[m["trial_id"].str.contains("-none-")]["intervention"].eq("pe_scale").any()
    assert (m["n_images"] == FAST_EVAL_SIZE).all()  # every row names its images: the study's cap (conftest)
    mad = m[(m.metric == "mad") & (m.intervention == "clean")]
    assert mad["value"].between(0, 1).all() and mad["head_index"].notna().all()
    whole = m[m.metric.isin(["acc", "fs", "dssdc"])]
    assert whole["layer"].isna().all() and whole["head_index"].isna().all()  # null, not -1


def test_summary_table_has_one_row_per_trial(demo_results):
    summary = pq.read_table(demo_results / "demo" / "summary").to_pandas()
    trials = pq.read_table(demo_results / "demo" / "trials").to_pandas()
    assert sorted(summary["trial_id"]) == sorted(trials["trial_id"])
    assert (summary["checkpoint_epoch"] == 2).all() and (summary["n_images"] == FAST_EVAL_SIZE).all()
    assert summary["min_mad"].notna().all() and {"pe", "protocol", "lr", "test_acc", "fs_jpeg"} <= set(summary)


def test_report_was_built(demo_results):
    html = (demo_results / "demo" / "report" / "index.html").read_text()
    assert "<img" in html and "claims" in html.lower() and "could not be drawn" not in html
    assert "<h3>PE scaling" in html and "did not learn A" in html and "survivors vs all" in html
    assert "<h3>Emergence over training" in html and "<h3>Trials</h3>" in html
    assert "4 finished trial(s) in 4 condition(s), 1 seed(s) each" in html


def test_rerun_skips_finished_trials_and_measured_checkpoints(demo_results, ray_local):
    from analysis.measuring.job import analyze
    from sweeps import run as launcher
    from sweeps.launch import options

    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    before = {p.name: p.stat().st_mtime_ns for p in (demo_results / "demo" / "trials").iterdir()}
    args = parser.parse_args(["demo", "--results", str(demo_results), *FAST_DEMO])
    assert launcher.run(args) == 0
    after = {p.name: p.stat().st_mtime_ns for p in (demo_results / "demo" / "trials").iterdir()}
    assert before == after
    uri = stores.default_tracking_uri(str(demo_results))
    assert analyze(results=str(demo_results), study="demo", mlflow_uri=uri) == []


def test_readme_query_examples_run_as_written_against_the_demo(demo_results, tmp_path):
    """Every ```python block of the docs/results.md's Parquet section runs from a folder whose
    ./results is the demo's output."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "docs" / "results.md").read_text()
    section = readme.split("## Querying the Parquet tables", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3  # pandas, pyarrow, DuckDB
    (tmp_path / "results").symlink_to(demo_results)
    for code in blocks:
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, f"{code}\n{out.stderr[-2000:]}"
        assert out.stdout.strip(), code


def test_readme_mlflow_query_gives_the_runs_table_with_factors_and_headline_metrics(demo_results, tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "docs" / "results.md").read_text()
    section = readme.split("## Browsing MLflow", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (tmp_path / "results").symlink_to(demo_results)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    header, *rows = [line.split() for line in out.stdout.strip().splitlines()]
    assert header[:3] == ["tags.mlflow.runName", "params.dataset", "params.pe"] and "metrics.Headline/mad_min" in header
    assert len(rows) == 4 and all(r[0].startswith("shapes-") and r[1] == "shapes" for r in rows)  # trials only


def test_status_and_experiment_description_after_the_sweep(demo_results):
    from sweeps.launch import status

    got = status.study_status(str(demo_results), "demo")
    assert got["planned"] == 4 and got["counts"]["finished"] == 4 and got["counts"]["pending"] == 0
    assert got["heartbeat"]["ended"] and not got["alive"]
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=stores.default_tracking_uri(str(demo_results)))
    note = client.get_experiment_by_name("demo").tags["mlflow.note.content"]
    assert "4 trials" in note and "demo" in note


def test_console_is_one_line_per_trial_and_checkpoint_with_the_summary_last(demo_results):
    import re

    text = (demo_results / "console.txt").read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    trials = [line for line in lines if re.match(r"^\[\d/4\] shapes-\S+: ", line)]
    assert len(trials) == 4 and all(re.search(r": test \d\.\d{3}", line) for line in trials), trials
    assert "ETA" in trials[0] and "ETA" not in trials[-1]
    checkpoints = [line for line in lines if re.match(r"^\[\d+/\d+\] checkpoints: shapes-", line)]
    assert checkpoints and "images/s" in checkpoints[0]
    assert lines[-1].strip().startswith("MLflow:") and any(line.strip().startswith("status:") for line in lines[-6:])
    assert "?workflowType=machine_learning" in lines[-1]
    for chatter in ("Trial status", "Configuration for experiment", "Checkpoint successfully created",
                    "Reporting training result", "Total Progress"):
        assert chatter not in text, chatter


def test_the_console_holds_vitsweep_lines_only_with_progress_while_trials_run(demo_results):
    """No line from Ray, Tune or MLflow on stdout or stderr (file descriptors, Python streams and
    every logger); live lines while the trials train; the MLflow address at launch."""
    import re

    out = [line for line in (demo_results / "console.txt").read_text().splitlines() if line.strip()]
    err = [line for line in (demo_results / "console-err.txt").read_text().splitlines() if line.strip()]
    ours = re.compile(r"^(\[\d+/\d+\] (shapes-|checkpoints: )|\[train\] (shapes-|pack )|MLflow: |"
                      r"demo: \d+ of \d+ trials|"
                      r"vitsweep demo: results in |  \S|Ray: |\[train\] started \d+ trial)")
    assert [line for line in out if not ours.match(line)] == []
    logged = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} vitsweep(\.\w+)*: ")
    assert err and [line for line in err if not logged.match(line)] == []
    for line in out + err:  # nothing of theirs, whatever its shape
        assert not re.search(r"\(raylet\)|core_worker|\bpid=|\bmlflow\.(?!db\b)|worker\.py|fontTools|\x1b\[",
                             line), line
    assert out[0].startswith("MLflow: mlflow ui --backend-store-uri ") and "?workflowType=machine_learning" in out[0]
    assert out[1] == "Ray: starting a local Ray (loopback only)" and out[2].startswith("Ray: up, 1 node(s), ")
    assert sum(line.startswith("demo: 4 of 4 trials ended") for line in out) == 1  # one training summary
    assert any(line.startswith("[train] started ") for line in out)
    live = [i for i, line in enumerate(out)
            if re.match(r"^\[train\] pack \S+ \(2 trials\): epoch [12]/2, 2 x [\d,]+ images/s, ETA ", line)]
    last_trial = max(i for i, line in enumerate(out) if line.startswith("[4/4] "))
    assert live and live[0] < last_trial, out
    assert all("all 4 trials: ETA" in out[i] for i in live)


def test_trials_join_mlflow_by_run_id_and_carry_their_times(demo_results):
    trials = tables.read_table(str(demo_results), "demo", "trials").to_pandas()
    runs = search_trial_runs(stores.default_tracking_uri(str(demo_results)), "demo")
    joined = trials.merge(runs[["run_id", "trial_id"]], left_on="mlflow_run_id", right_on="run_id")
    assert len(joined) == 4 and (joined["trial_id_x"] == joined["trial_id_y"]).all()
    assert (trials["started_at"] < trials["ended_at"]).all()
