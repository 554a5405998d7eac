"""`ResultCache`: the idempotency store of the reward service, a SQLite file shared by its workers.

Why SQLite: the service runs several worker processes and must survive a restart; a WAL-mode
SQLite file gives atomic claims across processes and durable results with no extra server.
A key moves `absent -> pending(owner) -> done`; a pending claim whose owner process is gone (a
killed server) or that its owner released (deadline passed) may be taken over. The completion is
a conditional update by the owner, so a result is stored once, and later requests for the key get
the stored result instead of a second scoring.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any

from rollart import checks as check
from rollart.reward.errors import RewardError

CLAIM_OUTCOMES = frozenset({"claimed", "done", "busy"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,            -- pending | done
    owner TEXT NOT NULL,            -- "<pid>:<boot id>" of the claiming worker
    score REAL,
    details TEXT,
    completions INTEGER NOT NULL DEFAULT 0
)
"""


@dataclass(frozen=True)
class Claim:
    """The outcome of `ResultCache.claim`: claimed (compute it), done (use `result`) or busy (wait)."""

    outcome: str
    result: dict[str, Any] | None = None


def _owner_alive(owner: str) -> bool:
    try:
        pid = int(owner.split(":", 1)[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


class ResultCache:
    """Cross-process claim/complete store for idempotency keys."""

    def __init__(self, path: str, owner: str) -> None:
        """Open (and create) the SQLite file; `owner` identifies this worker ("<pid>:<boot id>")."""
        # VAL: VAL_NON_EMPTY(path, exc=RewardError)
        check.non_empty("path", path, exc=RewardError)  # generated #2a59aab263
        # VAL: VAL_NON_EMPTY(owner, exc=RewardError)
        check.non_empty("owner", owner, exc=RewardError)  # generated #e450da8d9a
        self.path = path
        self.owner = owner
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self._lock = threading.Lock()  # one connection, used from the worker's threads one at a time

    def claim(self, key: str) -> Claim:
        """Atomically claim `key`, or return its stored result, or say another live worker has it."""
        # VAL: VAL_NON_EMPTY(key, exc=RewardError)
        check.non_empty("key", key, exc=RewardError)  # generated #acb163415b
        with self._lock:
            claim = self._claim_locked(key)
        # AST: AST_POSTCONDITION(claim.outcome in CLAIM_OUTCOMES, got=claim.outcome, exc=RewardError)
        check.postcondition(claim.outcome in CLAIM_OUTCOMES, "claim.outcome in CLAIM_OUTCOMES", got=claim.outcome, exc=RewardError)  # generated #e4c75ca46e
        return claim

    def _claim_locked(self, key: str) -> Claim:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT state, owner, score, details FROM results WHERE key = ?", (key,)).fetchone()
            if row is None:
                db.execute("INSERT INTO results (key, state, owner) VALUES (?, 'pending', ?)", (key, self.owner))
                claim = Claim("claimed")
            elif row[0] == "done":
                claim = Claim("done", {"score": row[2], "details": json.loads(row[3] or "{}")})
            elif row[1] == self.owner or not _owner_alive(row[1]):
                db.execute("UPDATE results SET owner = ? WHERE key = ?", (self.owner, key))
                claim = Claim("claimed")
            else:
                claim = Claim("busy")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        # AST: AST_POSTCONDITION(claim.outcome in CLAIM_OUTCOMES, got=claim.outcome, exc=RewardError)
        check.postcondition(claim.outcome in CLAIM_OUTCOMES, "claim.outcome in CLAIM_OUTCOMES", got=claim.outcome, exc=RewardError)  # generated #e4c75ca46e
        return claim

    def complete(self, key: str, score: float, details: dict[str, Any]) -> bool:
        """Store the result if this worker still owns the pending claim; False if it lost it."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE results SET state = 'done', score = ?, details = ?, completions = completions + 1 "
                "WHERE key = ? AND state = 'pending' AND owner = ?",
                (score, json.dumps(details, default=str), key, self.owner),
            )
            return cur.rowcount == 1

    def release(self, key: str) -> None:
        """Give up a pending claim (the item timed out or failed) so a retry may claim it."""
        with self._lock:
            self._db.execute("DELETE FROM results WHERE key = ? AND state = 'pending' AND owner = ?", (key, self.owner))

    def completions(self) -> dict[str, int]:
        """Key -> how many times a result was stored (tests assert 1 for every key)."""
        with self._lock:
            return dict(self._db.execute("SELECT key, completions FROM results WHERE state = 'done'").fetchall())

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()
