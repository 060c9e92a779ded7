"""The valid names a user types, without importing torch: for `--help` and early checks.

`vitsweep --help` must answer in a moment, and importing torch, torchvision, Ray or MLflow costs
10-40 s cold. The registries' names live torch-free in `records.names` (below `analysis/`, whose
report orders PEs by them, too); this module adds the study names the launcher knows.
"""

from records.names import DATASETS, PES, PRESETS, PROTOCOLS
from sweeps import STUDIES

__all__ = ["STUDIES", "PES", "PROTOCOLS", "DATASETS", "PRESETS"]
