"""A launch's parts: options and checks, packs, the lock and keeper, interrupts, faults, the console."""
