"""docs/studies.md defines everything the code measures: names come from the code, never from a list here.

The measurement vocabulary is what ``analysis.measuring.evaluate.evaluate_checkpoint`` actually emits, read off
tiny random-weight ViTs of every PE kind (no PE, additive, rotary), so a metric added to the evaluation
fails this test until the page defines it; the interventions, PEs and protocols come from their registries.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from test_evaluate import pes_scaled_by
from test_interventions import DEFAULT_LEVELS, INTERVENTIONS

from analysis.measuring.evaluate import evaluate_checkpoint
from trainables.data.protocols import PROTOCOLS
from trainables.model.pos_embed import POS_EMBEDS
from trainables.model.vit import ViT
from trainables.config.architecture import ViTConfig

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "studies.md"
VOCABULARY_HEADING = "## Measurement vocabulary"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _granularity(row: dict) -> str:
    """How the page's `per` column names a row's shape: model, layer, or layer x head."""
    if row["layer"] is None:
        assert row["head_index"] is None, row
        return "model"
    return "layer" if row["head_index"] is None else "layer x head"


@pytest.fixture(scope="module")
def emitted() -> set[tuple[str, str, str]]:
    """(intervention, metric, per) of every row the evaluation emits, over one PE of each kind."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models gain nothing from intra-op threads on a shared CPU
    try:
        images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        labels = torch.arange(4) % 10
        out = set()
        for pe in ("none", pes_scaled_by("pe_scale")[0], pes_scaled_by("rope_scale")[0]):
            torch.manual_seed(0)
            model = ViT(ViTConfig.preset("tiny", pe=pe)).eval()
            # One level per grid keeps it fast: the vocabulary does not depend on how many levels run.
            rows = evaluate_checkpoint(model, images, labels, mean=(0.5,) * 3, std=(0.25,) * 3, grid=model.config.grid,
                                       batch_size=4, jpeg_levels=(5,), blur_levels=(2.5,), alphas=(0.5,))
            out |= {(r["intervention"], r["metric"], _granularity(r)) for r in rows}
        return out
    finally:
        torch.set_num_threads(previous)


def _vocabulary_table(doc: str) -> set[tuple[str, str, str]]:
    """(intervention, metric, per) of each row of the page's measurement-vocabulary table."""
    section = doc.split(VOCABULARY_HEADING, 1)
    assert len(section) == 2, f"docs/studies.md has no {VOCABULARY_HEADING!r} section"
    body = section[1].split("\n## ", 1)[0]
    lines = [line for line in body.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["intervention", "level", "metric", "per"], header
    rows = set()
    for line in lines[2:]:  # after the header and its --- separator
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        rows.add((cells[0], cells[2], cells[3]))
    return rows


def test_every_emitted_measurement_is_in_the_vocabulary_table_and_nothing_else(doc, emitted):
    documented = _vocabulary_table(doc)
    assert emitted - documented == set(), "measurements the code emits that docs/studies.md does not list"
    assert documented - emitted == set(), "rows of docs/studies.md's vocabulary table the code never emits"


def test_every_metric_is_defined_in_the_text(doc, emitted):
    """Beyond the table: each metric name is written out (in backticks) where the page defines it."""
    table = doc.split(VOCABULARY_HEADING, 1)[0]  # the definitions come before the table
    missing = sorted({metric for _, metric, _ in emitted if f"`{metric}`" not in table})
    assert missing == [], f"metrics with no definition above the vocabulary table: {missing}"


def test_every_registered_intervention_is_defined(doc, emitted):
    names = set(INTERVENTIONS) | set(DEFAULT_LEVELS)
    assert {iv for iv, _, _ in emitted} <= names  # the evaluation uses only registered interventions
    section = doc.split("## Interventions", 1)[1].split("\n## ", 1)[0]
    rows = {line.strip("|").split("|")[0].strip().strip("`") for line in section.splitlines() if line.startswith("| `")}
    assert names - rows == set(), "interventions with no row in docs/studies.md's Interventions table"


def test_every_pe_and_protocol_is_named(doc):
    missing = [name for name in (*POS_EMBEDS, *PROTOCOLS) if f"`{name}`" not in doc]
    assert missing == [], f"PEs / protocols of the registries that docs/studies.md never names: {missing}"


def test_readme_links_the_studies_page_not_a_path_outside_the_clone():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/studies.md)" in readme
    assert not re.search(r"\]\(\.\./", readme), "README links a path outside the repository"


