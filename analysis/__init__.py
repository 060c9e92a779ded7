"""The post-hoc analysis, room by room (docs/operations.md, Layout): measuring/, statistics/, reporting/."""
