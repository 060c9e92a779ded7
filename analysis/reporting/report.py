"""The study report: the papers' figures and tables regenerated from Parquet, with seed-level spread.

    vitsweep report STUDY --results DIR          # or: python -m analysis.reporting.report STUDY --results DIR
    build_report("results", "study_l")           # -> results/study_l/report/index.html

Reads only ``<results>/<study>/{trials,epochs,measurements}/`` (``records.schema``) and writes
``<results>/<study>/report/``: per figure a PNG (150 dpi), an SVG and a PDF, one self-contained
``index.html`` (figures inline as base64 PNGs), and for a paper the claims, the conditions table and the
protocol ablation table as CSV (numbers, empty where there is none) and LaTeX (``write_tables``: the
claims as the page shows them in ``claims.tex``, every column in ``claims-full.tex``). Given a tracking
URI, it logs the page, the tables and the figures to the study's run ``<study>-report`` in its
experiment, and the per-trial table links each trial's run in MLflow's UI (a local store's through
``mlflow ui``, the command the page names). Any table may be missing or empty: a figure without its data
is replaced by a one-line note naming the command that produces it, never an error. This module draws the figures
(``analysis.reporting.figures``), writes the files (the page: ``analysis.reporting.page``) and logs them; what a
condition and a trial are is ``analysis.statistics.study_data``'s docstring.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
from pathlib import Path

import pandas as pd

from analysis.reporting import page
from analysis.reporting.claims_page import NOTE, visible_claims
from analysis.reporting.condition_tables import ablation_numbers, conditions_numbers
from analysis.statistics.claims import evaluate_claims
from analysis.statistics.study_data import StudyData
from records import manifest, tables, tracking
from records.layout import report_dir, tracking_db
from records.stores import default_tracking_uri

log = logging.getLogger(__name__)


def build_report(results: str, study: str, *, out_dir: str | os.PathLike | None = None,
                 mlflow_uri: str | None = None) -> Path:
    """Write the report of ``study`` and return the path of its ``index.html``.

    results: the results folder (or a pyarrow URI such as ``s3://bucket/results``). out_dir: where the
    report goes (default: ``records.layout.report_dir``). mlflow_uri: where
    to log the report (run ``<study>-report``) and, for an http(s) server, whose runs to link; None
    logs nothing."""
    from analysis.measuring import canvas  # matplotlib: imported when figures are drawn, not for --help
    from analysis.reporting import figures, plotting

    data = StudyData.load(results, study)  # first: a wrong study name must not leave a folder behind
    out = Path(report_dir(results, study) if out_dir is None else out_dir)
    out.mkdir(parents=True, exist_ok=True)

    body = {key: [] for key in page.SECTIONS}

    for section, title, draw in figures.FIGURES:
        try:
            plots = draw(data)
        except plotting.NoData as missing:
            fill = "" if "`vitsweep " in str(missing) else " " + _to_fill(data, results, title, figures.NEEDS)
            body[section].append(page.omitted(f"{title}: omitted ({missing}).{fill}"))
            continue
        except Exception as err:  # noqa: BLE001 - one broken figure must not cost the whole report
            log.exception("figure %r failed", title)
            body[section].append(page.omitted(f"{title}: could not be drawn ({err!r})."))
            continue
        for plot in plots:
            name = page.slug(plot.title)
            png = canvas.render_png(plot.figure)
            (out / f"{name}.png").write_bytes(png)
            (out / f"{name}.svg").write_bytes(canvas.render_svg(plot.figure))
            (out / f"{name}.pdf").write_bytes(canvas.render_pdf(plot.figure))
            # Shown at a fixed scale (canvas.PX_PER_IN), so every figure's text renders at one size.
            body[section].append(page.figure_html(plot.title, plot.caption, name, png,
                                                  canvas.display_px(plot.figure)))
    body["L"].extend(page.ablation_html(data))
    body["T"].insert(0, page.conditions_html(data))
    experiment_id = _experiment(mlflow_uri, study)
    body["T"].insert(1, page.trials_html(data, _run_links(mlflow_uri, experiment_id),
                                         tracking.ui_command(mlflow_uri) if experiment_id is not None else None))
    if note := missing_checkpoints_note(results, study):
        body["T"].insert(2, page.omitted(note))

    claims = evaluate_claims(data)
    tables = write_tables(out, {"claims": claims, "conditions": conditions_numbers(data),
                                "ablation": ablation_numbers(data)})
    tables.append(write_claims_latex(out, claims))
    index = out / "index.html"
    index.write_text(page.render(data, results, claims, body), encoding="utf-8")
    if experiment_id is not None:
        _log_report(mlflow_uri, experiment_id, study, index, tables)
    return index


def missing_checkpoints_note(results: str, study: str) -> str | None:
    """A note under the trials table naming the checkpoints the latest analysis planned whose files are gone
    (``records.manifest.read_analysis_plan``, less those measured since): their rows and summaries lack them."""
    plan = manifest.read_analysis_plan(results, study) or {}
    measured = tables.measured(results, study) if plan.get("missing") else set()
    missing = [m for m in plan.get("missing") or [] if (m["trial_id"], int(m["epoch"])) not in measured]
    if not missing:
        return None
    named = (", ".join(f"{m['trial_id']} epoch {m['epoch']}" for m in missing[:20])
             + (" ..." if len(missing) > 20 else ""))
    return (f"Missing checkpoints: {len(missing)} planned checkpoint(s) were not measured, their files gone "
            f"(a deleted checkpoint or snapshot folder): {named}. Their trials' measurements and summary rows "
            "lack them.")


def write_tables(out: Path, tables: dict[str, pd.DataFrame]) -> list[Path]:
    """Each table as ``<name>.csv`` (a missing value is an empty field, so a numeric column reads back
    numeric) and LaTeX; returns the files. The claims' LaTeX with every column is ``claims-full.tex``:
    ``claims.tex`` is the table the page shows (``claims_page.write_claims_latex``)."""
    files = []
    for name, table in tables.items():
        table = table.replace("—", math.nan).infer_objects()  # "—" is the page's, not a value
        table.to_csv(out / f"{name}.csv", index=False)
        files += [out / f"{name}.csv", write_latex(out, "claims-full" if name == "claims" else name, table)]
    return files


# The claims as shown: the long text columns wrap at these widths, so the table fits a page.
CLAIMS_WRAP = {"claim": "p{4.5cm}", "setting": "p{3.2cm}", "verdict": "p{3cm}", NOTE: "p{4cm}"}


def write_latex(out: Path, name: str, table: pd.DataFrame, wrap: dict[str, str] | None = None) -> Path:
    """``<name>.tex``: a booktabs tabular (``DataFrame.to_latex``, 3 significant digits, text escaped);
    ``wrap``: the columns that wrap, at their LaTeX widths (``p{4cm}``), the others right-aligned."""
    columns = "".join(wrap.get(c, "r") for c in table.columns) if wrap else None
    path = out / f"{name}.tex"
    path.write_text(table.to_latex(index=False, na_rep="", float_format="%.3g", escape=True, column_format=columns),
                    encoding="utf-8")
    return path


def write_claims_latex(out: Path, claims: pd.DataFrame) -> Path:
    """``claims.tex``: the claims table as the page shows it (``visible_claims``), its note column only
    where a row has a note."""
    shown = visible_claims(claims)
    shown = shown if shown[NOTE].astype(bool).any() else shown.drop(columns=NOTE)
    return write_latex(out, "claims", shown, wrap=CLAIMS_WRAP)


def _to_fill(data: StudyData, results: str, title: str, needs: dict[str, tuple[str, str]]) -> str:
    """The command that produces an omitted figure's data: the training where there are no trials (or,
    for a figure of the epochs table, no epochs), the analysis where nothing is measured, else what the
    figure needs that this study does not have (``figures.NEEDS``)."""
    where = f"{shlex.quote(data.study)} --results {shlex.quote(str(results))}"
    table, need = needs.get(title, ("measurements", ""))
    if data.raw_trials.empty or (table == "epochs" and data.epochs.empty):
        return f"`vitsweep sweep {where}` trains the study, then `vitsweep analyze {where}` measures it."
    if data.measurements.empty or not need:
        return f"`vitsweep analyze {where}` measures the trials' checkpoints."
    return need


def _experiment(uri: str | None, study: str) -> str | None:
    """The study's MLflow experiment id (created if missing), or None without a URI or store."""
    if not uri:
        return None
    try:
        return tracking.ensure_experiment(uri, study)
    except Exception as err:  # noqa: BLE001 - a tracking outage must not cost the report
        log.warning("MLflow %s unreachable, report not logged: %s", uri, err)
        return None


