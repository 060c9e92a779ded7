"""Training, room by room (docs/operations.md, Layout): config/, data/, model/, loop/ and trial/."""
