"""The house rules, read from the source: the rooms, their floors, and every module fits in a head.

Each top-level package is a set of rooms (sub-packages, one concern each), and the floors run one way,
top to bottom (``FLOORS``): a module imports only from its own room or a room below it.

    sweeps/ (run.py, cli.py) -> sweeps/launch/ -> sweeps/studies/
      -> analysis/reporting/ -> analysis/statistics/ -> analysis/measuring/
      -> trainables/trial/ -> trainables/loop/ -> trainables/model/ -> trainables/data/ -> trainables/config/
      -> records/

`trainables/config/` (what a trial is, as data) imports nothing but the standard library and
`records.vocab`, so the launcher's checks never load torch. Imports inside functions count too: a lazy
import is still a dependency, and no circle closes at any depth (annotation-only imports under
``TYPE_CHECKING`` are not run). A module's private names (a leading underscore) are its own: no other
module imports them. The checkpoint layout (file names, snapshot pattern) is named in
`trainables/loop/checkpoints.py` only. The registries' names, the protocol switches, the did-not-learn
rule and the headline severities are defined in `records/vocab.py` only (standard library imports
only), and no other module lists two registry names but the registries, the studies' grids and the
papers' numbers. Every results path and the test for a URI are `records/layout.py`'s.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sweeps", "analysis", "trainables", "records")
# Every room, top floor first. A package's own top-level modules (sweeps/run.py, sweeps/cli.py) are
# its top room; records/ is one room, the ground floor.
FLOORS = ("sweeps", "sweeps.launch", "sweeps.studies",
          "analysis.reporting", "analysis.statistics", "analysis.measuring",
          "trainables.trial", "trainables.loop", "trainables.model", "trainables.data", "trainables.config",
          "records")
SPEC = "trainables.config"
SPEC_MAY_IMPORT = {"records.vocab", "PIL"}  # besides the standard library and the spec (PIL: image headers)
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


def _module_name(path: Path) -> str:
    return str(path.relative_to(ROOT).with_suffix("")).replace("/", ".").removesuffix(".__init__")


def _room(name: str) -> str:
    """The room a module lives in: the longest of ``FLOORS`` it sits under."""
    return max((room for room in FLOORS if name == room or name.startswith(room + ".")), key=len)


LOBBIES = ("analysis", "trainables")  # packages that are only their rooms (a docstring in __init__.py)


def _roomed_modules() -> list[Path]:
    return [path for package in PACKAGES for path in _modules(package)
            if _module_name(path) not in LOBBIES]


def test_every_module_lives_in_a_room():
    # A module left at a package's top would be a room of its own that no floor names.
    tops = {"sweeps": {"__init__", "run", "cli"}, "analysis": {"__init__"}, "trainables": {"__init__"},
            "records": None}
    bad = [str(path.relative_to(ROOT)) for package, allowed in tops.items() if allowed is not None
           for path in _modules(package) if path.parent == ROOT / package and path.stem not in allowed]
    assert not bad, "modules outside a room (move them into one of FLOORS):\n" + "\n".join(bad)
    rooms = {_room(_module_name(path)) for path in _roomed_modules()}
    assert rooms == set(FLOORS), f"rooms without modules or unnamed: {rooms ^ set(FLOORS)}"
    # analysis/ and trainables/ are their rooms only: their __init__ says so and holds nothing else
    assert all(ast.get_docstring(tree := ast.parse((ROOT / package / "__init__.py").read_text()))
               and len(tree.body) == 1 for package in LOBBIES)


def test_rooms_import_from_their_own_floor_and_below():
    rank = {room: i for i, room in enumerate(FLOORS)}
    bad = []
    for path in _roomed_modules():
        here = _room(_module_name(path))
        bad += [f"{path.relative_to(ROOT)} ({here}) imports {other} ({_room(other)})"
                for other in sorted(_project_imports(path)) if rank[_room(other)] < rank[here]]
    assert not bad, "imports up a floor (FLOORS, top first):\n" + "\n".join(bad)


def test_the_spec_imports_no_torch_ray_or_mlflow_nor_anything_above_it():
    # What a trial is, as data: the launcher's checks, --help and a dry run read it without torch.
    bad = []
    for path in sorted((ROOT / SPEC.replace(".", "/")).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" if _module_path(f"{node.module}.{a.name}") else node.module
                 for a in node.names] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names
                    if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
                    and name not in SPEC_MAY_IMPORT and name.split(".")[0] not in SPEC_MAY_IMPORT
                    and not (name.split(".")[0] in PACKAGES and _room(name) == SPEC)]
    assert not bad, f"{SPEC} imports only the standard library, {sorted(SPEC_MAY_IMPORT)} and itself:\n" + \
        "\n".join(bad)


def test_the_docs_layout_names_every_room_and_every_module():
    layout = (ROOT / "docs" / "operations.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing = [room for room in FLOORS if f"`{room.replace('.', '/')}/`" not in layout]
    missing += [str(path.relative_to(ROOT)) for path in _roomed_modules()
                if path.stem != "__init__" and f"`{path.name}`" not in layout and f"`{path.stem}`" not in layout]
    assert not missing, "docs/operations.md's layout section does not name:\n" + "\n".join(missing)


def test_every_module_fits_in_a_head():
    long = [f"{path.relative_to(ROOT)}: {n} lines"
            for package in PACKAGES for path in _modules(package)
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(long)


def test_every_analysis_module_fits_in_400_lines():
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in _modules("analysis")
            if (n := len(path.read_text().splitlines())) > MAX_ANALYSIS_LINES]
    assert not long, f"analysis/ modules over {MAX_ANALYSIS_LINES} lines (split them by concern):\n" + "\n".join(long)


def _project_imports(path: Path, *, annotations: bool = True) -> set[str]:
    """Dotted names of the project modules the file imports, at any depth: ``from analysis import
    figures`` names ``analysis.figures`` (a module), ``from analysis.statistics.claims import CLAIMS``
    ``analysis.statistics.claims``. ``annotations=False`` leaves out the imports under ``if TYPE_CHECKING``
    (never run, so no circle)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = set() if annotations else {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                                         and ast.unparse(block.test).endswith("TYPE_CHECKING")
                                         for n in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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


def test_the_measuring_job_imports_neither_the_statistics_nor_the_report():
    # Every Ray Data actor imports the job's module: the data model's stack (pandas, SciPy) and the report's
    # stay out of it; the launch's analyze stage writes the summary table (sweeps.run.analyze_stage).
    closure = _import_closure("analysis.measuring.job")
    assert "analysis.measuring.evaluate" in closure  # the walk reaches the measurement (a lazy import)
    assert not {_room(name) for name in closure} & {"analysis.statistics", "analysis.reporting"}, sorted(closure)


@pytest.mark.parametrize("module", ["analysis.measuring.evaluate", "analysis.measuring.trial_record"])
def test_measuring_a_checkpoint_needs_neither_the_data_model_nor_the_loops_protocols_nor_the_reports_plots(module):
    # What a Ray Data actor runs on one checkpoint: the measurement and its MLflow record, whose figure
    # is drawn on the shared canvas (analysis.measuring.canvas), not with the report's plot helpers.
    reached = _import_closure(module) & {"analysis.statistics.study_data", "trainables.data.protocols",
                                         "analysis.reporting.report", "analysis.reporting.plotting",
                                         "analysis.reporting.figures"}
    assert not reached, sorted(reached)


def test_the_checkpoint_figure_and_the_reports_figures_share_one_canvas():
    assert "analysis.measuring.canvas" in (_import_closure("analysis.measuring.trial_record")
                                           & _import_closure("analysis.reporting.plotting"))


def test_the_closure_follows_lazy_and_from_package_imports():
    closure = _import_closure("analysis.reporting.report")
    assert {"analysis.reporting.page", "analysis.reporting.figures", "analysis.reporting.plotting",
            "records.tracking"} <= closure


def _import_cycles() -> list[list[str]]:
    """Every import circle among the product's modules, imports inside functions included, as the modules on it."""
    graph = {f"{path.relative_to(ROOT).with_suffix('')}".replace("/", ".").removesuffix(".__init__"): path
             for package in PACKAGES for path in _modules(package)}
    edges = {name: sorted(_project_imports(path, annotations=False) & set(graph) - {name})
             for name, path in graph.items()}
    cycles, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for other in edges[name]:
            if state.get(other) == "open":
                path = stack + [name]
                cycles.append(path[path.index(other):])
            elif other not in state:
                visit(other, stack + [name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    return cycles


MAX_IMPORTS_IN_FUNCTIONS = 74
MODULE_NOTE = "# Imports inside functions:"  # a module's one note for all of its own


def _inner_imports(path: Path) -> list[ast.stmt]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted({node.lineno: node for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}.values(),
                  key=lambda node: node.lineno)


def _unexplained_inner_imports(path: Path) -> list[int]:
    """Lines of the imports inside functions that say nothing of why: no comment on the import or its run
    of adjacent imports or the line above that run, and no ``MODULE_NOTE`` in the module."""
    lines = path.read_text().splitlines()
    if any(line.startswith(MODULE_NOTE) for line in lines):
        return []
    imports = {n: node for node in _inner_imports(path) for n in range(node.lineno, node.end_lineno + 1)}
    bad = []
    for node in _inner_imports(path):
        first, last = node.lineno, node.end_lineno
        while first - 1 in imports:
            first = imports[first - 1].lineno
        while last + 1 in imports:
            last = imports[last + 1].end_lineno
        if not any("#" in lines[n - 1] for n in range(first, last + 1)) and \
                not lines[first - 2].strip().startswith("#"):
            bad.append(node.lineno)
    return bad


def test_an_import_inside_a_function_says_why_it_is_there():
    # An import inside a function hides a dependency from the reader; it earns its place only where it keeps
    # torch, Ray or MLflow (or the report's stack) out of a path that does not need them, and says so.
    found = [(path, node.lineno) for package in PACKAGES for path in _modules(package)
             for node in _inner_imports(path)]
    assert len(found) <= MAX_IMPORTS_IN_FUNCTIONS, len(found)
    bad = [f"{path.relative_to(ROOT)}:{line}" for package in PACKAGES for path in _modules(package)
           for line in _unexplained_inner_imports(path)]
    assert not bad, f"imports inside functions without a reason (a comment, or the module's {MODULE_NOTE!r} " \
                    "note):\n" + "\n".join(bad)


def test_the_reason_walk_sees_a_bare_inner_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import torch  # heavy\n    import ray\n\n\ndef g():\n    x = 1\n"
                      "    import mlflow\n")
    assert _unexplained_inner_imports(module) == [8]
    module.write_text(f"{MODULE_NOTE} all of them heavy\n" + module.read_text())
    assert _unexplained_inner_imports(module) == []


def test_the_product_has_no_import_circle():
    # A circle makes what a module holds depend on which of the two was imported first.
    assert _import_cycles() == []


def test_the_circle_walk_sees_a_circle(tmp_path, monkeypatch):
    # b's import is lazy (inside a function), and c's back to a is for annotations only: no circle.
    for name, body in (("a", "from trainables import b\nimport trainables.c\n"),
                       ("b", "def f():\n    import trainables.a\n"),
                       ("c", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import trainables.a\n")):
        (tmp_path / "trainables").mkdir(exist_ok=True)
        (tmp_path / "trainables" / f"{name}.py").write_text(body)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _import_cycles() == [["trainables.a", "trainables.b"]]


def test_no_product_module_re_exports_a_name():
    """Each name has one home: a module imports only what it reads. An import kept for others to import
    from it (a re-export, often marked ``noqa: F401``) gives a name a second home."""
    bad = []
    for package in PACKAGES:
        for path in _modules(package):
            source = path.read_text()
            tree = ast.parse(source, filename=str(path))
            read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.asname or alias.name} and never reads it"
                    for node in ast.walk(tree)
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", "") != "__future__"
                    for alias in node.names if (alias.asname or alias.name.split(".")[0]) not in read]
            bad += [f"{path.relative_to(ROOT)}:{n}: noqa: F401" for n, line in enumerate(source.splitlines(), 1)
                    if "noqa: F401" in line]
    assert not bad, "re-exports (import the name from its home instead):\n" + "\n".join(bad)


# What tests (and bench/) need but no launch runs: the per-image pipeline the batched augmentation is
# checked against (in a product package it would be a second training path) and a local MLflow server.
TEST_HELPERS = ("reference.py", "server.py")


def test_test_helpers_live_with_the_tests():
    bad = [str(path.relative_to(ROOT)) for package in PACKAGES for path in _modules(package)
           if path.name in TEST_HELPERS]
    assert not bad, "test helpers belong in tests/:\n" + "\n".join(bad)
    assert all((ROOT / "tests" / name).is_file() for name in TEST_HELPERS)


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
                      "def f():\n    from trainables.trial.ray_trial import _Worker, run_trial\n"
                      "    import records._hidden\n")
    assert [name for name, _ in _underscore_imports(module)] == ["trainables.trial.ray_trial._Worker",
                                                                 "records._hidden"]


def test_the_checkpoint_layout_is_named_in_one_module():
    """The checkpoint file's name and the snapshot pattern live in trainables/loop/checkpoints.py only."""
    owner = CHECKPOINTS
    bad = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
           for package in PACKAGES for path in _modules(package) if path != owner
           for n, line in enumerate(path.read_text().splitlines(), 1)
           if "state.pt" in line or "epoch_*" in line or r"epoch_(\d" in line or "epoch_{epoch:04d}.pt" in line]
    assert not bad, "name checkpoint files through trainables.loop.checkpoints:\n" + "\n".join(bad)


