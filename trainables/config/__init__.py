"""What a trial is, as data: no torch, Ray or MLflow, nothing above it (tests/test_layout.py)."""
