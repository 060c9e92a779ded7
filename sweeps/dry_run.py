"""``--dry-run``: the plan of a launch, printed; nothing is started or written.

    vitsweep sweep study_l --dry-run            # the trial table, its count and the GPU-hour estimate
    vitsweep sweep study_l --dry-run --json     # every trial's full config (with its `pack`), JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import sys

from sweeps.options import build_packs, build_trials


def dry_run(args: argparse.Namespace) -> int:
    from sweeps.packs import pack_of

    configs = build_trials(args)
    packs = build_packs(args, configs)
    if args.json:
        pack = pack_of(packs)
        json.dump([{**c.to_flat(), "trial_id": c.trial_id, "pack": pack[c.trial_id]} for c in configs],
                  sys.stdout, indent=1)
        print()
    else:
        from sweeps import estimate

        print_table(configs, packs=packs)
        print(estimate.estimate(configs, packs, estimate.load_table()))
    return 0


def print_table(configs, stream=None, packs=None) -> None:
    from sweeps.packs import pack_of

    stream = stream or sys.stdout  # looked up per call, so a redirected stdout is honoured

    cols = ("trial_id", "dataset", "preset", "pe", "rpt", "protocol", "seed", "epochs", "lr")
    rows = [{**c.to_flat(), "trial_id": c.trial_id} for c in configs]
    if packs is not None:
        cols += ("pack",)
        pack = pack_of(packs)
        rows = [{**r, "pack": pack[r["trial_id"]]} for r in rows]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols} if rows else {c: len(c) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols), file=stream)
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols), file=stream)
    if packs is None:
        print(f"{len(rows)} trials", file=stream)
    else:
        sizes = sorted({len(p.members) for p in packs}, reverse=True)
        print(f"{len(rows)} trials in {len(packs)} packs (sizes {', '.join(map(str, sizes))})", file=stream)
