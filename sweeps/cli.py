"""The ``vitsweep`` command.

    vitsweep demo                         # the embedded default: train, analyse, report (local)
    vitsweep sweep study_l --dry-run      # list a study's trials
    vitsweep sweep study_p --gpus-per-trial 1 --results s3://BUCKET/vitsweep --mlflow-uri http://HEAD:5000
    vitsweep analyze demo                 # measure every checkpoint (Ray Data)
    vitsweep report demo                  # figures + index.html from the Parquet tables
    vitsweep status demo                  # finished / running / failed / pending, from the results folder
    vitsweep compare results-a results-b demo   # what changed between two results folders (claims, conditions)

`--help` imports no torch, Ray, MLflow or matplotlib (the valid names come from
`records.vocab` and the torch-free rows' keys); each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import textwrap

from records import layout, vocab
from sweeps import run as launcher
from sweeps.launch import options, progress, supervise
from sweeps.launch import status as status_module
from sweeps.launch.interrupt import INTERRUPTED_EXIT, Interrupts
from sweeps.launch.lock import AGAIN
from sweeps.launch.validate import OneLineParser, check_ascii_paths
from sweeps.studies import STUDIES, study
from trainables.config.architecture import PRESETS
from trainables.config.data_roots import DATASET_SPECS

COMMANDS = {  # name -> (help, description, example)
    "demo": ("run the demo study end to end on a local Ray (a few minutes on a laptop CPU)",
             "Train the demo study's tiny ViTs on the procedural shapes data, analyse and report.",
             "vitsweep demo --results results"),
    "sweep": ("run a study (train, and optionally analyze and report)", "Run a study on Ray Tune + Ray Train.",
              "vitsweep sweep study_l --seeds 5 --data-root /data   |   vitsweep sweep factorial --dry-run"),
    "analyze": ("measure a study's checkpoints (SSDC, MAD, entropy, fragility, PE scaling) as a Ray Data job",
                "Run the studies' metrics and interventions over every checkpoint of a study.",
                "vitsweep analyze demo --checkpoints all"),
    "report": ("build the figures and index.html of a study from its Parquet tables",
               "Regenerate the papers' figures and the claims table from Parquet.",
               "vitsweep report demo --results results"),
    "status": ("trials finished / running / failed / pending of a study, from its results folder alone",
               "Where a sweep stands: read from the trials table, the sweep manifest and the heartbeat.",
               "vitsweep status study_l --results s3://BUCKET/vitsweep"),
    "compare": ("two results folders of one study side by side: what changed in its claims and conditions",
                "Put the claims and conditions of one study from two results folders side by side: rows with data "
                "first, A - B beside each number, changed verdicts marked, equal rows folded; CSV and an HTML page.",
                "vitsweep compare results-v1 results-v2 study_l   |   ... --all (also the equal rows)"),
}


def valid_names() -> str:
    """The names a user types, one kind a line (torch-free: ``records.vocab``, the rows' keys), for ``--help``."""
    kinds = (("studies", STUDIES), ("data sets", DATASET_SPECS), ("PEs", vocab.PES),
             ("protocols", vocab.PROTOCOLS), ("presets", PRESETS))
    return "\n".join(textwrap.fill(", ".join(valid), width=100, initial_indent=f"  {kind + ':':<12}",
                                    subsequent_indent=" " * 14) for kind, valid in kinds)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``command``: only that subcommand's arguments are built (``analyze``
    and ``report`` import numpy, pandas and scipy for theirs, a second or more that a launch, or
    its refusal, need not wait for)."""
    parser = OneLineParser(  # a bad argument is one line too (subcommands inherit the class)
        prog="vitsweep",
        description="Sweeps of small ViTs for research on spatial structure: train on Ray Tune + Ray Train,\n"
        "measure every checkpoint, compare in MLflow and Parquet.",
        epilog=f"valid names:\n{valid_names()}\n\nexample: vitsweep demo   |   vitsweep sweep STUDY --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the names one kind a line
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (summary, description, example) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=summary, description=description, epilog=f"example: {example}")
        if name == "demo":
            command_parser.add_argument("--results", default="results", help="output folder (default ./results)")
        elif name == "sweep":
            options.add_arguments(command_parser)
        elif name == "status":
            status_module.add_arguments(command_parser)
        elif command in (None, name):
            _analysis(name).add_arguments(command_parser)
    return parser


def _analysis(command: str):
    """The module of an analysis command, imported only when that command runs or shows its help: the
    analysis stack (pandas, SciPy, Ray Data) stays out of a launch's pre-torch checks."""
    from analysis.measuring import job  # pandas, SciPy and Ray Data: only for an analysis command
    from analysis.reporting import compare, report

    return {"analyze": job, "report": report, "compare": compare}[command]


