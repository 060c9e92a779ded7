"""Every checkpoint measured, inside Ray Data actors: nothing here imports the statistics or the report."""
