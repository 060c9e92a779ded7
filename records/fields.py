"""PENDING (issue 24): `EXECUTION_FIELDS` moved to `records.vocab`; this shim stays only while
`analysis/conditions.py` imports it from here. The lead deletes it at merge, wiring that import to vocab."""

from records.vocab import EXECUTION_FIELDS  # noqa: F401
