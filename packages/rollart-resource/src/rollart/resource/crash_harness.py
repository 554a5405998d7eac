"""Kill a real controller process at chosen moments, recover, and judge the ledger and what the hooks heard.

Why a harness of real processes: an in-process "crash" (an exception) unwinds ``finally`` blocks and
never stops a write half-way; SIGKILL does neither. The controller here is a separate interpreter
that loops over allocate / release / shrink / expand with hooks that log every call they hear to an
append-only file (one ``os.write`` per call, so a kill never leaves half a line). After the last
kill a clean controller recovers, and ``judge`` checks, from the SQLite file and the hook log:

* nothing is left open, every device has one known role, ``free`` iff no owner;
* replaying the event log gives the final ledger;
* for every transition and every hook: a completed one was heard as prepare then commit and never
  abort; an aborted one that a hook prepared was heard as abort after that prepare, never commit;
* no controller died of anything but our SIGKILL.

The controller script uses only the public API (``ResourceManager``, ``shrink``, ``expand``,
``allocate``, ``release``, ``recover``), and the judge reads the file with plain ``sqlite3``, so the
same harness measures an older version of the package (``src=`` puts it first on the path).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CONTROLLER_SCRIPT", "CrashReport", "judge", "run_crash_campaign"]

CONTROLLER_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, random, sys
    from rollart.resource.manager import ResourceManager
    from rollart.resource.errors import ResourceError
    from rollart.resource.ledger import TransitionVetoed

    path, log, seed, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    slow_abort, slow_prepare = float(sys.argv[5]), float(sys.argv[6])
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    rng = random.Random(seed)

    class LoggingHook:
        # writes one line per call it hears, before doing the (slow) work
        def __init__(self, name, veto_rate):
            self.name, self.veto_rate = name, veto_rate
        def hear(self, method, t):
            os.write(fd, f"{self.name} {method} {t.id} {os.getpid()}\\n".encode())
        async def prepare(self, t):
            self.hear("prepare", t)
            await asyncio.sleep(slow_prepare)
            if rng.random() < self.veto_rate:
                raise TransitionVetoed(f"{self.name} refuses")
        async def commit(self, t):
            self.hear("commit", t)
            await asyncio.sleep(slow_prepare)
        async def abort(self, t):
            self.hear("abort", t)
            await asyncio.sleep(slow_abort)

    async def main():
        print("start", flush=True)
        rm = ResourceManager({"H20": range(0, 8)}, store=path)
        for i, veto in enumerate((0.0, 0.15, 0.0)):
            rm.add_transition_hook(LoggingHook(f"h{i}", veto))
        await rm.recover()
        print("ready", flush=True)
        if mode == "recover":
            rm.close()
            return
        while True:
            ledger = rm.devices()
            rollout = sorted(d for d, r in ledger.items() if r.role == "rollout" and r.owner == "gen")
            lent = sorted(d for d, r in ledger.items() if r.role == "train" and r.owner == "gen")
            free = sorted(d for d, r in ledger.items() if r.role == "free")
            judge = sorted(d for d, r in ledger.items() if r.owner == "judge")
            op = rng.random()
            try:
                if op < 0.4 and len(rollout) > 1:
                    await rm.shrink("rollout", "train", rng.sample(rollout, rng.randint(1, min(2, len(rollout) - 1))))
                elif op < 0.8 and lent:
                    await rm.expand("train", "rollout", rng.sample(lent, rng.randint(1, len(lent))))
                elif op < 0.9 and free:
                    owner = "gen" if rng.random() < 0.6 else "judge"
                    rm.allocate(owner, "rollout" if owner == "gen" else "reward", 1)
                elif judge or rng.random() < 0.3:
                    rm.release("judge")
            except (ResourceError, TransitionVetoed):
                pass
            await asyncio.sleep(0)

    asyncio.run(main())
    """
)


@dataclass
class CrashReport:
    """What one campaign did and found.

    Attributes:
        kills: SIGKILLs delivered to a live controller.
        kills_in_recovery: of those, how many hit before the controller said it had recovered.
        transitions: transitions in the final store.
        violations: violation kind -> count (empty when the control plane held).
        examples: a few violation messages, for the report.
    """

    kills: int = 0
    kills_in_recovery: int = 0
    transitions: int = 0
    violations: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def add(self, kind: str, message: str) -> None:
        """Count one violation and keep the first messages."""
        self.violations[kind] += 1
        if len(self.examples) < 8:
            self.examples.append(f"{kind}: {message}")

    def merge(self, other: CrashReport) -> None:
        """Add another campaign's counts to this one."""
        self.kills += other.kills
        self.kills_in_recovery += other.kills_in_recovery
        self.transitions += other.transitions
        self.violations.update(other.violations)
        self.examples.extend(other.examples[: max(0, 8 - len(self.examples))])


def _env(src: Sequence[str] | None) -> dict[str, str]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([*src, env.get("PYTHONPATH", "")])
    return env


