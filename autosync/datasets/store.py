"""A Parquet dataset directory with atomic append and dedup by (context, strategy hash).

Layout::

    DIR/trials.parquet        compacted rows
    DIR/part-*.parquet        rows appended since the last compaction, one file per append
    DIR/efficiency.parquet    measured statistical efficiencies (and efficiency-part-*.parquet appends)
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

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from autosync.datasets.schema import (EFFICIENCY_KEY, EFFICIENCY_SCHEMA, EFFICIENCY_VERSION, JOINED, KEY, SCHEMA,
                                      SCHEMA_VERSION, READABLE_VERSIONS)
from autosync.context import LOOPBACK, efficiency_key
from autosync.datasets import resolve
from autosync.errors import UserError
from autosync.strategy import loads_strategy

MAIN = "trials.parquet"
EFFICIENCY_MAIN = "efficiency.parquet"
COMPACT_EVERY = 64


class DatasetError(UserError):
    """A dataset file that is unreadable, truncated, or of another schema version."""


class _Table:
    """One Parquet table of the dataset: a compacted main file plus atomically appended parts."""

    def __init__(self, root: Path, main: str, part_prefix: str, schema: pa.Schema, key: tuple[str, ...],
                 meta_key: bytes, version: int, readable: tuple[int, ...], upgrade=None):
        self.root, self.main, self.prefix = root, main, part_prefix
        self.schema, self.key, self.meta_key = schema, key, meta_key
        self.columns = tuple(schema.names)
        self.version, self.readable, self.upgrade = version, readable, upgrade

    def files(self) -> list[Path]:
        main = self.root / self.main
        return ([main] if main.exists() else []) + sorted(self.root.glob(f"{self.prefix}-*.parquet"))

    def read_file(self, path: Path) -> pa.Table:
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for damaged files
            raise DatasetError(f"{path}: unreadable Parquet ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        version = (table.schema.metadata or {}).get(self.meta_key)
        if version is None:
            raise DatasetError(f"{path}: not an autosync dataset (no schema version in its metadata)")
        if not version.decode().isdigit() or int(version.decode()) not in self.readable:
            raise DatasetError(f"{path}: dataset schema version {version.decode()} is not supported "
                               f"(this autosync reads version {self.version})")
        if int(version.decode()) != self.version and self.upgrade is not None:
            table = self.upgrade(table)
        missing = [c for c in self.columns if c not in table.column_names]
        if missing:
            raise DatasetError(f"{path}: columns missing: {', '.join(missing[:5])}")
        return table

    def read(self) -> pd.DataFrame:
        tables = [self.read_file(p) for p in self.files()]
        if not tables:
            return pd.DataFrame({c: pd.Series(dtype=self.schema.field(c).type.to_pandas_dtype())
                                 for c in self.columns})
        df = pa.concat_tables([t.select(list(self.columns)).cast(self.schema) for t in tables]).to_pandas()
        return df.drop_duplicates(list(self.key), keep="first").reset_index(drop=True)

    def keys(self) -> set[tuple]:
        keys: set[tuple] = set()
        for p in self.files():
            t = self.read_file(p)
            keys.update(zip(*(t.column(k).to_pylist() for k in self.key)))
        return keys

    def write_atomic(self, table: pa.Table, name: str) -> None:
        tmp = self.root / f".{name}.{secrets.token_hex(4)}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / name)

    def append_locked(self, rows: list[dict]) -> int:
        for row in rows:
            row.setdefault("schema_version", self.version)
            row.setdefault("timestamp", time.time())
        stored = self.keys()
        fresh, seen = [], set()
        for row in rows:
            k = tuple(row[c] for c in self.key)
            if k not in stored and k not in seen:
                seen.add(k)
                fresh.append({c: row.get(c) for c in self.columns})
        if fresh:
            table = pa.Table.from_pylist(fresh, schema=self.schema)
            self.write_atomic(table, f"{self.prefix}-{time.time_ns()}-{os.getpid()}-{secrets.token_hex(2)}.parquet")
        if len(self.files()) > COMPACT_EVERY:
            self.compact_locked()
        return len(fresh)

    def merge_locked(self, other: "_Table") -> int:
        """Append ``other``'s rows whose key this table lacks, as one part (written atomically)."""
        tables = [other.read_file(p) for p in other.files()]
        if not tables:
            return 0
        table = pa.concat_tables([t.select(list(self.columns)).cast(self.schema) for t in tables])
        stored, seen, keep = self.keys(), set(), []
        for k in zip(*(table.column(c).to_pylist() for c in self.key)):
            keep.append(k not in stored and k not in seen)
            seen.add(k)
        fresh = table.filter(pa.array(keep, type=pa.bool_())).replace_schema_metadata(self.schema.metadata)
        if fresh.num_rows:
            self.write_atomic(fresh, f"{self.prefix}-{time.time_ns()}-{os.getpid()}-{secrets.token_hex(2)}.parquet")
        return fresh.num_rows

    def compact_locked(self, df: pd.DataFrame | None = None) -> None:
        files = self.files()
        if df is None and (not files or files == [self.root / self.main]):
            return
        df = self.read() if df is None else df
        self.write_atomic(pa.Table.from_pandas(df, schema=self.schema, preserve_index=False), self.main)
        for p in files:
            if p.name != self.main:
                p.unlink()


