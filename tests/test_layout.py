"""The house rules, read from the source: imports flow one way and every module fits in a head.

    sweeps/ -> analysis/ -> trainables/ -> records/

`trainables/` (training) must not depend on the post-hoc analysis or the launcher;
`records/` (what a sweep writes) sits below everything. Imports inside functions
count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sweeps", "analysis", "trainables", "records")
FORBIDDEN = {  # package -> packages it must not import
    "records": {"sweeps", "analysis", "trainables"},
    "trainables": {"sweeps", "analysis"},
    "analysis": {"sweeps"},
    "sweeps": set(),
}
MAX_LINES = 600


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    """(top-level package, line) of every import in the file, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_flow_one_way(package):
    assert _modules(package), f"no modules found under {package}/"
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for path in _modules(package)
           for name, line in sorted(_imported_packages(path))
           if name in FORBIDDEN[package]]
    assert not bad, f"{package}/ must not import {sorted(FORBIDDEN[package])}:\n" + "\n".join(bad)


def test_every_module_fits_in_a_head():
    long = [f"{path.relative_to(ROOT)}: {n} lines"
            for package in PACKAGES for path in _modules(package)
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(long)


def test_the_walk_sees_lazy_imports(tmp_path):
    # The rule would be toothless if imports inside functions were missed.
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from analysis import tables\n    import sweeps.run\n")
    assert {name for name, _ in _imported_packages(module)} == {"analysis", "sweeps"}
