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


def _study_name_comparisons(path: Path, studies) -> list[tuple[int, str]]:
    """(line, code) of every comparison in the file (==, !=, in, not in, is, a match case) with a study's
    name as a string constant on either side, or with ``args.study`` against any string constant."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def strings(node) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    def is_study_attr(node) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr == "study" for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = set().union(*(strings(s) for s in sides))
            if consts & set(studies) or (consts and any(is_study_attr(s) for s in sides)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.match_case) and strings(node.pattern) & set(studies):
            found.append((node.pattern.lineno, ast.unparse(node.pattern)))
    return found


def test_the_launcher_compares_no_study_name():
    """A study declares what it does differently in its hooks (sweeps/study.py); the launcher's stages
    never test which study runs."""
    from sweeps import STUDIES

    bad = _study_name_comparisons(ROOT / "sweeps" / "run.py", STUDIES)
    assert not bad, "sweeps/run.py compares study names (declare a hook instead):\n" + "\n".join(
        f"sweeps/run.py:{line}: {code}" for line, code in bad)
    constants = {n.value for n in ast.walk(ast.parse((ROOT / "sweeps" / "run.py").read_text()))
                 if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not constants & set(STUDIES), f"sweeps/run.py names studies: {sorted(constants & set(STUDIES))}"


def test_the_study_name_check_sees_comparisons(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('if args.study == "hparam":\n    pass\nok = "x" in y\nbad = args.study in ("a", "b")\n'
                      'also = "factorial" != name\nmatch s:\n    case "pilot":\n        pass\n')
    assert [line for line, _ in _study_name_comparisons(module, ("hparam", "factorial", "pilot"))] == [1, 4, 5, 7]
