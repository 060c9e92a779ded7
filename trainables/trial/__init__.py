"""A trial on Ray: the Tune trial that trains a pack, a trial's records open to close, Ray start-up."""
