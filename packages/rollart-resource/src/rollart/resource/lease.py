"""One controller per store: an OS lock on ``<store>.lock`` that names its holder (design D17).

Why ``flock`` on a side file: the lock is held for the controller's whole life (SQLite's own lock only
for one transaction), and the kernel drops it when the process dies, however it dies, so a crash
never leaves a lock for an operator to clear and no lease has to expire on a wall clock. The holder
writes who it is into the file, so the second controller's error says whom to stop. The lock is per
open file, so a second manager in the same process is refused too.

The lock is not the whole story: a controller whose lock vanished (the file deleted by hand, a
network file system where ``flock`` is not shared) would go on writing. The store's fencing epoch
(``SqliteMetadataStore.acquire_controller``) refuses those writes; this module only keeps honest
controllers apart and says who holds the store.

The lock file is also the store's sidecar (design D31): the holder mirrors the store's run id and
generation into it after every commit, so a store file that is older than the last commit (a restored
backup, a deleted -wal) or belongs to another run is refused at open. It lives beside the store and is
not part of a copy of it, which is what makes it a witness.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import uuid
from pathlib import Path

from rollart import checks as check
from rollart.resource.errors import ResourceError

__all__ = ["ControllerLock", "ControllerLockHeld", "StaleController", "controller_identity"]


class ControllerLockHeld(ResourceError):
    """Another live controller holds the store; the message names it and says what to do."""


class StaleController(ResourceError):
    """This controller's fencing epoch is no longer the store's: another controller took the store over."""


def controller_identity() -> str:
    """``pid <n> on <host> (<token>)``: enough to find the process, and unique even when pids are reused."""
    return f"pid {os.getpid()} on {socket.gethostname()} ({uuid.uuid4().hex[:8]})"


class ControllerLock:
    """The exclusive, process-lifetime lock of one store file."""

    def __init__(self, store_path: str | Path) -> None:
        """Remember the lock file next to the store (``<store>.lock``); nothing is locked yet."""
        # deps: none
        self.path = Path(f"{store_path}.lock")
        self._fd: int | None = None
        self._holder = ""
        self._size = 0

    def acquire(self, holder: str) -> dict:
        """Take the lock without waiting and write the holder's identity into the lock file.

        Returns:
            The record the previous holder left (``run_id``/``generation`` of the store it last committed), or {}.

        Raises:
            ControllerLockHeld: another controller holds it; the message names that holder.
        """
        # deps: ControllerLock.holder, ControllerLock.read
        # AST: AST_PRECONDITION(self._fd is None, got=str(self.path), msg="this lock is not held already", exc=ResourceError)
        check.precondition(self._fd is None, "this lock is not held already", got_lazy=lambda: str(self.path), exc=ResourceError)  # generated #5240324468
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ControllerLockHeld(
                f"store {str(self.path)[:-5]} is held by another controller: {self.holder() or 'unknown holder'} "
                f"(lock file {self.path}). One controller per store: stop that controller, or wait for it to exit "
                "(the lock is released when its process ends), then start this one; to inspect the store meanwhile, "
                "open it with SqliteMetadataStore and read, without a ResourceManager") from None
        self._holder = holder
        self._fd = fd
        self._size = os.fstat(fd).st_size
        previous = self.read() or {}
        # keep the store identity the last holder mirrored: a crash before this holder's first commit must
        # not erase the witness of the generation the store reached
        self._write({**{k: v for k, v in previous.items() if k in ("run_id", "generation")}, "holder": holder})
        os.fsync(fd)
        return previous

    def read(self) -> dict | None:
        """The lock file's record (``holder``, and ``run_id``/``generation`` once a holder committed); None if unreadable."""
        # deps: none
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def record(self, run_id: str, generation: int) -> None:
        """Mirror the store identity after a commit: one ``pwrite`` without fsync (a kill never loses it).

        Why no fsync: after a power loss the mirror may be older than the store, which the open accepts (a store
        ahead of its mirror is a crash between the commit and this write); only a store behind it is refused.
        """
        # deps: none
        # AST: AST_PRECONDITION(self._fd is not None, got=str(self.path), msg="the lock is held", exc=ResourceError)
        check.precondition(self._fd is not None, "the lock is held", got_lazy=lambda: str(self.path), exc=ResourceError)  # generated #90516a9d23
        self._write({"holder": self._holder, "run_id": run_id, "generation": generation})

    def _write(self, record: dict) -> None:
        """One ``pwrite`` at offset 0, padded with spaces to cover the previous text (no truncate: a kill between a
        truncate and a write would leave an empty file)."""
        assert self._fd is not None
        data = json.dumps(record).encode().ljust(self._size)
        os.pwrite(self._fd, data, 0)
        self._size = len(data)

    def holder(self) -> str | None:
        """Who wrote the lock file last (the holder, while it is held); None if unreadable."""
        # deps: ControllerLock.read
        record = self.read()
        return str(record["holder"]) if record and "holder" in record else None

    @property
    def held(self) -> bool:
        """This object holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays, empty of meaning until the next holder writes it."""
        # deps: none
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