# -- one vocabulary --------------------------------------------------------------------------------
# The PE and protocol names, the protocol switches, the did-not-learn rule, the headline severities live in
# records/vocab.py only; a data set's or a preset's name is its row's key (trainables/config/data_roots.py,
# trainables/config/architecture.py); the results-path rule: records/layout.py.
VOCABULARY = ROOT / "records" / "vocab.py"
# The studies' grids pick names from the vocabulary: that is what a study is.
GRIDS = {ROOT / "sweeps" / "studies" / f"{name}.py"
         for name in ("study_l", "study_p", "factorial", "hparam", "demo", "pilot")}
# Literals that are a registry or the registry's own per-entry contents, keyed by the name they are assigned to.
OWNED = {
    ("trainables/model/pos_embed.py", "POS_EMBEDS"), ("trainables/data/formats.py", "LOADERS"),
    ("trainables/config/architecture.py", "PRESETS"),
    ("trainables/config/architecture.py", "PE_QUARTERS"),  # each PE's geometry rule, torch-free
    # A data set's file format, how to obtain it and its published statistics: the loaders' own facts.
    ("trainables/data/formats.py", "_CIFAR"),
    ("trainables/config/data_roots.py", "DATASET_SPECS"),  # each set's one row, torch-free
    ("sweeps/studies/__init__.py", "STUDIES"),  # study names: two of them are also preset names
    # The colour map, keyed by vocabulary names, with a colour for names it has not seen.
    ("analysis/reporting/plotting.py", "PE_COLOURS"), ("analysis/reporting/plotting.py", "PROTOCOL_COLOURS"),
}
# The papers' reported numbers (in whichever analysis module holds them), keyed by what the papers
# name: a model (`ape`, `ape + RPT`) or a protocol; test_the_papers_numbers_use_the_vocabularys_names
# checks every key is one the vocabulary holds.
PAPER_TABLES = {"PAPER_P_MODELS": "model", "PAPER_L_MIN_MAD": "protocol"}
PENDING_LITERALS: set = set()
PENDING_DEFINITIONS: set = set()
# Defined in records/vocab.py, nowhere else (a second definition is a copy that can drift).
VOCABULARY_DEFINITIONS = (
    "PES", "PROTOCOLS", "SETTINGS", "SWITCHES", "MODERN", "CLS_SINK_MASS", "canonical_protocol",
    "protocol_switches", "protocol_name", "EXECUTION_FIELDS", "CHANCE_MARGIN", "did_not_learn", "JPEG_HEADLINE",
    "BLUR_HEADLINE", "HEADLINE_JPEG_QUALITY", "HEADLINE_BLUR_SIGMA", "DATASET_SIZES", "TEST_SPLIT_IMAGES",
    "TRAIN_IMAGES",
)


