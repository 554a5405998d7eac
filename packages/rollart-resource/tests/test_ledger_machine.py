"""Step 8: the ledger invariants of design/000-overview.md §5 under random allocate / release / shrink / expand /
worker failure / controller crash-and-restart sequences, the crash point drawn by hypothesis."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rollart.resource.cluster import Cluster
from rollart.resource.decorators import register
from rollart.resource.errors import ResourceError, WorkerFailedError
from rollart.resource.ledger import ROLES, TRANSITION_ROLES, TransitionVetoed
from rollart.resource.manager import ResourceManager
from rollart.resource.store import SqliteMetadataStore
from rollart.resource.testing import CrashingStore, RecordingHook, SimulatedCrash
from rollart.resource.worker import Worker

POOL = {"H800": range(0, 3), "H20": range(3, 8)}
HW_OF = {d: hw for hw, ids in POOL.items() for d in ids}
OWNERS = ("gen", "trainer", "judge")
# a shrink/expand makes 4 mutating store calls (planned, prepared, committed, completed, each with its event);
# 5 and 6 crash inside a hook's prepare / commit
CRASH_POINTS = st.integers(min_value=1, max_value=6)


class Ping(Worker):
    @register(mode="execute_all")
    def ping(self):
        return self.rank


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rollart-ledger-"))
        self.path = self.dir / "meta.db"
        self.loop = asyncio.new_event_loop()
        self.rm = self.open_manager()
        self.veto_hook = RecordingHook()
        self.rm.add_transition_hook(self.veto_hook)
        self.model: dict[int, tuple[str, str | None]] = {d: ("free", None) for d in HW_OF}
        self.clusters: list[Cluster] = []
        self.n_clusters = 0

    def open_manager(self):
        # a short lock deadline: a leaked write lock fails a step in 1 s instead of stalling shrinking
        return ResourceManager(POOL, store=SqliteMetadataStore(self.path, busy_timeout=1.0))

    def teardown(self):
        self.rm.close()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def ledger(self):
        return {d: (r.role, r.owner) for d, r in self.rm.devices().items()}

    # -- model of the rules ----------------------------------------------------------------
    def expected_transition(self, kind, from_role, to_role, devices):
        held = [d for d, (role, _) in self.model.items() if role == from_role]
        return (from_role in TRANSITION_ROLES and to_role in TRANSITION_ROLES and from_role != to_role
                and len(devices) > 0 and len(set(devices)) == len(devices) and set(devices) <= set(held)
                and (kind != "shrink" or len(held) > len(devices)))

    def moved(self, to_role, devices):
        return {**self.model, **{d: (to_role, self.model[d][1]) for d in devices}}

    # -- rules --------------------------------------------------------------------------------
    @rule(owner=st.sampled_from(OWNERS), role=st.sampled_from(TRANSITION_ROLES + ("free",)),
          count=st.integers(0, 4), hw=st.sampled_from([None, "H800", "H20", "A100"]))
    def allocate(self, owner, role, count, hw):
        free = {t: sorted(d for d, (r, _) in self.model.items() if r == "free" and HW_OF[d] == t) for t in POOL}
        held = {r for r, o in self.model.values() if o == owner}
        types = [hw] if hw else list(POOL)
        ok = (role in TRANSITION_ROLES and 1 <= count and hw in (None, *POOL) and (not held or role in held)
              and any(len(free[t]) >= count for t in types if t in free))
        before = self.rm.store.snapshot().devices
        try:
            alloc = self.rm.allocate(owner, role, count, hw=hw)
        except ResourceError:
            assert not ok
            assert self.rm.store.snapshot().devices == before
            return
        assert ok
        assert alloc.devices == tuple(free[alloc.hw][:count])
        for d in alloc.devices:
            self.model[d] = (role, owner)

    @rule(owner=st.sampled_from(OWNERS))
    def release(self, owner):
        freed = self.rm.release(owner)
        assert freed == tuple(sorted(d for d, (_, o) in self.model.items() if o == owner))
        for d in freed:
            self.model[d] = ("free", None)

    @rule(data=st.data(), kind=st.sampled_from(["shrink", "expand"]),
          from_role=st.sampled_from(TRANSITION_ROLES), to_role=st.sampled_from(TRANSITION_ROLES + ("free",)),
          veto=st.booleans(), pick_held=st.booleans())
    def transition(self, data, kind, from_role, to_role, veto, pick_held):
        held_roles = sorted({r for r, _ in self.model.values() if r != "free"})
        if pick_held and held_roles:  # mostly-valid moves: a role that holds devices, to another role
            from_role = data.draw(st.sampled_from(held_roles))
            to_role = data.draw(st.sampled_from([r for r in TRANSITION_ROLES if r != from_role]))
        pool = sorted(d for d, (r, _) in self.model.items() if r == from_role) if pick_held else sorted(HW_OF)
        devices = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True)) if pool else []
        ok = self.expected_transition(kind, from_role, to_role, devices)
        self.veto_hook.veto = "no" if veto else None
        before = self.ledger()
        call = self.rm.shrink if kind == "shrink" else self.rm.expand
        try:
            t = self.run(call(from_role, to_role, devices))
        except TransitionVetoed:
            assert ok and veto
            assert self.ledger() == before
            event("vetoed")
            return
        except ResourceError:
            assert not ok
            assert self.ledger() == before
            return
        finally:
            self.veto_hook.veto = None
        assert ok and not veto and t.phase == "completed"
        event(f"{kind} applied")
        self.model = self.moved(to_role, devices)

    @initialize(gen=st.integers(0, 5), trainer=st.integers(0, 3))
    def pools(self, gen, trainer):
        """Start most runs with a rollout and a train pool, so transitions are often valid."""
        for owner, role, count, hw in (("gen", "rollout", gen, "H20"), ("trainer", "train", trainer, "H800")):
            if count:
                for d in self.rm.allocate(owner, role, count, hw=hw).devices:
                    self.model[d] = (role, owner)

    @rule(data=st.data(), crash_point=CRASH_POINTS, kind=st.sampled_from(["shrink", "expand"]))
    def crash_and_restart(self, data, crash_point, kind):
        roles = sorted({r for r, _ in self.model.values() if r != "free"})
        if not roles:
            return
        from_role = data.draw(st.sampled_from(roles))
        to_role = data.draw(st.sampled_from([r for r in TRANSITION_ROLES if r != from_role]))
        held = sorted(d for d, (r, _) in self.model.items() if r == from_role)
        limit = len(held) - 1 if kind == "shrink" else len(held)
        if limit < 1:
            return
        devices = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=min(limit, 3), unique=True))
        assert self.expected_transition(kind, from_role, to_role, devices)
        self.rm.close()
        crashing = CrashingStore(SqliteMetadataStore(self.path), crash_before=crash_point if crash_point <= 4 else None)
        doomed = ResourceManager(None, store=crashing)
        if crash_point > 4:
            doomed.add_transition_hook(RecordingHook(crash_in="prepare" if crash_point == 5 else "commit"))
        try:
            self.run((doomed.shrink if kind == "shrink" else doomed.expand)(from_role, to_role, devices))
            raise AssertionError("the controller was meant to crash")
        except SimulatedCrash:
            pass
        doomed.close()
        self.clusters.clear()  # the controller died: its in-process cluster proxies are gone
        # restart on the same file, recover
        self.rm = self.open_manager()
        self.rm.add_transition_hook(self.veto_hook)
        self.run(self.rm.recover())
        after = self.moved(to_role, devices)
        now = self.ledger()
        assert now in (self.model, after), "a crash left the ledger half-applied"
        event(f"crash at {crash_point}: " + ("rolled back" if now == self.model else "rolled forward"))
        self.model = now

    @rule(n=st.integers(1, 2), role=st.sampled_from(TRANSITION_ROLES))
    def start_cluster(self, n, role):
        if len(self.clusters) >= 2:
            return
        name = f"cluster{self.n_clusters}"
        self.n_clusters += 1
        free = sorted(d for d, (r, _) in self.model.items() if r == "free")
        try:
            cluster = self.run(Cluster.create(self.rm, Ping, role=role, num_workers=n, name=name))
        except ResourceError:
            assert n > len(free)
            event("cluster refused")
            return
        self.clusters.append(cluster)
        for rank in cluster.ranks:
            for d in cluster._members[rank].devices:
                self.model[d] = (role, name)

    @rule(data=st.data())
    def worker_failure(self, data):
        if not self.clusters:
            return
        cluster = data.draw(st.sampled_from(self.clusters))
        if not cluster.ranks:
            return
        rank = data.draw(st.sampled_from(cluster.ranks))
        member = cluster._members[rank]
        self.run(cluster._runtime.kill(member.handle))
        try:
            self.run(cluster.ping())
            raise AssertionError("a dead worker answered")
        except WorkerFailedError as exc:
            if exc.action == "removed":
                for d in member.devices:
                    self.model[d] = ("free", None)
            else:
                assert exc.action == "restarted"
            event(f"worker {exc.action}")

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def one_role_per_device_and_model_matches(self):
        ledger = self.rm.devices()
        assert set(ledger) == set(HW_OF)
        for d, rec in ledger.items():
            assert rec.role in ROLES and rec.hw == HW_OF[d]
            assert (rec.role == "free") == (rec.owner is None)
        assert self.ledger() == self.model
        assert self.rm.pending_transition() is None


TestLedgerMachine = pytest.mark.timeout(300)(LedgerMachine.TestCase)
TestLedgerMachine.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)
