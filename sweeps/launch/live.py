"""Live progress while trials train: a throttled line per running pack or trial, with ETAs.

    [train] shapes-ape-baseline-s0-1a2b3c4d: epoch 3/8, 1,234 images/s, ETA 40 s; all 4 trials: ETA 3 min
            (2 running, 2 waiting)
    [train] pack shapes-p0-5e6f7a8b (8 trials): epoch 12/100, 8 x 2,100 images/s, ETA 9 min; all 60 trials:
            ETA 1.2 h (...)

Built from the records the trials already write, in the launcher process (no worker output is
needed): a member's ``trials`` row (``started_at``: when its driver opened it) and its ``epochs``
rows (epoch k, images/s, ``wall_time_s`` since its training loop began), the epochs file's
modification time telling when epoch k ended. ``RecordReader`` turns them into one ``Unit`` per
Tune trial (a pack, or a lone trial: members of a pack train in lock step); ``LiveProgress`` is the
pure core: the clock and the reader are injected, so a test drives it with a fake clock.

ETA: each unit's remaining time is its remaining epochs at its measured seconds per epoch; a unit
not yet measured, and every unit still waiting, costs the measured start-up (driver opened ->
first epoch's loop start), its epochs at the measured seconds per epoch of its shape (data set,
image size) and the measured close. The waiting units are then scheduled onto the slots that run
at once (as many as the most Tune trials seen running together), each into the slot that frees
first, as Tune does; the sweep's ETA is when the last slot frees. So concurrency is accounted for:
8 trials on 2 slots cost 4 rounds, not 8 and not 1. Until one epoch has been measured there is no
ETA.

Throttle: a unit's line at most every ``MIN_INTERVAL_S`` (30 s), printed when it reached a new
epoch, and at least every ``MAX_INTERVAL_S`` (5 min) while it runs (a unit still starting says so).
Records are read at most every ``POLL_S`` (``REMOTE_POLL_S`` on an object store); a running
unit's rows are read once, then only its epochs file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from records import layout, tables
from records.vocab import format_duration

MIN_INTERVAL_S = 30.0
MAX_INTERVAL_S = 300.0
POLL_S = 2.0  # a local results folder: a file-info and a small read per running unit
REMOTE_POLL_S = 10.0  # an object store: the same, as requests


@dataclass(frozen=True)
class Unit:
    """One Tune trial as its records have it; times are clock seconds (``time.time()`` in the launcher).

    epochs: the epochs it trains; done: epochs completed (the pack's, members in lock step);
    started: its driver opened its rows; last_at: its latest epoch ended; epoch_s: measured seconds
    per epoch (training and the per-epoch evaluation); loop_s: seconds of its current training loop
    at ``last_at`` (so the loop began at ``last_at - loop_s``); images_per_s: per member;
    ended: it finished or failed at this time (None while it runs)."""

    name: str
    size: int = 1
    epochs: int = 0
    shape: str = ""
    done: int = 0
    started: float | None = None
    last_at: float | None = None
    epoch_s: float | None = None
    loop_s: float | None = None
    images_per_s: float | None = None
    ended: float | None = None

    @property
    def measured(self) -> bool:
        return self.epoch_s is not None and self.last_at is not None

    @property
    def startup_s(self) -> float | None:
        """Driver opened -> its training loop began (Train worker start, data load, model build)."""
        if not self.measured or self.started is None or self.loop_s is None:
            return None
        return max(0.0, self.last_at - self.loop_s - self.started)


@dataclass
class Estimate:
    """What the measured units say a unit costs."""

    startup_s: float = 0.0
    close_s: float = 0.0
    epoch_s: dict[str, float] = field(default_factory=dict)  # shape -> seconds per epoch
    any_epoch_s: float | None = None

    def epoch_of(self, unit: Unit) -> float | None:
        return self.epoch_s.get(unit.shape, self.any_epoch_s)


def _mean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def estimate(units: Sequence[Unit]) -> Estimate:
    """Mean start-up, close and seconds per epoch (per shape) over the units that measured them."""
    measured = [u for u in units if u.measured]
    by_shape: dict[str, list[float]] = {}
    for u in measured:
        by_shape.setdefault(u.shape, []).append(u.epoch_s)
    closes = [u.ended - u.last_at for u in measured if u.ended is not None and u.done >= u.epochs]
    return Estimate(startup_s=_mean([u.startup_s for u in measured]) or 0.0, close_s=_mean(closes) or 0.0,
                    epoch_s={s: _mean(v) for s, v in by_shape.items()},
                    any_epoch_s=_mean([u.epoch_s for u in measured]))


def remaining_s(unit: Unit, est: Estimate, now: float) -> float | None:
    """Seconds until ``unit`` ends (None: nothing measured to tell): a running unit from its own
    rate, a unit not yet measured or not yet started from ``est``."""
    if unit.ended is not None:
        return 0.0
    if unit.measured:
        return max(0.0, (unit.epochs - unit.done) * unit.epoch_s + est.close_s - (now - unit.last_at))
    epoch_s = est.epoch_of(unit)
    if epoch_s is None:
        return None
    whole = est.startup_s + unit.epochs * epoch_s + est.close_s
    return max(0.0, whole - (now - unit.started)) if unit.started is not None else whole


def sweep_eta(units: Sequence[Unit], slots: int, now: float) -> float | None:
    """Seconds until every unit has ended: running units hold their slots until they end, waiting
    units go in order into the slot that frees first (None until an epoch has been measured)."""
    est = estimate(units)
    running = [u for u in units if u.ended is None and u.started is not None]
    waiting = [u for u in units if u.ended is None and u.started is None]
    free = [remaining_s(u, est, now) for u in running]  # when each slot frees, seconds from now
    if None in free:
        return None
    free += [0.0] * (max(1, slots, len(running)) - len(free))  # an idle slot starts a waiting unit now
    free.sort()
    for u in waiting:
        r = remaining_s(u, est, now)
        if r is None:
            return None
        free[0] += r  # into the slot that frees first
        free.sort()
    return max(free) if free else 0.0


def format_rate(unit: Unit) -> str:
    if unit.images_per_s is None:
        return ""
    each = f"{unit.images_per_s:,.0f} images/s"
    return f", {unit.size} x {each}" if unit.size > 1 else f", {each}"


@dataclass(frozen=True)
class Line:
    text: str
    unit: str
    eta_s: float | None  # the sweep's


class LiveProgress:
    """The throttled live lines. ``reader(names, running) -> list[Unit]`` gives the records of the
    named units (``running``: those Tune runs now; every unit of the sweep: ``units``);
    ``tick(running, now)`` returns the lines due now."""

    def __init__(self, units: Mapping[str, Mapping[str, Any]], reader: Callable[[Sequence[str]], list[Unit]], *,
                 poll_s: float = POLL_S, min_interval_s: float = MIN_INTERVAL_S,
                 max_interval_s: float = MAX_INTERVAL_S):
        # units: name -> {"size": members, "epochs": E, "shape": data set and image size}, in launch order
        self.plan = {n: dict(u) for n, u in units.items()}
        self.reader = reader
        self.poll_s, self.min_interval_s, self.max_interval_s = poll_s, min_interval_s, max_interval_s
        self.known: dict[str, Unit] = {n: Unit(n, u.get("size", 1), u.get("epochs", 0), u.get("shape", ""))
                                       for n, u in self.plan.items()}
        self.slots = 1
        self.polled: float | None = None
        self.shown: dict[str, tuple[float, int]] = {}  # unit -> (time, epoch) of its last line
        self.eta_s: float | None = None

    def poll(self, running: Sequence[str], now: float) -> None:
        """Read the records of the running units (and of those that ran since the last poll)."""
        self.slots = max(self.slots, len(running))
        todo = [n for n in running if n in self.known]
        todo += [n for n, u in self.known.items() if u.started is not None and u.ended is None and n not in todo]
        for unit in self.reader(todo, set(running)):
            if unit.name in self.known:
                self.known[unit.name] = unit
        self.polled = now
        self.eta_s = sweep_eta(list(self.known.values()), self.slots, now)

    def tick(self, running: Sequence[str], now: float) -> list[Line]:
        """The lines due at ``now``; ``running``: the Tune trials running now (their names)."""
        if self.polled is not None and now - self.polled < self.poll_s:
            return []
        self.poll(running, now)
        est = estimate(list(self.known.values()))
        lines = []
        for name in running:
            unit = self.known.get(name)
            if unit is None or unit.ended is not None:
                continue
            at, epoch = self.shown.get(name, (None, -1))
            if unit.measured:
                since = now - at if at is not None else math.inf
                due = (unit.done > epoch and since >= self.min_interval_s) or since >= self.max_interval_s
            else:  # still starting: a line once it has been quiet for MAX_INTERVAL_S
                quiet_since = at if at is not None else unit.started
                due = quiet_since is not None and now - quiet_since >= self.max_interval_s
            if not due:
                continue
            self.shown[name] = (now, unit.done)
            lines.append(Line(self.line(unit, est, now), name, self.eta_s))
        return lines

    def line(self, unit: Unit, est: Estimate, now: float) -> str:
        head = f"[train] {unit.name}" if unit.size == 1 else f"[train] pack {unit.name} ({unit.size} trials)"
        if unit.measured:
            mine = remaining_s(unit, est, now)
            body = f"epoch {unit.done}/{unit.epochs}{format_rate(unit)}, ETA {format_duration(mine)}"
        else:
            body = f"starting ({format_duration(now - unit.started) if unit.started is not None else '?'} so far)"
        total = sum(u.size for u in self.known.values())
        running = sum(1 for u in self.known.values() if u.started is not None and u.ended is None)
        waiting = sum(1 for u in self.known.values() if u.started is None)
        every = (f"all {total} trials: ETA {format_duration(self.eta_s)}" if self.eta_s is not None
                 else f"all {total} trials: ETA after the first epoch")
        counts = f"{running} packs running" if any(u.size > 1 for u in self.known.values()) else f"{running} running"
        return f"{head}: {body}; {every} ({counts}, {waiting} waiting)"


def shape_of(flat: Mapping[str, Any]) -> str:
    """What sets a trial's seconds per epoch among a sweep's trials, roughly: data set and image size."""
    return f"{flat.get('dataset')}@{flat.get('img_size')}/{flat.get('preset')}"


def plan_units(members: Mapping[str, Sequence[str]], flats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
    """name -> {size, epochs, shape} of every Tune trial, from the trials' flat configs."""
    out = {}
    for name, ids in members.items():
        first = flats.get(ids[0], {}) if ids else {}
        out[name] = {"size": len(ids), "epochs": int(first.get("epochs") or 0), "shape": shape_of(first)}
    return out


class RecordReader:
    """``Unit`` records of Tune trials from the ``trials`` rows and ``epochs`` files (one small read
    each per running unit and poll; a unit that ended is not read again)."""

    def __init__(self, results: str, study: str, members: Mapping[str, Sequence[str]],
                 plan: Mapping[str, Mapping[str, Any]]):
        self.results, self.study = results, study
        self.members = {k: list(v) for k, v in members.items()}
        self.plan = {k: dict(v) for k, v in plan.items()}
        self.rows: dict[str, dict] = {}  # member rows once read "running" (its start does not change)
        self.ended: dict[str, Unit] = {}
        # epochs file -> (its mtime, its fields): a file is parsed again only when a trial rewrote it, not
        # at every poll (every 2 s, on the cores the trials train on)
        self.epochs_seen: dict[str, tuple[float | None, dict[str, Any]]] = {}

    def __call__(self, names: Sequence[str], running: set[str] = frozenset()) -> list[Unit]:
        return [self.unit(n, n in running) for n in names if n in self.members]

    def unit(self, name: str, running: bool = False) -> Unit:
        if name in self.ended:
            return self.ended[name]
        plan = self.plan.get(name, {})
        ids = self.members[name]
        cached = [self.rows.get(t) for t in ids]
        if running and all(cached):  # Tune runs it: its rows still say "running"; read its epochs only
            rows = cached
        else:
            rows = [tables.read_trial(self.results, self.study, t) for t in ids]
            for t, r in zip(ids, rows):
                if r is not None and r["status"] == "running" and r.get("started_at") is not None:
                    self.rows[t] = r
        live = [r for r in rows if r is not None]
        base = Unit(name, len(ids), int(plan.get("epochs") or 0), plan.get("shape", ""))
        if not live:
            return base
        started = min((r["started_at"].timestamp() for r in live if r.get("started_at") is not None), default=None)
        open_ids = [r["trial_id"] for r in live if r["status"] == "running"]
        ended = None
        if not open_ids and all(r["status"] != "running" for r in live) and len(live) == len(ids):
            ended = max((r["ended_at"].timestamp() for r in live if r.get("ended_at") is not None), default=None)
        probe = (open_ids or [r["trial_id"] for r in live])[0]
        fs, root = layout.filesystem(layout.table_path(self.results, self.study, "epochs"))
        path = f"{root}/{layout.unit_file(probe)}"
        info = fs.get_file_info(path)
        fields = {}
        if info.size is not None:
            mtime = info.mtime.timestamp() if info.mtime else None
            seen = self.epochs_seen.get(path)
            if seen is not None and mtime is not None and seen[0] == mtime:
                fields = seen[1]
            else:
                epochs = sorted(pq.read_table(path, filesystem=fs).to_pylist(), key=lambda r: r["epoch"])
                fields = epoch_fields(epochs, mtime)
                self.epochs_seen[path] = (mtime, fields)
        unit = Unit(name, len(ids), base.epochs, base.shape, started=started, ended=ended, **fields)
        if ended is not None:
            self.ended[name] = unit
        return unit


def epoch_fields(epochs: Sequence[Mapping[str, Any]], written_at: float | None) -> dict[str, Any]:
    """done, last_at, epoch_s, loop_s, images_per_s from a trial's epochs rows (sorted by epoch) and
    the time their file was written. A retried or resumed trial's rows hold several training loops;
    ``wall_time_s`` restarts with each, so the rate is that of the latest loop."""
    if not epochs or written_at is None:
        return {}
    last = epochs[-1]
    first = len(epochs) - 1
    while first > 0 and (epochs[first - 1]["wall_time_s"] or 0) < (epochs[first]["wall_time_s"] or 0) \
            and epochs[first - 1]["epoch"] == epochs[first]["epoch"] - 1:
        first -= 1
    loop_s = float(last["wall_time_s"] or 0.0)
    span = int(last["epoch"]) - int(epochs[first]["epoch"]) + 1
    return {"done": int(last["epoch"]), "last_at": written_at, "loop_s": loop_s,
            "epoch_s": loop_s / max(1, span) if loop_s > 0 else None, "images_per_s": last.get("images_per_s")}
