"""What a sweep leaves behind, written and read in one place, below `sweeps/`, `trainables/` and `analysis/`:
where results live (`layout`, `files`), the Parquet tables (`schema`, `tables`), the sweep manifest and
heartbeat (`manifest`), MLflow (`stores`, `client`, `tracking`, `measurements`, `provenance`) and the
project's vocabulary (`vocab`). Nothing here imports `sweeps`, `trainables` or `analysis`
(tests/test_layout.py checks it).
"""
