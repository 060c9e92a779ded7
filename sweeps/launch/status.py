"""``vitsweep status STUDY``: where a sweep stands, read from its results folder alone.

Works while a sweep runs (another process, another machine) and on a copy of
the results: the ``trials`` table says what each started trial reached, the
sweep manifest (``records.manifest``) what was planned, and the heartbeat
whether the launcher is alive. ``running`` rows of a launcher that is not
alive are *stale*: the launcher died, and ``--resume`` picks them up.
The analysis plan (``records.manifest.read_analysis_plan``) says which checkpoints the latest analysis set out
to measure and which of them are missing (their files gone); the measurement files on disk say how many
of them are measured, whatever the heartbeat last said.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from collections import Counter
from typing import Any

from records import manifest, tables
from records.layout import results_location
from records.vocab import format_duration
from sweeps.studies import STUDIES

STATES = ("finished", "running", "stale", "failed", "stopped", "pending")


def study_status(results: str, study: str) -> dict[str, Any]:
    """Counts per state, the trial ids of each non-finished state, and the launch that planned them.

    Raises ValueError when the results folder holds no such study (naming the ones it holds)."""
    table = tables.read_table(results, study, "trials", ["trial_id", "status"])
    plan = manifest.read_manifest(results, study)
    if table is None and plan is None:
        found = tables.list_studies(results)
        raise ValueError(f"no study {study!r} in {results}; studies there: {found or 'none'}")
    beat = manifest.read_heartbeat(results, study)
    alive = manifest.launcher_alive(beat)  # on this machine: its pid checked, as the launch lock does
    checked = bool(beat) and manifest.process_alive(beat)[0] is not None
    rows = dict(zip(table["trial_id"].to_pylist(), table["status"].to_pylist())) if table is not None else {}
    state = {tid: ("stale" if s == "running" and not alive else s) for tid, s in rows.items()}
    planned = [p["trial_id"] for p in plan["planned"]] if plan else []
    for tid in planned:
        state.setdefault(tid, "pending")
    counts = Counter(state.values())
    return {"study": study, "results": results, "counts": {s: counts.get(s, 0) for s in STATES},
            "ids": {s: sorted(t for t, v in state.items() if v == s) for s in STATES if s != "finished"},
            "planned": len(planned) if plan else None, "unplanned": sorted(set(rows) - set(planned)) if plan else [],
            "launch": plan, "heartbeat": beat, "alive": alive, "pid_checked": checked,
            "analysis": analysis_status(results, study)}


def analysis_status(results: str, study: str) -> dict[str, Any] | None:
    """The latest analysis plan against the measurement files on disk: {planned, measured, missing (those
    still unmeasured: trial_id, epoch, path), checkpoints, eval_size}. None without a plan (no analysis
    ran, or one of an earlier version: its heartbeat's progress is all there is)."""
    plan = manifest.read_analysis_plan(results, study)
    if plan is None:
        return None
    measured = tables.measured(results, study)  # the record of truth: a checkpoint's file is written last
    planned = {(str(t), int(e)) for t, e in plan["planned"]}
    return {"planned": len(planned), "measured": len(planned & measured),
            "missing": [m for m in plan.get("missing") or [] if (m["trial_id"], int(m["epoch"])) not in measured],
            "checkpoints": plan.get("checkpoints"), "eval_size": plan.get("eval_size")}


def format_status(status: dict[str, Any], *, now: datetime.datetime | None = None) -> str:
    counts, plan, beat = status["counts"], status["launch"], status["heartbeat"]
    lines = []
    if plan:
        lines.append(f"{status['study']} in {status['results']}: {status['planned']} planned trials "
                     f"(launched {plan['started_at']} on {plan['host']}, pid {plan['pid']}, "
                     f"code {plan['code_version']})")
    else:
        lines.append(f"{status['study']} in {status['results']}: no sweep manifest (launched before vitsweep 0.2?), "
                     "so pending trials are unknown")
    lines.append("  " + ", ".join(f"{s} {counts[s]}" for s in STATES if s != "pending" or plan))
    if beat:
        age = manifest.heartbeat_age(beat, now=now)
        if status["alive"] and status.get("pid_checked"):
            lines.append(f"  launcher: running on this machine (pid {beat['pid']}), last heartbeat {age:.0f} s ago")
        elif status["alive"]:
            lines.append(f"  launcher: running on {beat['host']} by its heartbeat, {age:.0f} s ago (its pid "
                         f"{beat['pid']} cannot be checked from here; stale after {manifest.STALE_AFTER_S:.0f} s)")
        elif beat.get("ended") and beat.get("outcome"):
            lines.append(f"  launcher: ended {beat['time']} in its {beat.get('stage') or '?'} stage: {beat['outcome']}")
        elif beat.get("ended"):
            last = f" after its {beat['stage']} stage" if beat.get("stage") else ""
            lines.append(f"  launcher: ended {beat['time']}{last}")
        else:
            why = manifest.process_alive(beat)[1] or f"last heartbeat {age:.0f} s ago"
            lines.append(f"  launcher: not alive ({why})")
    analysis = status.get("analysis")
    if beat and status["alive"] and beat.get("stage"):
        lines.append("  " + stage_line(beat, analysis=analysis))
    elif beat and (beat.get("outcome") or not beat.get("ended")):  # cut short: what continues it
        lines.append("  " + continue_line(status["study"], status["results"], beat, analysis=analysis,
                                          counts=counts))
    elif analysis and analysis["missing"]:  # ran to its end without them
        lines.append("  " + missing_line(analysis))
    for s in ("stale", "failed", "running"):
        if status["ids"][s]:
            shown = ", ".join(status["ids"][s][:10]) + (" ..." if len(status["ids"][s]) > 10 else "")
            lines.append(f"  {s}: {shown}")
    if status["unplanned"]:
        lines.append(f"  {len(status['unplanned'])} trial(s) in the table are not in the latest plan "
                     "(from an earlier launch with other options)")
    return "\n".join(lines)


STAGE_WORDS = {"train": "training", "analyze": "measuring checkpoints", "report": "writing the report"}


def stage_line(beat: dict[str, Any], *, analysis: dict[str, Any] | None = None) -> str:
    """``stage analyze (measuring checkpoints): 5 of 12 checkpoints, ETA 2 min``, from a live heartbeat; with
    ``analysis`` (``analysis_status``) the analyze stage's checkpoints measured are counted on disk (the
    heartbeat's count is written at most every few seconds)."""
    stage = beat["stage"]
    line = f"stage {stage} ({STAGE_WORDS.get(stage, stage)})"
    p = beat.get("progress")
    if p and stage == "analyze" and analysis and analysis.get("planned"):
        p = {**p, "done": analysis["measured"], "total": analysis["planned"]}
    if p:
        line += f": {p['done']} of {p['total']} {p['unit']}"
        if p.get("eta_s") is not None and p["done"] < p["total"]:
            line += f", ETA {format_duration(p['eta_s'])}"
    return line


def continue_line(study: str, results: str, beat: dict[str, Any], *, analysis: dict[str, Any] | None = None,
                  counts: dict[str, int] | None = None) -> str:
    """The command that continues a stage that was cut short (interrupted, or its process died); with
    ``analysis`` (``analysis_status``) the checkpoints measured are counted on disk, and with the trials'
    ``counts`` a train stage whose every trial finished is not called unfinished."""
    p = beat.get("progress") or {}
    if beat.get("stage") == "analyze":
        command = ["vitsweep", "analyze", study, "--results", results]
        chosen = (analysis or {}).get("checkpoints") or p.get("checkpoints")
        if chosen:  # the choices it measured with (the study's own, unless given)
            eval_size = (analysis or {}).get("eval_size") if analysis else p.get("eval_size")
            command += ["--checkpoints", str(chosen), "--eval-size", str(eval_size or 0)]
        done, total = ((analysis["measured"], analysis["planned"]) if analysis and analysis.get("planned")
                       else (p.get("done"), p.get("total")))
        done = f"{done} of {total} checkpoints measured; " if total else ""
        gone = f"{_checkpoints(len(analysis['missing']))} missing; " if analysis and analysis["missing"] else ""
        return f"analysis unfinished: {gone}{done}`{shlex.join(command)}` continues it"
    if beat.get("stage") == "report":
        return f"report unfinished: `{shlex.join(['vitsweep', 'report', study, '--results', results])}` writes it"
    ended = (counts or {}).get("finished", 0) + (counts or {}).get("stopped", 0)  # stopped: early, by the scheduler
    if ended and not any((counts or {}).get(s) for s in ("running", "stale", "failed", "pending")):
        command = shlex.join(["vitsweep", "analyze", study, "--results", results])
        return f"training finished (all {ended} trials): `{command}` measures their checkpoints"
    return "training unfinished: the launch command with --resume continues the unfinished trials"


def missing_line(analysis: dict[str, Any]) -> str:
    """``analysis unfinished: 2 checkpoints missing (t epoch 4, ...), their files gone; 10 of 12 measured``."""
    missing = analysis["missing"]
    named = ", ".join(f"{m['trial_id']} epoch {m['epoch']}" for m in missing[:4]) + (" ..." if len(missing) > 4 else "")
    return (f"analysis unfinished: {_checkpoints(len(missing))} missing ({named}), their files gone; "
            f"{analysis['measured']} of {analysis['planned']} checkpoints measured")


def _checkpoints(n: int) -> str:
    return f"{n} checkpoint{'' if n == 1 else 's'}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help=f"a study folder under --results (e.g. one of: {', '.join(STUDIES)})")
    parser.add_argument("--results", default="results", help="results folder or URI (default: ./results)")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args: argparse.Namespace) -> int:
    results = results_location(args.results)
    try:
        status = study_status(results, args.study)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(status, indent=1, default=str) if args.json else format_status(status))
    return 0
