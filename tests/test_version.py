"""The version is written once, in pyproject.toml: the changelog's newest heading names it, and a run without
.git records it (``records.provenance.code_version``)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from records import provenance

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_the_changelogs_newest_heading_is_pyprojects_version():
    # "## 0.5 (in progress)" and "## 0.5" name 0.5.0; "## 0.5.1" names 0.5.1: a missing part is 0.
    heading = re.search(r"^## (\S+)", (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8"), re.M)
    assert heading, "docs/changelog.md has no '## <version>' heading"
    parts = heading[1].split(".")
    assert VERSION == ".".join(parts + ["0"] * (3 - len(parts))), (
        f"pyproject.toml says {VERSION}, docs/changelog.md's newest heading {heading[0]!r}")


def test_without_git_the_code_version_names_pyprojects_version(tmp_path):
    # tmp_path lies outside any checkout, and `make install` installs the package (editable).
    assert provenance.code_version(tmp_path) == f"vitsweep-{VERSION}", (
        "the installed metadata is not pyproject.toml's version: install again (make install)")