def _vocabulary():
    from records import vocab

    return vocab


def _registry_names() -> tuple[set[str], set[str]]:
    """(every registry name, the switch names): a switch name is also a run-config field's name."""
    from trainables.config.architecture import PRESETS
    from trainables.config.data_roots import DATASET_SPECS

    vocab = _vocabulary()
    return {*vocab.PES, *vocab.PROTOCOLS, *DATASET_SPECS, *PRESETS}, set(vocab.SWITCHES)


def _owners(tree: ast.AST) -> dict[int, str]:
    """id(node) -> the name its enclosing assignment binds (the innermost), for every node under one."""
    owner = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = next((t.id for t in targets if isinstance(t, ast.Name)), None)
            if name is not None:
                owner.update({id(sub): name for sub in ast.walk(node.value)})
    return owner


def _name_collections(path: Path) -> list[tuple[int, str | None, list[str]]]:
    """(line, assigned-to name, registry names) of every tuple, list, set or dict-key literal naming two or
    more registry names. Switch names (`autoaugment`, `cutmix`, `label_smoothing`) are also run-config
    fields: they count only in a literal that names another protocol (so a list of fields is no copy)."""
    names, switches = _registry_names()
    tree = ast.parse(path.read_text(), filename=str(path))
    owner, found = _owners(tree), []
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) or not items:
            continue
        strings = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)} & names
        if not strings & (set(_vocabulary().PROTOCOLS) - switches):
            strings -= switches
        if len(strings) >= 2:
            found.append((node.lineno, owner.get(id(node)), sorted(strings)))
    return found


