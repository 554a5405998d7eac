"""Damage detection for the metadata store: row checksums, the file checks at open, the damage error.

Why checksums per row (design D18): SQLite checks its pages (``integrity_check``), not the values in
them; one flipped byte turns role ``rollout`` into ``pollout`` or owner ``trainer`` into ``drainer``
and SQLite still says "ok". Each row carries a CRC-32 of the canonical JSON of its table name and its
values, maintained by triggers that call ``rollart_crc`` (registered on every connection), and the
store recomputes it on every read. CRC-32 detects every error burst of up to 32 bits, so every
single-byte flip in a value or in the checksum is detected.
"""

from __future__ import annotations

import json
import os
import sqlite3
import zlib
from pathlib import Path
from typing import Any

from rollart.resource.errors import ResourceError

__all__ = ["APPLICATION_ID", "CRC_COLUMNS", "BadRow", "StoreDamaged", "StoreNotWritable", "check_file",
           "check_writable", "checksum_migration", "identity_migration", "install_checksum_function", "row_checksum"]

APPLICATION_ID = 0x526F4C41
"""``PRAGMA application_id`` of a rollart store ("RoLA"), so a foreign SQLite file is not mistaken for one."""

CRC_COLUMNS: dict[str, tuple[str, ...]] = {
    "devices": ("id", "hw", "role", "owner"),
    "transitions": ("seq", "id", "kind", "from_role", "to_role", "devices", "phase", "reason", "epoch"),
    "events": ("seq", "kind", "payload", "at"),
    "workers": ("id", "owner", "rank", "hw", "devices", "health", "restarts"),
    "services": ("name", "url", "owner", "health", "last_error"),
    "controller": ("id", "epoch", "holder"),
    "identity": ("id", "run_id", "generation"),
}
"""The columns each row's checksum covers (every column but ``crc``), in order."""


class StoreDamaged(ResourceError):
    """The store file is damaged or is not a rollart store; the message names the file and what to do."""

    def __init__(self, path: str, problem: str) -> None:
        """Name the file, the problem and the two ways out (restore, or start a new pool)."""
        # deps: none
        super().__init__(
            f"metadata store {path} is damaged: {problem}. It is refused rather than guessed at. Stop every "
            f"controller, then restore {path} (with its -wal file, if any) from a backup, or move it aside to start a "
            "new pool (every role, transition and event in it is then lost)")
        self.path = path
        self.problem = problem


class StoreNotWritable(ResourceError):
    """The store's directory or file cannot be written; the message names the path and what to change.

    Why its own error: SQLite says only "unable to open database file" or "attempt to write a readonly
    database", naming no file, and a read-only store is not a damaged one (nothing to restore).
    """

    def __init__(self, path: str, problem: str) -> None:
        """Name the path that is not writable, why, and what to do."""
        # deps: none
        super().__init__(
            f"metadata store {path} cannot be written: {problem}. The controller commits every change to it and to "
            "its -wal, -shm and .lock files beside it, so the directory and the file must be writable by this "
            "process (user, permissions, a read-only mount); fix that, or pass a store path in a writable directory")
        self.path = path
        self.problem = problem


class BadRow(ResourceError):
    """One row read back failed its checksum or its value checks (the store turns it into StoreDamaged)."""


def row_checksum(table: str, *values: Any) -> int:
    """CRC-32 of the canonical JSON of the table name and the row's values (as SQLite returns them)."""
    text = json.dumps([table, *values], separators=(",", ":"), ensure_ascii=False)
    return zlib.crc32(text.encode("utf-8"))


def install_checksum_function(conn: sqlite3.Connection) -> None:
    """Register ``rollart_crc(table, values...)`` on a connection, for the triggers (every connection needs it)."""
    conn.create_function("rollart_crc", -1, row_checksum, deterministic=True)


def _crc_statements(table: str) -> list[str]:
    """A ``crc`` column on one table, the checksums of its rows, and the triggers that keep them."""
    values = ", ".join(CRC_COLUMNS[table])
    return [
        f"ALTER TABLE {table} ADD COLUMN crc INTEGER NOT NULL DEFAULT 0",
        f"UPDATE {table} SET crc = rollart_crc('{table}', {values})",
        f"CREATE TRIGGER {table}_crc_insert AFTER INSERT ON {table} BEGIN "
        f"UPDATE {table} SET crc = rollart_crc('{table}', {values}) WHERE rowid = NEW.rowid; END",
        f"CREATE TRIGGER {table}_crc_update AFTER UPDATE OF {values} ON {table} BEGIN "
        f"UPDATE {table} SET crc = rollart_crc('{table}', {values}) WHERE rowid = NEW.rowid; END",
    ]


def checksum_migration() -> tuple[str, ...]:
    """Schema v4: a ``crc`` column on every table of v1-v3, checksums of the existing rows, triggers, the application id."""
    statements: list[str] = []
    for table in CRC_COLUMNS:
        if table != "identity":  # created by v5, with its checksum
            statements += _crc_statements(table)
    statements.append(f"PRAGMA application_id = {APPLICATION_ID:d}")
    return tuple(statements)


def identity_migration() -> tuple[str, ...]:
    """Schema v5: the store's identity, one checksummed row: a random run id, and a generation every write bumps.

    Why in the file (design D31): the run id tells this run's store from another run's with the same pool, and
    the generation tells an older copy (a restored backup, a lost -wal) from the latest one; both are mirrored in
    the lock file, which a copy of the store does not carry along. ``randomblob`` gives an existing store migrated
    to v5 its own run id too.
    """
    # deps: none
    return ("CREATE TABLE identity (id INTEGER PRIMARY KEY CHECK (id = 1), run_id TEXT NOT NULL,"
            " generation INTEGER NOT NULL)",
            *_crc_statements("identity"),
            "INSERT INTO identity (id, run_id, generation) VALUES (1, lower(hex(randomblob(16))), 0)")


def check_writable(path: str) -> None:
    """Before SQLite opens a store: its directory, and the file and its -wal/-shm if present, are writable.

    ``os.access`` answers for this process's user and for a read-only mount (``EROFS``), so root on a
    writable file system passes, as SQLite would.

    Raises:
        StoreNotWritable: naming the first path that cannot be written.
    """
    # deps: none
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise StoreNotWritable(path, f"its directory {directory} cannot be created ({exc.strerror})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StoreNotWritable(path, f"its directory {directory} is read-only for this process")
    for file in (path, f"{path}-wal", f"{path}-shm", f"{path}.lock"):
        if os.path.exists(file) and not os.access(file, os.R_OK | os.W_OK):
            raise StoreNotWritable(path, f"the file {file} is read-only for this process")


def check_file(path: str) -> bool:
    """Before SQLite opens an existing file: refuse an empty file or one that is not SQLite at all.

    Returns:
        Whether the file existed (a new store is created otherwise).

    Raises:
        StoreDamaged: a 0-byte file (SQLite would silently make it a brand-new empty store) or a bad header.
    """
    file = Path(path)
    if not file.exists():
        return False
    size = file.stat().st_size
    if size == 0:
        raise StoreDamaged(path, "the file exists but is empty (0 bytes), so it holds no pool, roles or transitions "
                                 "(a truncation, or a crash before the store was first written); if it was never "
                                 "used, delete it")
    with file.open("rb") as handle:
        header = handle.read(16)
    if header != b"SQLite format 3\x00":
        raise StoreDamaged(path, f"it is not an SQLite database (header {header!r}, {size} bytes)")
    return True
