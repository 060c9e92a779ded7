"""The house rules, read from the source: imports flow one way and every module fits in a head.

    sweeps/ -> analysis/ -> trainables/ -> records/

`trainables/` (training) must not depend on the post-hoc analysis or the launcher;
`records/` (what a sweep writes) sits below everything. Imports inside functions
count too: a lazy import is still a dependency. A module's private names (a
leading underscore) are its own: no other module imports them. The checkpoint
layout (file names, snapshot pattern) is named in `trainables/checkpoints.py` only.
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
MAX_ANALYSIS_LINES = 400  # analysis/ by concern: the data model, labels, statistics, claims, tables, page, figures


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


def test_every_analysis_module_fits_in_400_lines():
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in _modules("analysis")
            if (n := len(path.read_text().splitlines())) > MAX_ANALYSIS_LINES]
    assert not long, f"analysis/ modules over {MAX_ANALYSIS_LINES} lines (split them by concern):\n" + "\n".join(long)


def _project_imports(path: Path) -> set[str]:
    """Dotted names of the project modules the file imports, at any depth: ``from analysis import
    figures`` names ``analysis.figures`` (a module), ``from analysis.claims import CLAIMS``
    ``analysis.claims``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PACKAGES:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if _module_path(f"{node.module}.{a.name}") is not None}
    return found


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _import_closure(name: str) -> set[str]:
    """Every project module reachable from ``name`` through imports (lazy ones included)."""
    seen, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module in seen or (path := _module_path(module)) is None:
            continue
        seen.add(module)
        todo += sorted(_project_imports(path) - seen)
    return seen


def test_the_measuring_job_imports_neither_the_report_nor_the_page():
    # The Ray Data job reads the data model (analysis.study_data), never the HTML report.
    closure = _import_closure("analysis.job")
    assert "analysis.study_data" in closure  # the walk reaches it (through trial_record's summary table)
    assert not closure & {"analysis.report", "analysis.page"}, sorted(closure & {"analysis.report", "analysis.page"})


def test_the_closure_follows_lazy_and_from_package_imports():
    closure = _import_closure("analysis.report")
    assert {"analysis.page", "analysis.figures", "analysis.plotting", "records.tracking"} <= closure


def test_no_product_module_uses_the_per_image_reference_pipeline():
    # trainables/reference.py is what the batched path is checked against (tests, bench/), not a second
    # training path: a product module that imported it would train two ways.
    bad = [f"{path.relative_to(ROOT)}" for package in PACKAGES for path in _modules(package)
           if path != ROOT / "trainables" / "reference.py" and "trainables.reference" in _project_imports(path)]
    assert not bad, "only tests and bench/ import trainables.reference:\n" + "\n".join(bad)
    assert "trainables.reference" in _project_imports(ROOT / "bench" / "input_pipeline.py")  # the walk sees it


def test_no_analysis_module_hides_a_module_behind_another_name():
    """``from analysis import claims as numbers`` hid what a reader looks for; an alias may only
    shorten the module's own name (``plotting as pl``)."""
    bad = []
    for path in _modules("analysis"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                for a in node.names:
                    full = f"{module}.{a.name}" if module else a.name
                    if a.asname and full.split(".")[0] in PACKAGES and _module_path(full) is not None \
                            and not full.rsplit(".", 1)[-1].startswith(a.asname):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {full} as {a.asname}")
    assert not bad, "import the module under its own name:\n" + "\n".join(bad)


def test_the_walk_sees_lazy_imports(tmp_path):
    # The rule would be toothless if imports inside functions were missed.
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from analysis import tables\n    import sweeps.run\n")
    assert {name for name, _ in _imported_packages(module)} == {"analysis", "sweeps"}


def _underscore_imports(path: Path) -> list[tuple[str, int]]:
    """(module.name, line) of every private name (a leading underscore) imported from another module
    of the project, at any depth: `from records.tables import _write` or `import trainables._x`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if any(part.startswith("_") and not part.startswith("__") for part in node.module.split(".")):
                private.append("*")
            found += [(f"{node.module}.{name}", node.lineno) for name in private]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] in PACKAGES
                      and any(p.startswith("_") and not p.startswith("__") for p in a.name.split("."))]
    return found


def test_no_module_imports_another_modules_private_names():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for package in PACKAGES for path in _modules(package)
           for name, line in _underscore_imports(path)]
    assert not bad, "private names stay in their module (make them public, or move the code):\n" + "\n".join(bad)


def test_benchmarks_use_public_names_only():
    # A benchmark measures the product as a user calls it: a private name it imported could change
    # under it without a test noticing.
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for path in sorted((ROOT / "bench").glob("*.py")) for name, line in _underscore_imports(path)]
    assert not bad, "bench/ imports public names only:\n" + "\n".join(bad)


def test_the_walk_sees_private_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from ray._private import ray_constants\nfrom os import _exit\n"
                      "def f():\n    from trainables.ray_trial import _Worker, run_trial\n"
                      "    import records._hidden\n")
    assert [name for name, _ in _underscore_imports(module)] == ["trainables.ray_trial._Worker", "records._hidden"]


def test_the_checkpoint_layout_is_named_in_one_module():
    """The checkpoint file's name and the snapshot pattern live in trainables/checkpoints.py only."""
    owner = ROOT / "trainables" / "checkpoints.py"
    bad = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
           for package in PACKAGES for path in _modules(package) if path != owner
           for n, line in enumerate(path.read_text().splitlines(), 1)
           if "state.pt" in line or "epoch_*" in line or r"epoch_(\d" in line or "epoch_{epoch:04d}.pt" in line]
    assert not bad, "name checkpoint files through trainables.checkpoints:\n" + "\n".join(bad)
