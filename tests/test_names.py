"""`--help` lists the valid names without importing torch: the torch-free copy matches the registries."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from records import names as vocabulary
from sweeps import names

ROOT = Path(__file__).resolve().parent.parent

HEAVY = ("torch", "torchvision", "matplotlib", "mlflow", "ray")


def test_names_match_the_real_registries():
    from trainables.datasets import DATASETS
    from trainables.pos_embed import POS_EMBEDS
    from trainables.protocols import PROTOCOLS
    from trainables.vit import PRESETS

    assert names.PES == vocabulary.PES == tuple(POS_EMBEDS)  # in registry order: the report's PE order
    assert names.PROTOCOLS == tuple(PROTOCOLS)
    assert names.DATASETS == tuple(DATASETS)
    assert names.PRESETS == tuple(PRESETS)


def _string_collections(path: Path) -> list[tuple[int, set[str]]]:
    """(line, strings) of every tuple, list, set or dict-key literal of two or more strings in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and items:
            strings = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
            if len(strings) >= 2:
                found.append((node.lineno, strings))
    return found


def test_no_product_module_copies_the_pe_names():
    """A new PE: its class, its registry line and its torch-free name; no other list of PE names to update.
    Allowed: the colour map (analysis/plotting.py, with a default for unseen names), the papers' numbers
    (analysis/claims.py) and the studies' grids (sweeps/<study>.py): each picks PEs, none lists them all."""
    pes = set(vocabulary.PES)
    allowed = {ROOT / "records" / "names.py", ROOT / "trainables" / "pos_embed.py", ROOT / "analysis" / "plotting.py",
               ROOT / "analysis" / "claims.py", *(ROOT / "sweeps" / f"{study}.py" for study in names.STUDIES)}
    copies = [f"{path.relative_to(ROOT)}:{line} {sorted(strings & pes)}"
              for package in ("sweeps", "analysis", "trainables", "records")
              for path in sorted((ROOT / package).rglob("*.py")) if path not in allowed
              for line, strings in _string_collections(path) if len(strings & pes) >= 2]
    assert copies == [], "PE names listed outside the registry and records.names:\n" + "\n".join(copies)


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
    top_help = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True,
                              timeout=120).stdout
    for name in (*names.STUDIES, *names.PES, *names.DATASETS, *names.PRESETS, *names.PROTOCOLS):
        assert name in top_help, f"{name!r} missing from `vitsweep --help`"
    sweep_help = subprocess.run([sys.executable, "-c", probe, "sweep", "--help"], capture_output=True, text=True,
                                timeout=120).stdout
    for name in (*names.STUDIES, *names.PES, *names.DATASETS, *names.PRESETS, "autoaugment+cutmix"):
        assert name in sweep_help, f"{name!r} missing from `vitsweep sweep --help`"