def test_registry_names_are_listed_in_the_vocabulary_only():
    """A new PE or protocol: its registry line and its vocabulary name; a data set or preset: its row; no other list."""
    bad = []
    for package in PACKAGES:
        for path in _modules(package):
            if path == VOCABULARY or path in GRIDS:
                continue
            rel = str(path.relative_to(ROOT))
            bad += [f"{rel}:{line} {owner}: {names}" for line, owner, names in _name_collections(path)
                    if (rel, owner) not in OWNED | PENDING_LITERALS and owner not in PAPER_TABLES]
    assert not bad, "registry names listed outside records/vocab.py and the rows (read them there):\n" + "\n".join(bad)


def test_the_name_walk_sees_copies_and_not_field_lists(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('ORDER = ("ape", "rope2d")\nFIELDS = ("seed", "autoaugment", "cutmix")\n'
                      'def f():\n    return {"baseline": 1, "cutmix": 2}\n')
    assert [(line, names) for line, _, names in _name_collections(module)] == [
        (1, ["ape", "rope2d"]), (4, ["baseline", "cutmix"])]


def test_the_papers_numbers_use_the_vocabularys_names():
    """Every key of a papers' table is a model (`<pe>`, `<pe> + RPT`) or a protocol the vocabulary holds."""
    vocab = _vocabulary()
    valid = {"model": {*vocab.PES, *(f"{pe} + RPT" for pe in vocab.PES)}, "protocol": set(vocab.PROTOCOLS)}
    found, bad = set(), []
    for package in PACKAGES:
        for path in _modules(package):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                table = node.targets[0].id if isinstance(node, ast.Assign) and isinstance(
                    node.targets[0], ast.Name) else None
                if table in PAPER_TABLES and isinstance(node.value, ast.Dict):
                    found.add(table)
                    keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
                    bad += [f"{path.relative_to(ROOT)}:{node.lineno} {table} {k!r}" for k in keys
                            if k not in valid[PAPER_TABLES[table]]]
    assert found == set(PAPER_TABLES), f"not found: {set(PAPER_TABLES) - found} (moved or renamed? update PAPER_TABLES)"
    assert not bad, "the papers' numbers name what the vocabulary does not:\n" + "\n".join(bad)


def _definitions(path: Path) -> set[str]:
    """Names the module binds at its top level (assignments, functions, classes)."""
    out = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                out |= {e.id for e in ast.walk(t) if isinstance(e, ast.Name)}
    return out


def test_the_vocabulary_is_defined_once():
    bad = [f"{rel} defines {name}"
           for package in PACKAGES for path in _modules(package)
           if path != VOCABULARY and path not in GRIDS  # a grid's own pick (study_p's PES) is its choice
           for rel in [str(path.relative_to(ROOT))]
           for name in sorted(_definitions(path) & set(VOCABULARY_DEFINITIONS))
           if (rel, name) not in PENDING_DEFINITIONS and not _is_registry(rel, name)]
    assert not bad, "import these from records.vocab:\n" + "\n".join(bad)
    assert set(VOCABULARY_DEFINITIONS) - {"HEADLINE_JPEG_QUALITY", "HEADLINE_BLUR_SIGMA", "TEST_SPLIT_IMAGES",
                                          "TRAIN_IMAGES", "DATASET_SIZES"} <= _definitions(VOCABULARY)


def _is_registry(rel: str, name: str) -> bool:
    """The protocol registry shares its vocabulary's name (`PROTOCOLS`): the real table."""
    return (rel, name) == ("trainables/data/protocols.py", "PROTOCOLS")


# -- one storage layout ----------------------------------------------------------------------------
LAYOUT = ROOT / "records" / "layout.py"


def _is_study(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id.endswith(("study", "study_name"))) or (
        isinstance(node, ast.Attribute) and node.attr == "study")


def _layout_rules(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every test for "://" (`"://" in x`) and every path built under a study: an
    f-string with a study between slashes, `os.path.join(..., study, ...)` or `path / study`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                isinstance(c, ast.Constant) and c.value == "://" for c in [node.left, *node.comparators]):
            found.append((node.lineno, 'a "://" test'))
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for i, part in enumerate(parts):
                beside = [p.value for p in parts[max(i - 1, 0):i + 2:2] if isinstance(p, ast.Constant)]
                if isinstance(part, ast.FormattedValue) and _is_study(part.value) and any(
                        b.startswith("/") or b.endswith("/") for b in beside):
                    found.append((node.lineno, "a <root>/<study> f-string"))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "join" \
                and any(_is_study(a) for a in node.args[1:]):
            found.append((node.lineno, "a join under a study"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_study(node.right):
            found.append((node.lineno, "a Path / study"))
    return found


def test_only_the_layout_builds_results_paths_or_tests_for_a_uri():
    bad = [f"{path.relative_to(ROOT)}:{line}: {what}" for package in PACKAGES for path in _modules(package)
           if path != LAYOUT for line, what in _layout_rules(path)]
    assert not bad, "name results paths through records.layout:\n" + "\n".join(bad)
    assert len(_layout_rules(LAYOUT)) >= 2  # the walk sees the real thing


def test_the_layout_walk_sees_each_form(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('import os\nfrom pathlib import Path\n'
                      'a = "://" in uri\nb = f"{results.rstrip(\'/\')}/{study}/logs"\n'
                      'c = os.path.join(results, args.study, "logs")\nd = Path(results) / study_name\n'
                      'e = f"{study}-report"\n')
    assert [line for line, _ in _layout_rules(module)] == [3, 4, 5, 6]


def test_the_vocabulary_imports_only_the_standard_library():
    import sys

    imported = {name for name, _ in _imported_packages(VOCABULARY)} - {"__future__"}
    assert imported <= set(sys.stdlib_module_names), imported


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
    """A study declares what it does differently in its hooks (sweeps/studies/study.py); the launcher's stages
    never test which study runs."""
    from sweeps.studies import STUDIES

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


# -- a loop that reads top to bottom -------------------------------------------------------------------
LOOP = ROOT / "trainables" / "loop" / "train.py"
CHECKPOINTS = ROOT / "trainables" / "loop" / "checkpoints.py"
# What a checkpoint holds (trainables/loop/checkpoints.py builds and reads the dict). "epoch" and "history" are
# left out: the per-epoch metrics and a trial's final dict carry keys of those names too.
CHECKPOINT_KEYS = {"model", "optimizer", "scheduler", "torch_rng", "python_rng", "cuda_rng", "config"}


def test_the_loop_fits_in_a_head():
    tree = ast.parse(LOOP.read_text())
    (train_pack,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "train_pack"]
    lines, body = len(LOOP.read_text().splitlines()), train_pack.end_lineno - train_pack.lineno + 1
    assert lines <= 450, (f"trainables/loop/train.py has {lines} lines "
                          "(at most 450: the step, optimiser, retry live apart)")
    assert body <= 100, f"train_pack has {body} lines (at most 100: name its stages as functions)"


def _checkpoint_key_uses(path: Path) -> list[tuple[int, str]]:
    """(line, key) of every checkpoint key used as a subscript, a dict literal's key or a `.get` argument."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            keys = node.args[:1]
        else:
            continue
        found += [(node.lineno, k.value) for k in keys if isinstance(k, ast.Constant) and k.value in CHECKPOINT_KEYS]
    return found


def _file_reads_and_writes(path: Path) -> list[tuple[int, str]]:
    """(line, call) of every `torch.save/load` and `checkpoints.save/load` (or `save`/`load` imported from it)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "trainables.loop.checkpoints" for a in node.names if a.name in ("save", "load")}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr in ("save", "load") and isinstance(f.value, ast.Name)
                    and f.value.id in ("torch", "checkpoints")) or (isinstance(f, ast.Name) and f.id in imported):
                found.append((node.lineno, ast.unparse(f)))
    return found


def test_the_checkpoint_dict_is_built_and_read_in_checkpoints_only():
    """Other modules hand checkpoints.py what to save and take back what they need (`save_member`,
    `restore_pack`, `resume_point`, `load_model`): a checkpoint key written twice can drift."""
    bad = [f"{path.relative_to(ROOT)}:{line} {call}" for package in PACKAGES for path in _modules(package)
           if path != CHECKPOINTS for line, call in _file_reads_and_writes(path)]
    bad += [f"{path.relative_to(ROOT)}:{line} [{key!r}]" for package in PACKAGES for path in _modules(package)
            if path != CHECKPOINTS and ("trainables.loop.checkpoints" in _project_imports(path))
            for line, key in _checkpoint_key_uses(path)]
    assert not bad, "checkpoint files and keys belong to trainables/loop/checkpoints.py:\n" + "\n".join(bad)


def test_the_checkpoint_walk_sees_keys_and_file_calls(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from trainables.loop.checkpoints import load as read\nstate = read(p)\n"
                      "x = state['optimizer'], state.get('config'), {'model': 1, 'epoch': 2}, m['epoch']\n"
                      "torch.save(state, p)\n")
    assert sorted(_checkpoint_key_uses(module)) == [(3, "config"), (3, "model"), (3, "optimizer")]
    assert [call for _, call in _file_reads_and_writes(module)] == ["read", "torch.save"]


# -- one trial closer ----------------------------------------------------------------------------------
CLOSER = ROOT / "trainables" / "trial" / "lifecycle.py"
CLOSING = ("write_trial", "end_trial_run", "ERROR_TAG", "STOPPED_EARLY_TAG", "ERROR_TEXT_LIMIT")


def test_one_module_closes_trials():
    """Trial rows and runs end in trainables/trial/lifecycle.py only (the worker, the driver and the launcher's
    epilogue call it), under records.tracking's error tag and text limit, never a copy of the tag."""
    bad = []
    for package in ("trainables", "sweeps"):
        for path in _modules(package):
            source = path.read_text()
            bad += [f"{path.relative_to(ROOT)}:{n}: the error tag as a literal"
                    for n, line in enumerate(source.splitlines(), 1) if '"vitsweep.error"' in line]
            if path != CLOSER:
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}"
                        for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
                        and node.attr in CLOSING]
    assert not bad, "close trials through trainables.trial.lifecycle:\n" + "\n".join(bad)
