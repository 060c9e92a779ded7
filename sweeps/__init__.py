"""Study definitions (one module per study) and the launcher (``sweeps/run.py``)."""

STUDIES = ("demo", "study_l", "study_p", "factorial", "hparam", "pilot")


def load_study(name: str):
    """The study module called ``name``; unknown names raise before any work starts."""
    import importlib

    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; valid studies: {list(STUDIES)}")
    return importlib.import_module(f"sweeps.{name}")