def safe_name(context_id: str) -> str:
    """A context id as a file or folder name: letters, digits and ``-_.@`` kept, anything else ``_``."""
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in context_id)


def _upgrade(table: pa.Table) -> pa.Table:
    """An older trials table as the current version: version 1's efficiency keys computed from its columns,
    version 2's bytes sent per step null (not measured then)."""
    if "efficiency_key" not in table.column_names:
        cols = {c: table.column(c).to_pylist() for c in ("workload", "batch_size", "world_size", "ranks_per_node",
                                                           "strategy")}
        keys = [efficiency_key(w, b, n, r, loads_strategy(s)) for w, b, n, r, s in zip(*cols.values())]
        table = table.append_column("efficiency_key", pa.array(keys, pa.string()))
    if "sent_bytes_per_step" not in table.column_names:
        table = table.append_column("sent_bytes_per_step", pa.nulls(table.num_rows, pa.float64()))
    return table


def _upgrade_efficiency(table: pa.Table) -> pa.Table:
    """A version-1 efficiency table as version 2: ``pairs`` and ``pair_ratios`` null (one pair, not listed)."""
    for name, kind in (("pairs", pa.int32()), ("pair_ratios", pa.string())):
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, kind))
    return table


def _measured_on(row: dict) -> str | None:
    """Where a trial's timing-dependent efficiency applies: its cluster, unless it ran unshaped (loopback)."""
    return LOOPBACK if "|unshaped|" in str(row.get("context_id", "")) else row.get("cluster")


