"""docs/studies.md defines everything the code measures: names come from the code, never from a list here.

The measurement vocabulary is what ``analysis.evaluate.evaluate_checkpoint`` actually emits, read off
tiny random-weight ViTs of every PE kind (no PE, additive, rotary), so a metric added to the evaluation
fails this test until the page defines it; the interventions, PEs and protocols come from their registries.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from analysis.evaluate import evaluate_checkpoint, pes_scaled_by
from analysis.interventions import DEFAULT_LEVELS, INTERVENTIONS
from records import schema
from trainables.pos_embed import POS_EMBEDS
from trainables.protocols import PROTOCOLS
from trainables.vit import ViT, ViTConfig

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
    names = set(INTERVENTIONS) | set(schema.INTERVENTIONS) | set(DEFAULT_LEVELS)
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


CLUSTER_HEADING = "## On a GPU cluster"


def _cluster_commands() -> list[tuple[str, list[str]]]:
    """(how it is started, vitsweep argv) of every vitsweep command in the README's cluster section:
    the parts of a `ray exec` command and what follows `--` in a `ray submit ... sweeps/run.py --`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(CLUSTER_HEADING, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            words = shlex.split(line)
            assert words[:2] in (["ray", "exec"], ["ray", "submit"]) and "--tmux" in words, line
            if words[1] == "submit":
                commands.append(("ray submit", ["sweep", *words[words.index("--") + 1:]]))
                continue
            part: list[str] = []
            for word in [*shlex.split(words[-1]), "&&"]:  # the head's shell line: vitsweep ... && vitsweep ...
                if word == "&&":
                    assert part[0] == "vitsweep", part
                    commands.append(("ray exec", part[1:]))
                    part = []
                else:
                    part.append(word)
    return commands


def test_every_cluster_command_of_the_readme_parses_and_plans_on_gpus(capsys):
    """Each command is complete as written: it parses, a sweep plans (`--dry-run`: no Ray, no GPU) with
    GPUs per trial on the running cluster, and the studies whose report draws emergence measure every
    snapshot."""
    import argparse

    from analysis import job, report
    from sweeps import run as launcher

    add = {"sweep": launcher.add_arguments, "analyze": job.add_arguments, "report": report.add_arguments}
    commands = _cluster_commands()
    seen: dict[str, set[str]] = {}
    for _, (command, *argv) in commands:
        parser = argparse.ArgumentParser(prog=f"vitsweep {command}")
        add[command](parser)
        args = parser.parse_args(argv)
        seen.setdefault(args.study, set()).add(command if command != "analyze" else f"analyze {args.checkpoints}")
        if command == "sweep":
            assert args.gpus_per_trial > 0 and args.address == "auto", argv
            args.dry_run = True
            assert launcher.run(args) == 0, argv
            assert re.search(r"^\d+ trials", capsys.readouterr().out, flags=re.M), argv
        elif command == "analyze":
            assert args.address == "auto", argv
    assert {"study_l", "study_p", "factorial"} <= set(seen), seen
    for study in ("study_l", "factorial"):  # trained alone (--stage train), then every snapshot, then the report
        assert seen[study] == {"sweep", "analyze all", "report"}, seen


# The assumed training images/s per pack size that cluster/README.md's cost table states (A10G).
ASSUMED_RATES = {"device": "A10G", "packing": {
    "study_l": {"K=1": {"images_per_s": 2500.0}, "K=4": {"images_per_s": 6000.0}, "K=8": {"images_per_s": 10000.0}},
    "study_p": {"K=1": {"images_per_s": 750.0}}}}


def test_the_cluster_cost_table_is_what_the_estimate_gives_for_each_sweeps_packs():
    from sweeps import estimate
    from sweeps import run as launcher
    from sweeps.packs import Pack

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
        launcher.add_arguments(parser)
        args = parser.parse_args([*sweep.strip("`").split(), "--gpus-per-trial", "1", "--dry-run"])
        configs = launcher.build_trials(args)
        planned = launcher.build_packs(args, configs)
        assert (int(trials), int(packs)) == (len(configs), len(planned)), sweep
        lone = [Pack(pack_id=c.trial_id, members=(c,)) for c in configs]
        assert hours(estimate.estimate(configs, lone, ASSUMED_RATES)) == alone, sweep
        assert hours(estimate.estimate(configs, planned, ASSUMED_RATES)) == packed, sweep
