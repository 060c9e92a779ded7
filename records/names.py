"""PENDING (issue 24): the registries' names moved to `records.vocab`; this shim stays only while
`analysis/claims.py` imports `PES` from here. The lead deletes it at merge, wiring that import to vocab."""

from records.vocab import DATASETS, PES, PRESETS, PROTOCOLS  # noqa: F401
