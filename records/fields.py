"""Run-config fields by role, with no imports: read by training (no pyarrow there) and by the analysis."""

# Fields that say where or how a run executes, not what it computes: they stay out of the trial id
# (trainables.config) and never split a condition (analysis.conditions).
EXECUTION_FIELDS = ("data_root", "device", "num_workers", "compile", "checkpoint_interval_s")
