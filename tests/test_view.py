"""What a researcher sees (#16): no silent pooling, figures fit for a paper, the summary table, and one
checkpoint's per-layer curves and figure on its MLflow run. Synthetic tables from tests/test_report.py,
written with the project's own Parquet writer; a real SQLite MLflow store."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from mlflow_runs import search_trial_runs
from PIL import Image
from test_report import _measure, write_study

from analysis.measuring import trial_record
from analysis.reporting import condition_tables, figures
from analysis.reporting.report import build_report
from analysis.statistics import claims, study_data
from analysis.statistics.study_data import StudyData
from records import stores, tables, tracking, vocab


def _add_trial(results, study, trial_id, seed, *, lr=1e-3, test_acc=0.9, epochs=4):
    config = {"dataset": "cifar100", "pe": "ape", "rpt": False, **vocab.protocol_switches("baseline"),
              "protocol": "baseline", "seed": seed, "img_size": 32, "patch_size": 4, "depth": 6, "heads": 4, "lr": lr,
              "epochs": epochs, "code_version": "abc1234"}
    tables.write_trial(results, study, config, {"trial_id": trial_id, "study": study, "status": "finished",
                                                "test_acc": test_acc, "epochs_completed": epochs})
    rows = _measure("ape", False, "baseline", np.random.default_rng(seed), 1.0, full=True)
    tables.write_measurements(results, study, trial_id, epochs, rows)


def test_a_varying_field_is_its_own_condition_and_a_duplicated_seed_is_never_pooled(tmp_path):
    results = str(tmp_path)
    write_study(results, "pool", seeds=2, protocols=["baseline", "cutmix"], models=[], checkpoints=(4,))
    _add_trial(results, "pool", "cifar100-ape-baseline-lr5e-4-s0", 0, lr=5e-4, test_acc=0.95)  # an --set lr run
    _add_trial(results, "pool", "cifar100-ape-baseline-rerun-s1", 1, test_acc=0.10)  # a second trial of seed 1

    data = StudyData.load(results, "pool")
    assert data.condition_fields == ["lr"]
    assert sorted(data.trials["condition"].unique()) == [
        "cifar100, ape, CutMix, lr=0.001", "cifar100, ape, baseline, lr=0.0005", "cifar100, ape, baseline, lr=0.001"]
    counted = data.trials.groupby("condition")["seed"].agg(list).to_dict()
    assert counted["cifar100, ape, baseline, lr=0.001"] == [0, 1]  # seed 1 once, not twice
    assert any(n.startswith("ERROR: condition 'cifar100, ape, baseline, lr=0.001' has 2 trials with seed 1")
               for n in data.notes)
    # The lr run is pinned away from the claims and tables, not pooled into ape baseline as a third seed.
    table = condition_tables.conditions_table(data)
    assert sorted(table["n"]) == [1, 2, 2] and "lr" in table
    claim = claims.evaluate_claims(data).set_index("claim").loc["CutMix adds accuracy"]
    assert (claim["n A"], claim["n B"]) == (2, 2) and "lr = 0.001" in claim["setting"]
    page = build_report(results, "pool").read_text()
    assert "5 finished trial(s) in 3 condition(s), 1-2 seed(s) each" in page
    assert "has 2 trials with seed 1" in page and "not counted: a second trial of its seed" in page
    assert claim["mean B"] > 0.45  # the rerun (test acc 0.10) is not averaged into baseline


def test_figures_render_at_paper_defaults_with_parsable_svgs(tmp_path):
    results = str(tmp_path)
    write_study(results, "fig", seeds=2, protocols=["baseline", "cutmix", "autoaugment"], models=[("none", False)],
                checkpoints=(0, 4))
    data = StudyData.load(results, "fig")
    (scatter,) = figures.mad_entropy(data)
    panels = [ax for ax in scatter.figure.axes if ax.get_visible()]
    assert len(panels) == 3 and not scatter.figure.get_suptitle()  # every protocol; the page holds the title
    legend = scatter.figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [f"layer {i}" for i in range(6)]  # discrete layers
    assert all(t.get_fontsize() >= 9 for t in legend.get_texts())
    assert "√2(G−1)" in panels[0].get_xlabel()
    (depth,) = figures.ssdc_clean(data)
    ticks = depth.figure.axes[0].get_xticks()
    assert np.allclose(ticks, np.round(ticks))  # integer layer ticks
    assert all(t.get_fontsize() >= 9 for t in depth.figure.axes[0].get_legend().get_texts())
    (acc,) = figures.protocol_summary(data)
    for ax in acc.figure.axes:
        low, high = ax.get_ylim()
        assert high - low >= 0.1 - 1e-9  # a 0.01 seed spread is not blown up to the axis height
    out = build_report(results, "fig").parent
    pngs, svgs, pdfs = (sorted(out.glob(f"*.{ext}")) for ext in ("png", "svg", "pdf"))
    assert pngs and [p.stem for p in pngs] == [s.stem for s in svgs] == [p.stem for p in pdfs]
    for svg in svgs:
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg") and next(root.iter("{http://www.w3.org/2000/svg}text"), None) is not None
    assert all(p.read_bytes().startswith(b"%PDF") for p in pdfs)
    with Image.open(pngs[0]) as image:
        assert image.info["dpi"][0] == pytest.approx(150, abs=1)
    page = (out / "index.html").read_text()
    # Every figure is shown at one scale, never wider than the page, and links its SVG and PDF.
    widths = [int(w) for w in re.findall(r'<img src="data:image/png;base64,[^"]*" alt="[^"]*" width="(\d+)"', page)]
    assert len(widths) == len(pngs) and max(widths) <= 1200
    for png in pngs:
        assert f"<a href='{png.stem}.svg'>SVG</a>, <a href='{png.stem}.pdf'>PDF</a>" in page
    assert "Emergence over training" in page and "<h3>Emergence" in page
    assert "<details><summary>" in page and "without data in this study" in page  # no-data claims folded


def test_summary_table_has_one_row_per_trial(tmp_path):
    results = str(tmp_path)
    write_study(results, "sum", seeds=2, protocols=["baseline", "cutmix"], models=[("none", False)], checkpoints=(4,))
    assert study_data.write_summary_table(results, "sum") == 6
    summary = pd.read_parquet(tmp_path / "sum" / "summary")
    trials = pd.read_parquet(tmp_path / "sum" / "trials")
    assert sorted(summary["trial_id"]) == sorted(trials.loc[trials["status"] == "finished", "trial_id"])
    assert {"condition", "lr", "pe", "protocol", "test_acc", "acc_clean", "n_images", "min_mad", "dssdc",
            "fs_jpeg", "checkpoint_epoch"} <= set(summary.columns)
    assert (summary["checkpoint_epoch"] == 4).all() and summary["min_mad"].notna().all()
    cutmix = summary[summary["protocol"] == "cutmix"]
    assert (cutmix["min_mad"] < 0.05).all()  # the planted CutMix effect, as the wide table shows it


def test_checkpoint_on_its_run_per_layer_curves_and_figure(tmp_path):
    uri = stores.default_tracking_uri(str(tmp_path))
    experiment_id = tracking.ensure_experiment(uri, "layers")
    run_id = tracking.start_trial_run(uri, experiment_id, "t0", params={})
    rows = _measure("ape", False, "cutmix", np.random.default_rng(0), 1.0, full=True)
    trial_record.log_checkpoint(uri, run_id, "t0", 100, rows, grid=8)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run_id, "layers/ssdc_rpi_epoch_0100")
    expected = {r["layer"]: r["value"] for r in rows if r["intervention"] == "rpi" and r["metric"] == "ssdc"}
    assert {m.step: m.value for m in history} == pytest.approx(expected)  # step = layer
    assert [m.step for m in client.get_metric_history(run_id, "layers/mad_min_epoch_0100")] == list(range(6))
    assert client.get_run(run_id).data.metrics["progress/n_images"] == 2000
    names = {a.path for a in client.list_artifacts(run_id, "figures")}
    assert names == {"figures/layers_epoch_0100.png", "figures/layers_epoch_0100.svg"}
    # The report is logged on the study's own run, in the study's reports experiment: no trial run.
    report_results = tmp_path / "r"
    write_study(str(report_results), "layers", seeds=1, protocols=["baseline"], models=[], checkpoints=(4,))
    build_report(str(report_results), "layers", mlflow_uri=uri)
    reports = client.get_experiment_by_name("layers-reports").experiment_id
    assert not client.search_runs([experiment_id], "attributes.run_name = 'layers-report'")
    report = client.search_runs([reports], "attributes.run_name = 'layers-report'")
    assert len(report) == 1 and {a.path for a in client.list_artifacts(report[0].info.run_id)} >= {
        "index.html", "claims.csv", "figures"}
    build_report(str(report_results), "layers", mlflow_uri=uri)  # again: the same run, not a second one
    assert len(client.search_runs([reports], "attributes.run_name = 'layers-report'")) == 1
    assert list(search_trial_runs(uri, "layers")["trial_id"]) == ["t0"]


def test_trials_table_links_each_run_on_a_tracking_server_and_a_local_store():
    from analysis.reporting import report
    from analysis.reporting.page import trials_html
    from sweeps.launch import progress

    trials = pd.DataFrame({"trial_id": ["a", "b"], "dataset": "cifar10", "pe": "ape", "rpt": False,
                           "protocol": "baseline", "seed": [0, 1], "status": ["finished", "failed"],
                           "test_acc": [0.5, None], "mlflow_run_id": ["0123456789abcdef", None]})
    data = StudyData.from_frames("s", trials, pd.DataFrame(), pd.DataFrame())
    links = report._run_links("http://mlflow:5000/", "7")
    html = trials_html(data, links)
    # the run's page in the training layout, as the launcher prints it (not MLflow's GenAI layout)
    url = "http://mlflow:5000/#/experiments/7/runs/0123456789abcdef?workflowType=machine_learning"
    assert f"<a href='{url}'>01234567</a>" in html
    assert "failed" in html and html.count("<a href") == 1
    assert "<a href" not in trials_html(data, {})
    # A local store: the run at `mlflow ui`'s address, and the caption names the command as the sweep prints it.
    local = "sqlite:////tmp/m.db"
    html = trials_html(data, report._run_links(local, "7"), tracking.ui_command(local))
    assert f"<a href='{url.replace('http://mlflow:5000', tracking.LOCAL_UI)}'>01234567</a>" in html
    assert "<code>mlflow ui --backend-store-uri sqlite:////tmp/m.db --workers 1</code>" in html
    assert progress.mlflow_view(local, "7").startswith(tracking.ui_command(local) + ", then ")