def analyze_command(args: argparse.Namespace, results: str, mlflow_uri: str) -> int:
    """``vitsweep analyze`` after ``job.check``: 0 every checkpoint measured, 1 one skipped. A user error
    raises ValueError; anything else (a storage fault) is the caller's to classify."""
    statuses = launcher.analyze_stage(
        results, args.study, mlflow_uri, address=args.address, checkpoints=args.checkpoints or "final",
        force=args.force, eval_size=args.eval_size or None, batch_size=args.batch_size, max_actors=args.actors,
        gpus_per_actor=args.gpus_per_actor, verbose=args.verbose, figures=args.figures)
    return 0 if all(s["status"] == "ok" for s in statuses) else 1


def main(argv: list[str] | None = None) -> int:
    """The command; as the program (no ``argv``), a command that starts Ray runs in a child process
    kept by this one (``sweeps.launch.supervise``)."""
    if argv is not None:
        return _main(list(argv))
    argv = sys.argv[1:]
    args = _parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    if args.command not in ("sweep", "demo", "analyze") or getattr(args, "dry_run", False):
        return _main(argv)

    def where() -> tuple[str, str, str | None, str]:
        then = AGAIN[{"sweep": "launch", "demo": "demo", "analyze": "analysis"}[args.command]]
        return (layout.results_location(args.results), getattr(args, "study", "demo"),
                getattr(args, "mlflow_uri", None), then)

    return supervise.run(argv, _main, where)


def _main(argv: list[str]) -> int:
    args = _parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    if args.command in ("report", "compare"):
        try:
            return _analysis(args.command).run(args)
        except launcher.USER_ERRORS as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return {"sweep": launcher.run, "demo": demo, "analyze": analyze, "status": status_module.run}[args.command](args)


def analyze(args: argparse.Namespace) -> int:
    """``vitsweep analyze``: the study's own checkpoints and evaluation size unless given (what its
    ``--stage all`` measures, so this continues it), one analysis of a study at a time (the launch
    lock; ``analysis/`` does not reach ``sweeps/``), a storage fault in one line, exit 1."""
    job = _analysis("analyze")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    progress.configure_console(args.verbose)
    if args.study in STUDIES:  # another name is refused with the studies the results hold
        spec = study.of(args.study)
        args.checkpoints = args.checkpoints or spec.checkpoints
        args.eval_size = (spec.eval_size or 0) if args.eval_size is None else args.eval_size  # 0: whole split
    with Interrupts():
        try:
            check_ascii_paths(args)  # it starts Ray too (Ray Data): see sweeps.launch.validate
            results, mlflow_uri = job.check(args)
            launcher.check_address(args.address)
        except launcher.USER_ERRORS as exc:  # e.g. --results s3://... without --mlflow-uri
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            return launcher.guarded(results, args.study, args.verbose, lambda: None,
                                    lambda _: analyze_command(args, results, mlflow_uri), what="analysis",
                                    then="run the same command again")
        except KeyboardInterrupt:
            print(f"vitsweep: analysis interrupted; measured checkpoints are kept, and the same command continues "
                  f"(`{shlex.join(['vitsweep', 'status', args.study, '--results', args.results])}` shows it)",
                  file=sys.stderr, flush=True)
            return INTERRUPTED_EXIT


def demo(args: argparse.Namespace) -> int:
    """Train, analyse and report the demo study; the launcher's closing lines say where everything is."""
    argv = ["sweep", "demo", "--stage", "all", "--results", args.results, "--resume"]
    return launcher.run(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
