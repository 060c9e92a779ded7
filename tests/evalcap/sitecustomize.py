"""A lower evaluation cap for the demo study, for the cluster test (never on a user's path).

Put this folder on PYTHONPATH with ``VITSWEEP_TEST_EVAL_SIZE=N``: in any process that then imports
``sweeps.studies.demo`` (the launcher of a ``ray job submit``, where the test cannot patch the module itself),
``EVAL_SIZE`` is ``N`` right after the module runs, as ``tests/conftest.py`` sets it in-process for the
session's demo sweep. The analysis stage, linear in these images, is most of a demo sweep's time; the
rest of the sweep (Ray, Tune, Train, MLflow, Parquet, the report) runs unchanged. Other processes
(Ray's and Train's workers) never import the study module and pay only for installing the finder."""

import os

_CAP = os.environ.get("VITSWEEP_TEST_EVAL_SIZE")

if _CAP:
    import importlib.abc
    import importlib.machinery
    import sys

    class _CapDemo(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "sweeps.studies.demo":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            run_module = spec.loader.exec_module

            def exec_module(module):
                run_module(module)
                module.EVAL_SIZE = int(_CAP)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _CapDemo())
