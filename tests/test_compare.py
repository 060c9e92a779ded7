"""`vitsweep compare`: two results folders of one study side by side, what changed first (CPU, ~6 s).

Folder A holds 3 seeds, folder B 5 of the same synthetic study (``test_report.write_study``): at 3 seeds a
directional claim cannot be decided, at 5 it is, so verdicts change between them while the planted effects
stay put.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pandas as pd
import pytest
from test_report import primary, write_study

from analysis.reporting import compare
from analysis.statistics import claims as claims_module
from sweeps import cli

SMALL = {"protocols": ["baseline", "cutmix"], "models": [("ape", False)], "checkpoints": (4,)}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """(folder A, folder B, the command's output folder, what it printed)."""
    root = tmp_path_factory.mktemp("compare")
    a, b = str(root / "a"), str(root / "b")
    write_study(a, "small", seeds=3, **SMALL)
    write_study(b, "small", seeds=5, **SMALL)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["compare", a, b, "small", "--out", str(root / "ab")]) == 0
    return a, b, root / "ab", printed.getvalue()


def test_compare_puts_rows_with_data_first_with_a_minus_b_and_a_changed_verdict_mark(compared):
    *_, out, _ = compared
    conditions = pd.read_csv(out / "conditions.csv").set_index("protocol")
    assert conditions.loc["cutmix", "n (A)"] == 3 and conditions.loc["cutmix", "n (B)"] == 5
    acc = conditions.loc["baseline"]
    assert acc["test_acc mean: A - B"] == pytest.approx(acc["test_acc mean (A)"] - acc["test_acc mean (B)"])
    assert not conditions[compare.SAME].any()
    table = pd.read_csv(out / "claims.csv")
    # Every row with data in either folder comes before the claims that have none, in the claims' own order.
    has_data = (table[["verdict (A)", "verdict (B)"]].fillna("no data") != "no data").any(axis=1).to_numpy()
    assert has_data.any() and not has_data.all() and (np.diff(has_data.astype(int)) <= 0).all()
    order = [next(i for i, c in enumerate(claims_module.CLAIMS) if c.text == t) for t in table.loc[has_data, "claim"]]
    assert order == sorted(order)
    np.testing.assert_allclose(table["effect: A - B"], table["effect (A)"] - table["effect (B)"])
    cutmix = primary(table).set_index("claim").loc["CutMix alone lowers minimum MAD"]
    assert (cutmix["verdict (A)"], cutmix["verdict (B)"]) == ("not enough seeds", "supported")
    assert cutmix[compare.CHANGED] and not cutmix[compare.SAME]
    page = (out / "index.html").read_text()
    assert "<tr class=changed>" in page and "<th>effect: A - B</th>" in page


def test_the_console_fits_120_columns_and_folds_equal_rows(compared):
    a, _, _, printed = compared
    lines = printed.splitlines()
    assert max(len(line) for line in lines if not line.startswith(("A: ", "B: ", "written: "))) <= compare.WIDTH
    changed = [line for line in lines if line.startswith("* ")]
    assert changed and all(line.endswith("not enough seeds -> supported") for line in changed)
    assert "without data in either folded: --all shows them" in printed
    # A folder against itself: every row is the same, folded into a count; --all shows them.
    same = compare.compare(a, a, "small")
    claims, conditions = same["claims"], same["conditions"]
    assert claims[compare.SAME].all() and not claims[compare.CHANGED].any()
    folded = "\n".join(compare.claim_lines(claims) + compare.condition_lines(conditions))
    assert "CutMix alone lowers minimum MAD" not in folded and "(2 equal condition(s) folded" in folded
    assert "CutMix alone lowers minimum MAD" in "\n".join(compare.claim_lines(claims, show_all=True))
