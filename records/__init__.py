"""What a sweep leaves behind, written and read in one place, below `sweeps/`, `trainables/` and `analysis/`.

| module | holds |
| --- | --- |
| `schema` | the Parquet schemas of the `trials`, `epochs` and `measurements` tables |
| `tables` | reading and writing those tables (local folders or object storage, through pyarrow) |
| `stores` | which MLflow tracking URIs are accepted, checked before any trial starts |
| `client` | the MLflow client of a URI and the retries every write goes through |
| `tracking` | experiments, one MLflow run per trial, metrics, tags, artifacts, measurements |
| `provenance` | code version, git state, packages and machine of a run |
| `server` | a local `mlflow server` (tests, single-machine sweeps) |

Nothing here imports `sweeps`, `trainables` or `analysis` (tests/test_layout.py checks it).
"""
