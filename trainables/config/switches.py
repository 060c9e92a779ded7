"""Study L's protocol as data: the three switches (`Protocol`) and its name, without torch.

What each switch does to the data is `trainables/data/protocols.py` (its `PROTOCOLS`: one per name);
kept apart so that a run config, a trial id and a sweep's plan (`vitsweep sweep ... --dry-run`)
import no torch. The names and their parser are `records.vocab`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from records import vocab

LABEL_SMOOTHING = 0.1


@dataclass(frozen=True)
class Protocol:
    """Study L's three switches. `name`: "baseline", or the enabled ones joined by "+"."""

    autoaugment: bool = False
    cutmix: bool = False
    label_smoothing: bool = False

    @property
    def name(self) -> str:
        return vocab.protocol_name(self.autoaugment, self.cutmix, self.label_smoothing)

    @property
    def smoothing(self) -> float:
        """The `label_smoothing` argument of the loss: 0.1 when on, else 0."""
        return LABEL_SMOOTHING if self.label_smoothing else 0.0

    @classmethod
    def from_name(cls, name: str) -> Protocol:
        """The protocol a name (or the alias ``modern``) means; an unknown name raises ValueError."""
        return cls(**vocab.protocol_switches(name))
