"""``vitsweep status STUDY``: where a sweep stands, read from its results folder alone.

Works while a sweep runs (another process, another machine) and on a copy of
the results: the ``trials`` table says what each started trial reached, the
sweep manifest (``records.manifest``) what was planned, and the heartbeat
whether the launcher is alive. ``running`` rows of a launcher that is not
alive are *stale*: the launcher died, and ``--resume`` picks them up.
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
from sweeps import STUDIES
from sweeps.live import format_duration

STATES = ("finished", "running", "stale", "failed", "stopped", "pending")


def study_status(results: str, study: str) -> dict[str, Any]:
    """Counts per state, the trial ids of each non-finished state, and the launch that planned them.

    Raises ValueError when the results folder holds no such study (naming the ones it holds)."""
    table = tables.read_table(results, study, "trials")
    plan = manifest.read_manifest(results, study)
    if table is None and plan is None:
        found = tables.list_studies(results)
        raise ValueError(f"no study {study!r} in {results}; studies there: {found or 'none'}")
    beat = manifest.read_heartbeat(results, study)
    alive = manifest.launcher_alive(beat)  # on this machine: its pid checked, as the launch lock does
    checked = bool(beat) and manifest.process_alive(beat)[0] is not None
    rows = {r["trial_id"]: r["status"] for r in (table.to_pylist() if table is not None else [])}
    state = {tid: ("stale" if s == "running" and not alive else s) for tid, s in rows.items()}
    planned = [p["trial_id"] for p in plan["planned"]] if plan else []
    for tid in planned:
        state.setdefault(tid, "pending")
    counts = Counter(state.values())
    return {"study": study, "results": results, "counts": {s: counts.get(s, 0) for s in STATES},
            "ids": {s: sorted(t for t, v in state.items() if v == s) for s in STATES if s != "finished"},
            "planned": len(planned) if plan else None, "unplanned": sorted(set(rows) - set(planned)) if plan else [],
            "launch": plan, "heartbeat": beat, "alive": alive, "pid_checked": checked}


def format_status(status: dict[str, Any], *, now: datetime.datetime | None = None) -> str:
    counts, plan, beat = status["counts"], status["launch"], status["heartbeat"]
    lines = []
    if plan:
        lines.append(f"{status['study']} in {status['results']}: {status['planned']} planned trials "
                     f"(launched {plan['started_at']} on {plan['host']}, pid {plan['pid']}, code {plan['code_version']})")
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
    if beat and status["alive"] and beat.get("stage"):
        lines.append("  " + stage_line(beat))
    elif beat and (beat.get("outcome") or not beat.get("ended")):  # cut short: what continues it
        lines.append("  " + continue_line(status["study"], status["results"], beat))
    for s in ("stale", "failed", "running"):
        if status["ids"][s]:
            shown = ", ".join(status["ids"][s][:10]) + (" ..." if len(status["ids"][s]) > 10 else "")
            lines.append(f"  {s}: {shown}")
    if status["unplanned"]:
        lines.append(f"  {len(status['unplanned'])} trial(s) in the table are not in the latest plan "
                     "(from an earlier launch with other options)")
    return "\n".join(lines)


STAGE_WORDS = {"train": "training", "analyze": "measuring checkpoints", "report": "writing the report"}


def stage_line(beat: dict[str, Any]) -> str:
    """``stage analyze (measuring checkpoints): 5 of 12 checkpoints, ETA 2 min``, from a live heartbeat."""
    stage = beat["stage"]
    line = f"stage {stage} ({STAGE_WORDS.get(stage, stage)})"
    p = beat.get("progress")
    if p:
        line += f": {p['done']} of {p['total']} {p['unit']}"
        if p.get("eta_s") is not None and p["done"] < p["total"]:
            line += f", ETA {format_duration(p['eta_s'])}"
    return line


def continue_line(study: str, results: str, beat: dict[str, Any]) -> str:
    """The command that continues a stage that was cut short (interrupted, or its process died)."""
    p = beat.get("progress") or {}
    if beat.get("stage") == "analyze":
        command = ["vitsweep", "analyze", study, "--results", results]
        if p.get("checkpoints"):  # the choices it measured with (the study's own, unless given)
            command += ["--checkpoints", str(p["checkpoints"]), "--eval-size", str(p.get("eval_size") or 0)]
        done = f"{p['done']} of {p['total']} checkpoints measured; " if p.get("total") else ""
        return f"analysis unfinished: {done}`{shlex.join(command)}` continues it"
    if beat.get("stage") == "report":
        return f"report unfinished: `{shlex.join(['vitsweep', 'report', study, '--results', results])}` writes it"
    return "training unfinished: the launch command with --resume continues the unfinished trials"


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