def _run_links(uri: str | None, experiment_id: str | None) -> dict[str, str]:
    """How a trial's run links to MLflow's UI, {} without a store: ``base`` + run id + ``suffix`` is
    ``records.tracking.run_url``, the run's page in the training layout, at a tracking server's address
    or, for a local store, at ``mlflow ui``'s (``records.tracking.ui_command`` starts it)."""
    if not uri or experiment_id is None:
        return {}
    base, suffix = tracking.run_url(uri, experiment_id, "RUN").split("RUN", 1)
    return {"base": base, "suffix": suffix}


def _log_report(uri: str, experiment_id: str, study: str, index: Path, tables: list[Path]) -> None:
    try:
        run_id = tracking.study_run(uri, experiment_id, f"{study}-report")
        tracking.log_artifact_file(uri, run_id, index)
        for table in tables:
            tracking.log_artifact_file(uri, run_id, table)
        for figure in sorted(f for ext in ("png", "svg", "pdf") for f in index.parent.glob(f"*.{ext}")):
            tracking.log_artifact_file(uri, run_id, figure, "figures")
        tracking.end_trial_run(uri, run_id)
    except Exception as err:  # noqa: BLE001
        log.warning("could not log the report to MLflow %s: %s", uri, err)


# -- command line ---------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vitsweep report`` (the lead mounts them as a sub-command)."""
    parser.add_argument("study", help="study name: the folder <results>/<study>")
    parser.add_argument("--results", default="results", help="results folder or URI (default: ./results)")
    parser.add_argument("--out", default=None, help="report folder (default: <results>/<study>/report)")
    parser.add_argument("--mlflow-uri", default=None,
                        help="log the report to run <study>-report there and link each trial's run "
                             "(default: <results>/mlflow.db when it exists, else none)")


def run(args: argparse.Namespace) -> int:
    uri = args.mlflow_uri
    if uri is None and (db := tracking_db(args.results)) is not None and db.exists():
        uri = default_tracking_uri(args.results)
    index = build_report(args.results, args.study, out_dir=args.out, mlflow_uri=uri)
    print(index)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vitsweep report", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as err:  # a wrong study name or results folder: say so without a traceback
        parser.error(str(err))


if __name__ == "__main__":
    raise SystemExit(main())
