"""docs/studies.md defines everything the code measures: names come from the code, never from a list here.

The measurement vocabulary is what ``analysis.evaluate.evaluate_checkpoint`` actually emits, read off
tiny random-weight ViTs of every PE kind (no PE, additive, rotary), so a metric added to the evaluation
fails this test until the page defines it; the interventions, PEs and protocols come from their registries.
"""

from __future__ import annotations

import re
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
