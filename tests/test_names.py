"""`--help` lists the valid names without importing torch: the torch-free copy matches the registries."""

from __future__ import annotations

import json
import subprocess
import sys

from sweeps import names

HEAVY = ("torch", "torchvision", "matplotlib", "mlflow", "ray")


def test_names_match_the_real_registries():
    from trainables.datasets import DATASETS
    from trainables.pos_embed import POS_EMBEDS
    from trainables.protocols import PROTOCOLS
    from trainables.vit import PRESETS

    assert names.PES == tuple(POS_EMBEDS)
    assert names.PROTOCOLS == tuple(PROTOCOLS)
    assert names.DATASETS == tuple(DATASETS)
    assert names.PRESETS == tuple(PRESETS)


def test_help_imports_no_heavy_library_and_lists_the_names():
    # A fresh interpreter per command: what help imports is what a user waits for.
    probe = (
        "import contextlib, io, json, sys\n"
        "from sweeps import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    cli.main(sys.argv[1:])\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'help': out.getvalue()}))\n"
    )
    for argv in (["--help"], ["sweep", "--help"], ["analyze", "--help"], ["report", "--help"], ["status", "--help"]):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["heavy"] == [], f"vitsweep {' '.join(argv)} imported {result['heavy']}"
        assert "usage:" in result["help"]
    sweep_help = subprocess.run([sys.executable, "-c", probe, "sweep", "--help"], capture_output=True, text=True,
                                timeout=120).stdout
    for name in (*names.STUDIES, *names.PES, *names.DATASETS, *names.PRESETS, "autoaugment+cutmix"):
        assert name in sweep_help, f"{name!r} missing from `vitsweep sweep --help`"
