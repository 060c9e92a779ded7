"""Study definitions (one module per study) and the launcher (``sweeps/run.py``)."""

STUDIES = ("demo", "study_l", "study_p", "factorial", "hparam", "pilot")

