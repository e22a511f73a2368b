"""A Parquet dataset directory with atomic append and dedup by (context, strategy hash).

Layout::

    DIR/trials.parquet        compacted rows
    DIR/part-*.parquet        rows appended since the last compaction, one file per append
    DIR/profiles/<ctx>.json   the profile of each context (features are computed from it)
    DIR/.lock                 flock: appends and compaction are serialized across processes

An append writes a new part under a temporary name and renames it into place (atomic on
POSIX), holding the lock while it re-reads the stored keys: a row whose key is already
stored is not written again, so concurrent collectors never duplicate and a reader never
sees half a file. ``compact()`` merges the parts into ``trials.parquet`` the same way.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from autosync.datasets.schema import COLUMNS, KEY, SCHEMA, SCHEMA_VERSION
from autosync.errors import UserError

MAIN = "trials.parquet"
COMPACT_EVERY = 64


class DatasetError(UserError):
    """A dataset file that is unreadable, truncated, or of another schema version."""


class DatasetStore:
    def __init__(self, root: str | Path, create: bool = True):
        self.root = Path(root)
        if create:
            (self.root / "profiles").mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise DatasetError(f"{self.root}: no dataset here (not a directory)")

    # --- locking -------------------------------------------------------------------------
    @contextmanager
    def _locked(self):
        with open(self.root / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # --- reading -------------------------------------------------------------------------
    def _files(self) -> list[Path]:
        main = self.root / MAIN
        return ([main] if main.exists() else []) + sorted(self.root.glob("part-*.parquet"))

    @staticmethod
    def _read_file(path: Path) -> pa.Table:
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for damaged files
            raise DatasetError(f"{path}: unreadable Parquet ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        version = (table.schema.metadata or {}).get(b"autosync_dataset")
        if version is None:
            raise DatasetError(f"{path}: not an autosync dataset (no schema version in its metadata)")
        if version.decode() != str(SCHEMA_VERSION):
            raise DatasetError(f"{path}: dataset schema version {version.decode()} is not supported "
                               f"(this autosync reads version {SCHEMA_VERSION})")
        missing = [c for c in COLUMNS if c not in table.column_names]
        if missing:
            raise DatasetError(f"{path}: columns missing: {', '.join(missing[:5])}")
        return table

    def read(self) -> pd.DataFrame:
        """Every stored row once (the first stored wins), in storage order."""
        tables = [self._read_file(p) for p in self._files()]
        if not tables:
            return pd.DataFrame({c: pd.Series(dtype=SCHEMA.field(c).type.to_pandas_dtype()) for c in COLUMNS})
        df = pa.concat_tables([t.select(list(COLUMNS)).cast(SCHEMA) for t in tables]).to_pandas()
        return df.drop_duplicates(list(KEY), keep="first").reset_index(drop=True)

    def keys(self) -> set[tuple[str, str]]:
        keys: set[tuple[str, str]] = set()
        for p in self._files():
            t = self._read_file(p)
            keys.update(zip(t.column("context_id").to_pylist(), t.column("strategy_hash").to_pylist()))
        return keys

    # --- writing -------------------------------------------------------------------------
    def _write_atomic(self, table: pa.Table, name: str) -> None:
        tmp = self.root / f".{name}.{secrets.token_hex(4)}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / name)

    def append(self, rows: list[dict]) -> int:
        """Store the rows whose (context_id, strategy_hash) is new; return how many were stored."""
        if not rows:
            return 0
        for row in rows:
            row.setdefault("schema_version", SCHEMA_VERSION)
            row.setdefault("timestamp", time.time())
        with self._locked():
            stored = self.keys()
            fresh, seen = [], set()
            for row in rows:
                key = (row["context_id"], row["strategy_hash"])
                if key not in stored and key not in seen:
                    seen.add(key)
                    fresh.append({c: row.get(c) for c in COLUMNS})
            if fresh:
                table = pa.Table.from_pylist(fresh, schema=SCHEMA)
                self._write_atomic(table, f"part-{time.time_ns()}-{os.getpid()}-{secrets.token_hex(2)}.parquet")
            if len(self._files()) > COMPACT_EVERY:
                self._compact_locked()
        return len(fresh)

    def compact(self) -> None:
        """Merge every part into trials.parquet (atomically), dropping duplicates."""
        with self._locked():
            self._compact_locked()

    def remove(self, keys: set[tuple[str, str]]) -> int:
        """Delete the rows with these (context_id, strategy_hash) keys, e.g. to measure them again; returns how
        many were deleted. Rewrites trials.parquet atomically, then drops the parts: a crash in between leaves
        the rows stored (nothing else is lost), and the same call can be made again."""
        with self._locked():
            df = self.read()
            gone = [k in keys for k in zip(df.context_id, df.strategy_hash)]
            if any(gone):
                self._compact_locked(df[[not g for g in gone]])
            return sum(gone)

    def _compact_locked(self, df: pd.DataFrame | None = None) -> None:
        files = self._files()
        if df is None and (not files or files == [self.root / MAIN]):
            return
        df = self.read() if df is None else df
        self._write_atomic(pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False), MAIN)
        for p in files:
            if p.name != MAIN:
                p.unlink()

    # --- profiles ------------------------------------------------------------------------
    def profile_path(self, context_id: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in context_id)
        return self.root / "profiles" / f"{safe}.json"

    def save_profile(self, context_id: str, profile_dict: dict) -> None:
        path = self.profile_path(context_id)
        tmp = path.with_name(path.name + f".{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps(profile_dict))
        os.replace(tmp, path)

    def load_profile_dict(self, context_id: str) -> dict | None:
        path = self.profile_path(context_id)
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
