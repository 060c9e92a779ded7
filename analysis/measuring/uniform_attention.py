"""MAD's normaliser, and uniform attention's MAD on a G x G grid (where an untrained model's heads start, the level a
local head lies below). Numpy only: the claims' precondition (``analysis.statistics.claim_tests``) and every MAD axis
(``analysis.measuring.canvas``) read it without torch or matplotlib; ``analysis.measuring.metrics`` divides by the same
normaliser (tests/test_claims.py checks the two MADs agree)."""

from __future__ import annotations

import numpy as np


def max_grid_distance(grid: int) -> float:
    """Largest Euclidean distance on a G x G grid, sqrt(2) (G - 1): MAD's normaliser."""
    return 2.0 ** 0.5 * (grid - 1)


def uniform_mad(grid: int) -> float:
    """``mad`` of uniform attention over the patch keys of a G x G grid (the query's own patch included):
    the mean Euclidean grid distance over all ordered pairs over sqrt(2) (G - 1), 0.418 at G 8, 0.396 at G 14."""
    row, col = np.divmod(np.arange(grid * grid), grid)
    distance = np.hypot(row[:, None] - row[None], col[:, None] - col[None])
    return float(distance.mean() / max_grid_distance(grid))