class DatasetStore:
    def __init__(self, root: str | Path, create: bool = True):
        self.root = resolve(root)     # "shipped": the dataset shipped with autosync
        if create:
            (self.root / "profiles").mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise DatasetError(f"{self.root}: no dataset here (not a directory)")
        self._trials = _Table(self.root, MAIN, "part", SCHEMA, KEY, b"autosync_dataset", SCHEMA_VERSION,
                              READABLE_VERSIONS, _upgrade)
        self._efficiency = _Table(self.root, EFFICIENCY_MAIN, "efficiency-part", EFFICIENCY_SCHEMA, EFFICIENCY_KEY,
                                  b"autosync_efficiency", EFFICIENCY_VERSION, (1, EFFICIENCY_VERSION),
                                  _upgrade_efficiency)

    # --- locking -------------------------------------------------------------------------
    @contextmanager
    def _locked(self):
        with open(self.root / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # --- trials --------------------------------------------------------------------------
    def _files(self) -> list[Path]:
        return self._trials.files()

    def _read_file(self, path: Path) -> pa.Table:
        return self._trials.read_file(path)

    def read(self, efficiency: bool = True) -> pd.DataFrame:
        """Every stored trial once (the first stored wins), in storage order; with ``efficiency``, the
        efficiency columns joined (lossless: 1 by definition; lossy and unmeasured: NaN)."""
        df = self._trials.read()
        if not efficiency:
            return df
        eff = self.read_efficiency()
        eff = eff[eff.status == "ok"].set_index("efficiency_key")
        for c in JOINED:
            df[c] = df.efficiency_key.map(eff[c]) if len(eff) else np.nan
        lossless = df.lossless.astype(bool)
        for c, v in (("efficiency", 1.0), ("efficiency_lo", 1.0), ("efficiency_hi", 1.0), ("within_noise", True),
                     ("final_loss_ratio", 1.0)):
            df[c] = df[c].astype(object).where(~lossless, v)
        for c in JOINED:
            if c != "within_noise":
                df[c] = df[c].astype(float)
        return df

    def keys(self) -> set[tuple[str, str]]:
        return self._trials.keys()

    def append(self, rows: list[dict]) -> int:
        """Store the rows whose (context_id, strategy_hash) is new; return how many were stored."""
        if not rows:
            return 0
        for row in rows:
            needed = ("workload", "batch_size", "world_size", "ranks_per_node", "strategy")
            if row.get("efficiency_key") is None and all(row.get(k) is not None for k in needed):
                row["efficiency_key"] = efficiency_key(row["workload"], row["batch_size"], row["world_size"],
                                                       row["ranks_per_node"], loads_strategy(row["strategy"]),
                                                       _measured_on(row))
        with self._locked():
            return self._trials.append_locked(rows)

    def compact(self) -> None:
        """Merge every part into trials.parquet (and efficiency.parquet), atomically, dropping duplicates."""
        with self._locked():
            self._trials.compact_locked()
            self._efficiency.compact_locked()

    def remove(self, keys: set[tuple[str, str]]) -> int:
        """Delete the rows with these (context_id, strategy_hash) keys, e.g. to measure them again; returns how
        many were deleted. Rewrites trials.parquet atomically, then drops the parts: a crash in between leaves
        the rows stored (nothing else is lost), and the same call can be made again."""
        with self._locked():
            df = self._trials.read()
            gone = [k in keys for k in zip(df.context_id, df.strategy_hash)]
            if any(gone):
                self._trials.compact_locked(df[[not g for g in gone]])
            return sum(gone)

    def merge(self, other: "DatasetStore") -> dict[str, int]:
        """Add ``other``'s trials, efficiency rows and profiles to this dataset: rows whose key is stored here are
        kept as they are (the first stored wins, as everywhere), so merging twice adds nothing. Profiles are copied
        only for contexts this dataset has none of; ``profiles_kept`` counts those present in both that differ."""
        if other.root.resolve() == self.root.resolve():
            raise DatasetError(f"{other.root}: cannot merge a dataset into itself")
        with self._locked():
            trials = self._trials.merge_locked(other._trials)
            efficiency = self._efficiency.merge_locked(other._efficiency)
        copied = kept = 0
        for path in sorted((other.root / "profiles").glob("*.json")):
            mine = self.root / "profiles" / path.name
            if not mine.exists():
                tmp = mine.with_name(mine.name + f".{secrets.token_hex(4)}.tmp")
                tmp.write_bytes(path.read_bytes())
                os.replace(tmp, mine)
                copied += 1
            elif mine.read_bytes() != path.read_bytes():
                kept += 1
        return {"trials": trials, "efficiency": efficiency, "profiles": copied, "profiles_kept": kept}

    # --- efficiency ----------------------------------------------------------------------
    def read_efficiency(self) -> pd.DataFrame:
        """Every stored efficiency measurement (and reference curve) once."""
        return self._efficiency.read()

    def efficiency_rows(self) -> dict[str, dict]:
        df = self.read_efficiency()
        return {r["efficiency_key"]: r for r in df.to_dict("records")}

    def remove_efficiency(self, keys: set[str]) -> int:
        """Delete the efficiency rows with these keys (e.g. a workload's, after its task changed), as ``remove``
        does for trials; returns how many were deleted."""
        with self._locked():
            return self._remove_efficiency_locked(keys)

    def _remove_efficiency_locked(self, keys: set[str]) -> int:
        df = self._efficiency.read()
        gone = df.efficiency_key.isin(keys)
        if gone.any():
            self._efficiency.compact_locked(df[~gone])
        return int(gone.sum())

    def remove_efficiency(self, keys: set[str]) -> int:
        """Delete the efficiency rows of these keys (e.g. a row stored under an older key format once its strategy
        was measured again under the current one); returns how many were deleted."""
        with self._locked():
            return self._remove_efficiency_locked(set(keys))

    def append_efficiency(self, rows: list[dict]) -> int:
        """Append the rows whose keys are not stored yet (a stored key keeps its row); returns how many."""
        with self._locked():
            return self._efficiency.append_locked(rows)

    def replace_efficiency(self, rows: list[dict]) -> int:
        """Store ``rows``, replacing the stored rows of their keys (a measurement made again because the stored
        one cannot be reused: another protocol, learning rate or horizon, or a failed run), under one lock."""
        with self._locked():
            self._remove_efficiency_locked({r["efficiency_key"] for r in rows})
            return self._efficiency.append_locked(rows)

    # --- profiles ------------------------------------------------------------------------
    def profile_path(self, context_id: str) -> Path:
        return self.root / "profiles" / f"{safe_name(context_id)}.json"

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
