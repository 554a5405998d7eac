"""A real controller process dies (os._exit) inside a shrink; a new process recovers from the SQLite file.

The in-process crash tests (test_ledger.py, test_ledger_machine.py) simulate death with an exception;
this one kills the interpreter, including in the middle of the SQL transaction that applies the roles,
to show the atomic point is SQLite's, not Python's.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from rollart.resource.manager import ResourceManager
from rollart.resource.testing import RecordingHook

CONTROLLER = textwrap.dedent(
    """
    import asyncio, os, sys
    from rollart.resource.manager import ResourceManager
    from rollart.resource.store import SqliteMetadataStore

    path, crash_in = sys.argv[1], sys.argv[2]

    class DyingHook:
        async def prepare(self, t):
            if crash_in == "prepare":
                os._exit(17)
        async def commit(self, t):
            if crash_in == "commit_hook":
                os._exit(17)
        async def abort(self, t):
            pass

    class DyingConnection:
        # delegates to the real connection; dies right after the roles UPDATE, before COMMIT
        def __init__(self, conn):
            self.conn = conn
        def execute(self, sql, *args):
            if crash_in == "mid_commit_sql" and sql.startswith("UPDATE transitions SET phase = 'committed'"):
                os._exit(17)
            return self.conn.execute(sql, *args)
        def __getattr__(self, name):
            return getattr(self.conn, name)

    store = SqliteMetadataStore(path)
    store._conn = DyingConnection(store._conn)
    rm = ResourceManager(None, store=store)
    rm.add_transition_hook(DyingHook())
    asyncio.run(rm.shrink("rollout", "train", [4, 5]))
    sys.exit(0)
    """
)


@pytest.mark.parametrize(
    "crash_in, open_phase, final",
    [
        ("prepare", "planned", "aborted"),  # rolled back
        # SQLite rolls the half-written commit back: the shrink is still "prepared", and recovery rolls it forward
        ("mid_commit_sql", "prepared", "completed"),
        ("commit_hook", "committed", "completed"),  # the hooks hear the commit again
    ],
)
async def test_killed_controller_recovers_before_or_after(tmp_path, crash_in, open_phase, final):
    path = tmp_path / "meta.db"
    setup = ResourceManager({"H800": range(0, 4), "H20": range(4, 8)}, store=path)
    setup.allocate("gen", "rollout", 4, hw="H20")
    before = {d: (r.role, r.owner) for d, r in setup.devices().items()}
    setup.close()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CONTROLLER, str(path), crash_in,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 17, stderr.decode()[-2000:]
    restarted = ResourceManager(None, store=path)
    pending = restarted.pending_transition()
    assert pending is not None and pending.phase == open_phase
    assert {d: (r.role, r.owner) for d, r in restarted.devices().items()} == (before if open_phase != "committed" else
                                                                             {**before, 4: ("train", "gen"),
                                                                              5: ("train", "gen")})
    hook = RecordingHook()
    restarted.add_transition_hook(hook)
    result = await restarted.recover()
    now = {d: (r.role, r.owner) for d, r in restarted.devices().items()}
    after = {**before, 4: ("train", "gen"), 5: ("train", "gen")}
    assert result.phase == final
    assert now == (before if final == "aborted" else after)
    assert hook.methods() == (["abort"] if final == "aborted" else ["commit"])
    assert restarted.pending_transition() is None
    restarted.close()