DOCS = [ROOT / "README.md", ROOT / "cluster" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_lines(path: Path) -> list[str]:
    """Every command line of the page's code blocks (continuations joined, comments dropped)."""
    blocks, language, block = [], None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if language is None:
                language, block = line[3:].strip(), []
            else:
                if language in ("", "bash"):  # shell blocks; python and sql ones are run elsewhere
                    blocks.append("\n".join(block))
                language = None
        elif language is not None:
            block.append(line)
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _vitsweep_commands(line: str) -> list[list[str]]:
    """The vitsweep argvs (``["sweep", "study_l", ...]``) a command line of the docs starts: itself, the
    parts of a `ray exec` head line, or the launcher after `--` of `ray submit` / `ray job submit`."""
    words = shlex.split(line)
    if words[0] == "vitsweep":
        return [words[1:]]
    if words[:2] == ["ray", "exec"]:
        commands, part = [], []
        for word in [*shlex.split(words[-1]), "&&"]:
            if word == "&&":
                if part[0] == "vitsweep":
                    commands.append(part[1:])
                part = []
            else:
                part.append(word)
        return commands
    if "sweeps/run.py" in words:
        return [["sweep", *words[words.index("sweeps/run.py") + 1:]]] \
            if "--" not in words[words.index("sweeps/run.py"):] \
            else [["sweep", *words[words.index("--", words.index("sweeps/run.py")) + 1:]]]
    return []


def _plan(argv: list[str], capsys) -> argparse.Namespace:
    """Parse a vitsweep argv with the real command line; a sweep is planned (`--dry-run`: no Ray, no GPU)."""
    from sweeps import cli
    from sweeps import run as launcher

    args = cli._parser(argv[0]).parse_args(argv)
    if args.command == "sweep":
        args.dry_run = True
        assert launcher.run(args) == 0, argv
        assert re.search(r"^\d+ trials|trial_id", capsys.readouterr().out, flags=re.M), argv
    return args


def test_every_vitsweep_command_of_the_docs_parses_and_every_sweep_plans(capsys):
    """Each command is complete as written; a launch that joins a cluster says what its trials train on."""
    seen: dict[str, set[str]] = {}
    for page in DOCS:
        for line in _code_lines(page):
            if not re.search(r"(^|[\s'\"])vitsweep\s|sweeps/run\.py", line):
                continue
            for argv in _vitsweep_commands(line):
                args = _plan([a for a in argv if a != "$EXTRA"], capsys)
                if args.command == "sweep" and args.address:
                    assert args.gpus_per_trial is not None, (page.name, line)
                    if page.name == "README.md" or "cluster" in str(page):
                        seen.setdefault(args.study, set()).add(args.stage)
    assert all("all" in seen.get(study, ()) for study in ("study_l", "study_p", "factorial")), seen


def test_the_readme_is_a_short_guide_whose_commands_all_run_or_plan(capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 250 and max(map(len, lines)) <= 200
    assert "make demo    #" in readme and "make test    #" in readme
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    planned = 0
    for line in _code_lines(ROOT / "README.md"):
        if line.startswith("make "):
            assert re.search(rf"^{line.split()[1]}:", makefile, flags=re.M), line
        elif line.startswith(("vitsweep", "ray ")):
            for argv in _vitsweep_commands(line):
                _plan(argv, capsys)
                planned += 1
        else:  # the MLflow UI and the one-line layout of the results folder
            assert line.startswith(("mlflow ui", "results/", "mlflow.db", "<study>/")), line
    assert planned >= 8
    for link in re.findall(r"\]\(([^)#]+)", readme):  # every page the README links exists
        assert (ROOT / link).exists(), link


def test_the_notebook_snippets_run_on_a_results_folder(tmp_path):
    """The README's and docs/results.md's Python blocks, run as written from a folder holding results/demo."""
    import subprocess
    import sys

    from test_report import write_study

    write_study(str(tmp_path / "results"), "demo", seeds=2, protocols=["baseline", "cutmix"], models=[("ape", False)],
                checkpoints=(4,))
    blocks = [re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)[0],
              next(b for b in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "results.md").read_text(),
                                         flags=re.S) if "StudyData" in b)]
    for code in blocks:
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, f"{code}\n{out.stderr[-2000:]}"
        assert "cutmix" in out.stdout, out.stdout


# The assumed training images/s per pack size that cluster/README.md's cost table states (A10G).
ASSUMED_RATES = {"device": "A10G", "packing": {
    "study_l": {"K=1": {"images_per_s": 2500.0}, "K=4": {"images_per_s": 6000.0}, "K=8": {"images_per_s": 10000.0}},
    "study_p": {"K=1": {"images_per_s": 750.0}}}}


def test_the_cluster_cost_table_is_what_the_estimate_gives_for_each_sweeps_packs():
    from sweeps import run as launcher
    from sweeps.launch import estimate, options
    from sweeps.launch.packs import Pack

    text = (ROOT / "cluster" / "README.md").read_text(encoding="utf-8")
    section = text.split("## Cost estimate", 1)[1].split("\n## ", 1)[0]
    for value in ("2,500", "6,000", "10,000", "750"):  # the assumed rates, as the page states them
        assert f"| {value} |" in section, value
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]
    rows = [r for r in rows if re.fullmatch(r"`[^`]+`", r[0])]  # a sweep's command line, not a preset's row
    assert len(rows) == 5 and {r[0].strip("`").split()[0] for r in rows} == {"study_l", "study_p", "factorial"}, rows

    def hours(line: str) -> str:
        return re.match(r"GPU-hours: ([\d.]+)", line).group(1)

    for sweep, trials, packs, alone, packed, *_ in rows:
        parser = launcher.argparse.ArgumentParser()
        options.add_arguments(parser)
        args = parser.parse_args([*sweep.strip("`").split(), "--gpus-per-trial", "1", "--dry-run"])
        configs = options.build_trials(args)
        planned = options.build_packs(args, configs)
        assert (int(trials), int(packs)) == (len(configs), len(planned)), sweep
        lone = [Pack(pack_id=c.trial_id, members=(c,)) for c in configs]
        assert hours(estimate.estimate(configs, lone, ASSUMED_RATES)) == alone, sweep
        assert hours(estimate.estimate(configs, planned, ASSUMED_RATES)) == packed, sweep
