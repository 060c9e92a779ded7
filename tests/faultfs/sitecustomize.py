"""A storage that fails on demand, for the fault tests (never on a user's path).

Put this folder on PYTHONPATH with ``VITSWEEP_TEST_FAULT_DIR=<results>``: every process of the
sweep (the launcher, Ray's workers, Train's workers, which inherit the environment) then wraps
``pyarrow.parquet.write_table`` so that, once ``<results>/.fault`` holds an errno name
(``ENOSPC``, ``EROFS``), each Parquet write under ``<results>`` raises that ``OSError``, as a
disk that filled up or turned read-only mid-sweep would."""

import os

_DIR = os.environ.get("VITSWEEP_TEST_FAULT_DIR")

if _DIR:
    import errno

    import pyarrow.parquet as _pq

    _write_table = _pq.write_table

    def write_table(table, where, *args, **kwargs):
        trigger = os.path.join(_DIR, ".fault")
        if str(where).startswith(_DIR) and os.path.exists(trigger):
            with open(trigger) as fh:
                code = getattr(errno, fh.read().strip() or "ENOSPC")
            raise OSError(code, os.strerror(code), str(where))
        return _write_table(table, where, *args, **kwargs)

    _pq.write_table = write_table
