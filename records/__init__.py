"""What a sweep leaves behind, written and read in one place, below `sweeps/`, `trainables/` and `analysis/`.

| module | holds |
| --- | --- |
| `names` | the registries' names (PEs, protocols, data sets, presets), torch-free, in registry order |
| `fields` | run-config fields by role (execution-only ones stay out of trial ids and conditions) |
| `schema` | the Parquet schemas of the `trials`, `epochs`, `measurements` and `summary` tables |
| `tables` | reading and writing those tables (local folders or object storage, through pyarrow) |
| `stores` | which MLflow tracking URIs are accepted, checked before any trial starts |
| `manifest` | the sweep manifest (planned trials, launch command) and the launcher heartbeat |
| `client` | the MLflow client of a URI and the retries every write goes through |
| `tracking` | experiments, one MLflow run per trial, metrics, tags, artifacts |
| `measurements` | the analysis measurements in MLflow: metric keys, per-layer curves |
| `provenance` | code version, git state, packages and machine of a run |
| `server` | a local `mlflow server` (tests, single-machine sweeps) |

Nothing here imports `sweeps`, `trainables` or `analysis` (tests/test_layout.py checks it).
"""