def _start(path: Path, log: Path, seed: int, mode: str, slow_abort: float, slow_prepare: float,
           src: Sequence[str] | None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CONTROLLER_SCRIPT, str(path), str(log), str(seed), mode,
                             str(slow_abort), str(slow_prepare)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(src), text=True)


def run_crash_campaign(workdir: Path, kill_delays_ms: Sequence[float], *, seed: int = 0, slow_abort: float = 0.02,
                       slow_prepare: float = 0.002, src: Sequence[str] | None = None) -> CrashReport:
    """Run one controller per delay, SIGKILL it that many ms after it started, then recover cleanly and judge.

    Args:
        workdir: an empty directory for the store and the hook log.
        kill_delays_ms: one kill per entry, measured from the controller's "start" line (before it opens the store).
        seed: seeds the controllers' choices of operations (each controller gets seed + its index).
        slow_abort: seconds each hook's abort takes (a wider window to die in while hooks hear the abort).
        slow_prepare: seconds each hook's prepare and commit take.
        src: source directories put first on the controllers' PYTHONPATH (measure another version).
    """
    path, log = workdir / "meta.db", workdir / "hooks.log"
    report = CrashReport()
    for i, delay in enumerate(kill_delays_ms):
        proc = _start(path, log, seed * 1000 + i, "run", slow_abort, slow_prepare, src)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if first.strip() != "start":
            proc.wait()
            report.add("controller_error", f"controller {i} did not start: {proc.stderr.read()[-800:]}")
            continue
        time.sleep(delay / 1000.0)
        died_alone = proc.poll() is not None
        if not died_alone:
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        if died_alone:
            report.add("controller_error", f"controller {i} exited {proc.returncode}: {err[-800:]}")
            continue
        report.kills += 1
        if "ready" not in out:
            report.kills_in_recovery += 1
    final = _start(path, log, seed * 1000 + 999, "recover", slow_abort, slow_prepare, src)
    _, err = final.communicate(timeout=120)
    if final.returncode != 0:
        report.add("recovery_error", f"final recovery exited {final.returncode}: {err[-800:]}")
        return report
    judge(path, log, report)
    return report


def judge(path: Path, log: Path, report: CrashReport) -> CrashReport:
    """Check the store and the hook log after recovery (see the module docstring); adds to report."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        ledger = {d: (role, owner) for d, role, owner in conn.execute("SELECT id, role, owner FROM devices")}
        transitions = {tid: (phase, json.loads(devices)) for tid, phase, devices in
                       conn.execute("SELECT id, phase, devices FROM transitions")}
        events = [(kind, json.loads(payload)) for kind, payload in
                  conn.execute("SELECT kind, payload FROM events ORDER BY seq")]
    finally:
        conn.close()
    report.transitions += len(transitions)
    for d, (role, owner) in ledger.items():
        if role not in ("rollout", "train", "reward", "env", "free") or (role == "free") != (owner is None):
            report.add("ledger", f"device {d} has role {role!r} owner {owner!r}")
    for tid, (phase, _) in transitions.items():
        if phase not in ("completed", "aborted"):
            report.add("left_open", f"transition {tid} left in phase {phase!r}")
    replay: dict[int, tuple[str, str | None]] = {}
    for kind, payload in events:
        if kind == "pool_created":
            replay = {d: ("free", None) for ids in payload["pool"].values() for d in ids}
        elif kind == "allocated":
            replay.update({d: (payload["role"], payload["owner"]) for d in payload["devices"]})
        elif kind == "released":
            replay.update({d: ("free", None) for d in payload["devices"]})
        elif kind == "transition_committed":
            replay.update({d: (payload["to_role"], replay[d][1]) for d in payload["devices"]})
    if replay != ledger:
        report.add("replay", f"event replay {replay} != ledger {ledger}")
    heard: dict[tuple[str, str], list[str]] = {}
    hooks: set[str] = set()
    for line in log.read_text().splitlines() if log.exists() else []:
        name, method, tid, _pid = line.split()
        hooks.add(name)
        heard.setdefault((name, tid), []).append(method)
    for tid, (phase, _) in transitions.items():
        for name in sorted(hooks):
            calls = heard.get((name, tid), [])
            if phase == "completed":
                last_prepare = max((i for i, m in enumerate(calls) if m == "prepare"), default=None)
                if "abort" in calls:
                    report.add("hook_heard_abort_of_completed", f"{name} heard {calls} for completed {tid}")
                elif last_prepare is None or "commit" not in calls[last_prepare:]:
                    report.add("hook_missed_commit", f"{name} heard {calls} for completed {tid}")
            elif phase == "aborted":
                if "commit" in calls:
                    report.add("hook_heard_commit_of_aborted", f"{name} heard {calls} for aborted {tid}")
                last_prepare = max((i for i, m in enumerate(calls) if m == "prepare"), default=None)
                if last_prepare is not None and "abort" not in calls[last_prepare:]:
                    report.add("hook_missed_abort", f"{name} heard {calls} for aborted {tid}")
    return report
