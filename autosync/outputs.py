"""Output paths are checked before long work starts, so nothing is computed only to be lost."""
from __future__ import annotations

import os
from pathlib import Path

from autosync.errors import UserError


def check_output(path: str | os.PathLike, what: str = "output file", directory: bool = False) -> Path:
    """Raise UserError (one line) unless ``path`` can be written: its folder exists and is writable,
    and it is not a folder where a file is wanted (or a file where a folder is wanted)."""
    path = Path(path)
    if directory and path.exists() and not path.is_dir():
        raise UserError(f"{path}: cannot write the {what} there (a file, not a folder)")
    if directory and path.is_dir():
        if not os.access(path, os.W_OK):
            raise UserError(f"{path}: cannot write the {what} there (folder not writable)")
        return path
    if not directory and path.is_dir():
        raise UserError(f"{path}: cannot write the {what} there (it is a folder)")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: cannot write the {what} there (folder {parent} does not exist)")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{path}: cannot write the {what} there (folder {parent} not writable)")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{path}: cannot write the {what} there (file not writable)")
    return path
