"""Every copy of a file to or from storage: a local folder or any URI pyarrow's filesystems understand.

Local writes go to a temporary name beside the target and are renamed into place; an object
store's PUT is atomic on its own. Whatever a file holds (a checkpoint, a snapshot, a manifest) is
its owner's business: this module only moves bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs

from records.layout import filesystem, in_form_of, is_uri


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type == pafs.FileType.File


def download(uri: str, local: str | os.PathLike) -> bool:
    """Copy the file at `uri` to `local` (its folder created); False when there is none."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return False
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    pafs.copy_files(path, os.fspath(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return True


def upload(local: str | os.PathLike, uri: str) -> None:
    """Replace the file at `uri` with `local`: written beside it, then moved, so a reader (or a
    resume after a kill mid-upload) never sees half a file."""
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    target = path if is_uri(uri) else f"{path}.tmp"
    pafs.copy_files(os.fspath(local), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    if target != path:
        fs.move(target, path)


def upload_new(paths: Iterable[Path], uri: str, uploaded: MutableMapping[str, int]) -> list[str]:
    """Upload each file of `paths` into the folder `uri` unless this very version of it was uploaded
    before. ``uploaded``: file name -> modification time (ns) of the version uploaded, kept by the
    caller, so a file rewritten since (a snapshot retrained after an out-of-memory retry) goes up
    again. Returns the names uploaded now."""
    sent = []
    for path in sorted(paths):
        stamp = path.stat().st_mtime_ns
        if uploaded.get(path.name) != stamp:
            upload(path, f"{uri.rstrip('/')}/{path.name}")
            uploaded[path.name] = stamp
            sent.append(path.name)
    return sent


def _list(uri: str, kind: pafs.FileType) -> list[str]:
    fs, root = filesystem(uri)
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return sorted(in_form_of(uri, i.path) for i in infos if i.type == kind)


def list_files(uri: str) -> list[str]:
    """The files directly in the folder `uri` (none when it does not exist), in the form of `uri`."""
    return _list(uri, pafs.FileType.File)


def list_dirs(uri: str) -> list[str]:
    """The folders directly in the folder `uri`, in the form of `uri`."""
    return _list(uri, pafs.FileType.Directory)


def write_json(uri: str, obj: Mapping[str, Any]) -> None:
    """Write `obj` as JSON at `uri`, atomically (local: a temporary name renamed into place)."""
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    target = path if is_uri(uri) else f"{path}.tmp"
    with fs.open_output_stream(target) as out:
        out.write(json.dumps(obj, indent=1, default=str).encode())
    if target != path:
        fs.move(target, path)


def read_json(uri: str) -> dict | None:
    """The JSON object at `uri`, or None when it is missing or unreadable."""
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream:
            return json.loads(stream.read())
    except (FileNotFoundError, OSError, json.JSONDecodeError):
        return None
