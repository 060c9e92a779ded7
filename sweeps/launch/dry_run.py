"""``--dry-run``: the plan of a launch, printed; nothing is started or written.

    vitsweep sweep study_l --dry-run            # summary, GPU-hours, one short line per trial
    vitsweep sweep study_l --dry-run --wide     # every column of every trial, as a table
    vitsweep sweep study_l --dry-run --json     # every trial's full config (with its `pack`), JSON on stdout

The first lines say what the sweep is (``12 conditions x 5 seeds = 60 trials``, its packs, what
every trial shares) and what it costs (``sweeps.launch.estimate``); the list then shows per trial only
what its id does not already say (data set, PE, RPT, protocol and seed are in the id): the fields
that differ between trials, and the pack when trials pack.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from sweeps.launch import estimate
from sweeps.launch.options import build_packs
from sweeps.launch.packs import pack_of
from sweeps.launch.validate import parse_overrides

# The recipe's fields too (optimizer ... cutmix_prob): the factorial trains each image size with its study's.
WIDE = ("trial_id", "dataset", "preset", "pe", "rpt", "protocol", "seed", "epochs", "lr", "optimizer", "decay_exempt",
        "crop_padding", "cutmix_prob")
SHOWN = ("preset", "epochs", "lr")  # beside the id: in the compact list when they differ, else in the summary


def dry_run(args: argparse.Namespace, configs) -> int:
    """Print the plan of ``configs`` (the launch's trials, ``options.build_trials``); 0."""
    packs = build_packs(args, configs)
    pack = pack_of(packs)
    rows = [{**c.to_flat(), "trial_id": c.trial_id, "pack": pack[c.trial_id]} for c in configs]  # built once
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    swept = tuple(k for k in parse_overrides(args.set) if k not in SHOWN)
    print(summary(args.study, rows, packs, swept))
    print(estimate.estimate(configs, packs, estimate.load_table()))
    if getattr(args, "wide", False):
        print_table(rows, (*WIDE, *(k for k in swept if k not in WIDE), "pack"))
    else:
        packed = any(len(p.members) > 1 for p in packs)
        varying = [k for k in (*SHOWN, *swept) if len({str(r[k]) for r in rows}) > 1]
        print_table(rows, ("trial_id", *varying, *(("pack",) if packed else ())))
        print(f"{len(rows)} trials (--dry-run --wide: every column; --json: every field)")
    return 0


def summary(study: str, rows: list[dict], packs, swept=()) -> str:
    """``study_l: 12 conditions x 5 seeds = 60 trials in 60 packs (sizes 1); every trial: preset ...``."""
    seeds = Counter(r["seed"] for r in rows)
    conditions = {tuple(sorted((k, str(v)) for k, v in r.items() if k not in ("seed", "trial_id", "pack")))
                  for r in rows}
    sizes = sorted({len(p.members) for p in packs}, reverse=True)
    shared = [f"{k} {rows[0][k]}" for k in (*SHOWN, *swept) if rows and len({str(r[k]) for r in rows}) == 1]
    line = (f"{study}: {len(conditions)} conditions x {len(seeds)} seed{'s' if len(seeds) != 1 else ''} = "
            f"{len(rows)} trials in {len(packs)} packs "
            f"(sizes {', '.join(map(str, sizes))}); data sets {', '.join(dict.fromkeys(r['dataset'] for r in rows))}")
    return line + (f"; every trial: {', '.join(shared)}" if shared else "")


def print_table(rows: list[dict], cols) -> None:
    """``rows`` as aligned columns ``cols``, with a header line."""
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols} if rows else {c: len(c) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols).rstrip())
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols).rstrip())
