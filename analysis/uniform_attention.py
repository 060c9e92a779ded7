"""Uniform attention's mean attention distance on a G x G grid: where an untrained model's heads start,
and the level a local head lies below. Numpy only, so the claims' precondition (``analysis.claim_tests``)
and the dotted line on every MAD axis (``analysis.canvas``) read it without torch or matplotlib;
``analysis.metrics`` measures the same distance in torch (tests/test_claims.py checks they agree)."""

from __future__ import annotations

import numpy as np


def uniform_mad(grid: int) -> float:
    """``mad`` of uniform attention over the patch keys of a G x G grid (the query's own patch included):
    the mean Euclidean grid distance over all ordered pairs over sqrt(2) (G - 1), 0.418 at G 8, 0.396 at G 14."""
    row, col = np.divmod(np.arange(grid * grid), grid)
    distance = np.hypot(row[:, None] - row[None], col[:, None] - col[None])
    return float(distance.mean() / (np.sqrt(2.0) * (grid - 1)))
