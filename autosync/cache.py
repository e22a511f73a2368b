"""autosync's on-disk cache: ``$AUTOSYNC_CACHE_DIR``, else ``~/.cache/autosync``.

What is derived from the shipped dataset and this code (the training set every tune starts from, the interval
model's fold regressors) is cached under a key that hashes both, so a changed dataset or a changed line of
autosync misses. Entries are written atomically (a temporary name, then a rename); a cache that cannot be
written or read is skipped, never an error. Nothing is pickled.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path


def root() -> Path:
    return Path(os.environ.get("AUTOSYNC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "autosync"))


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """SHA-256 of every .py file of the autosync package (names and contents)."""
    h = hashlib.sha256()
    package = Path(__file__).parent
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def tree_hash(folder: str | Path) -> str:
    """SHA-256 of a folder's files (relative names and contents)."""
    h = hashlib.sha256()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def key(*parts) -> str:
    return hashlib.sha256("|".join(map(str, (code_hash(), *parts))).encode()).hexdigest()[:24]


def read_text(kind: str, k: str) -> str | None:
    try:
        return (root() / kind / k).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def write_text(kind: str, k: str, text: str) -> None:
    try:
        folder = root() / kind
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{k}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / k)
    except OSError:
        pass
