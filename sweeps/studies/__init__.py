"""The studies, one module each (what a module declares: ``sweeps/studies/study.py``)."""

STUDIES = ("demo", "study_l", "study_p", "factorial", "hparam", "pilot")
