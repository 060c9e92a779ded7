"""A study's data model, statistics across seeds, the papers' claims and their verdicts."""
