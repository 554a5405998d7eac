"""Step 2: the device-role ledger and its two-phase shrink/expand."""

from __future__ import annotations

import asyncio

import pytest

from rollart.resource.errors import ResourceError, TransitionInFlight, UnknownHardwareError
from rollart.resource.hardware import HardwareCatalogue
from rollart.resource.ledger import ROLES, Transition, TransitionHook, TransitionVetoed
from rollart.resource.manager import ResourceManager, validate_pool_spec
from rollart.resource.store import SqliteMetadataStore
from rollart.resource.testing import CrashingStore, RecordingHook, SimulatedCrash

POOL = {"H800": range(0, 4), "H20": range(4, 8)}


def roles(rm: ResourceManager) -> dict[int, tuple[str, str | None]]:
    return {d: (r.role, r.owner) for d, r in rm.devices().items()}


@pytest.fixture
def rm(tmp_path):
    manager = ResourceManager(POOL, store=tmp_path / "meta.db")
    manager.allocate("gen", "rollout", 4, hw="H20")
    manager.allocate("trainer", "train", 2, hw="H800")
    yield manager
    manager.close()


async def test_shrink_then_expand_restores_ledger(rm):
    hook = RecordingHook()
    rm.add_transition_hook(hook)
    before = roles(rm)
    shrunk = await rm.shrink("rollout", "train", [5, 4])
    assert shrunk.phase == "completed" and shrunk.devices == (4, 5) and shrunk.kind == "shrink"
    after = roles(rm)
    # only the roles of 4 and 5 changed; owners and every other device unchanged
    assert {d for d in before if before[d] != after[d]} == {4, 5}
    assert after[4] == ("train", "gen") and after[5] == ("train", "gen")
    assert all(r.role in ROLES for r in rm.devices().values())
    expanded = await rm.expand("train", "rollout", [4, 5])
    assert expanded.kind == "expand"
    assert roles(rm) == before
    assert hook.methods() == ["prepare", "commit", "prepare", "commit"]
    assert [c[2] for c in hook.calls] == ["planned", "committed", "planned", "committed"]
    kinds = [e.kind for e in rm.store.events()]
    assert kinds.count("transition_completed") == 2
    assert rm.pending_transition() is None


async def test_veto_aborts_and_leaves_store_unchanged(rm):
    agree, refuse = RecordingHook(), RecordingHook(veto="requests cannot migrate: pool too small")
    rm.add_transition_hook(agree)
    rm.add_transition_hook(refuse)
    before = roles(rm)
    with pytest.raises(TransitionVetoed, match="pool too small") as err:
        await rm.shrink("rollout", "train", [4])
    assert err.value.reason == "requests cannot migrate: pool too small"
    assert roles(rm) == before
    [t] = rm.store.transitions()
    assert t.phase == "aborted" and rm.store.transition_reason(t.id) == "requests cannot migrate: pool too small"
    assert agree.methods() == ["prepare", "abort"] and refuse.methods() == ["prepare", "abort"]
    assert rm.pending_transition() is None
    # the ledger accepts the next transition
    rm._hooks.remove(refuse)
    await rm.shrink("rollout", "train", [4])
    assert roles(rm)[4] == ("train", "gen")


async def test_prepare_deadline_and_error_abort(rm):
    class Slow:
        async def prepare(self, t):
            await asyncio.sleep(10)

        async def commit(self, t):
            pass

        async def abort(self, t):
            self.aborted = True

    slow = Slow()
    rm.add_transition_hook(slow)
    before = roles(rm)
    with pytest.raises(TransitionVetoed, match="timeout=0.05"):
        await rm.shrink("rollout", "train", [4], timeout=0.05)
    assert roles(rm) == before and slow.aborted

    class Broken(RecordingHook):
        async def prepare(self, t):
            raise RuntimeError("offload failed")

    rm._hooks[:] = [Broken()]
    with pytest.raises(TransitionVetoed, match="RuntimeError: offload failed"):
        await rm.shrink("rollout", "train", [4])
    assert roles(rm) == before


async def test_second_transition_in_flight_refused(rm):
    gate = asyncio.Event()
    entered = asyncio.Event()

    class Gate(RecordingHook):
        async def prepare(self, t):
            entered.set()
            await gate.wait()

    rm.add_transition_hook(Gate())
    first = asyncio.create_task(rm.shrink("rollout", "train", [4]))
    await entered.wait()
    snap = rm.store.snapshot()
    with pytest.raises(TransitionInFlight, match="in flight") as err:
        await rm.shrink("rollout", "train", [5])
    assert "phase 'planned'" in str(err.value)
    with pytest.raises(TransitionInFlight):
        rm.release("gen", [4])
    assert rm.store.snapshot() == snap
    gate.set()
    assert (await first).phase == "completed"


async def test_bad_input_store_unchanged(rm):
    snap = rm.store.snapshot()
    cases = [
        (dict(from_role="rollout", to_role="train", devices=[0]), "not held by from_role='rollout'"),  # trainer's
        (dict(from_role="rollout", to_role="train", devices=[99]), "not allowed: [99]"),
        (dict(from_role="rollout", to_role="train", devices=[4, 4]), "duplicates [4]"),
        (dict(from_role="rollout", to_role="train", devices=[]), "devices must not be empty"),
        (dict(from_role="rollout", to_role="free", devices=[4]), "to_role must be one of"),
        (dict(from_role="serve", to_role="train", devices=[4]), "from_role must be one of"),
        (dict(from_role="rollout", to_role="rollout", devices=[4]), "to_role differs"),
        (dict(from_role="rollout", to_role="train", devices=[4, 5, 6, 7]), "at least one device"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ResourceError) as err:
            await rm.shrink(**kwargs)
        assert message in str(err.value), (kwargs, str(err.value))
    with pytest.raises(ResourceError, match="timeout"):
        await rm.shrink("rollout", "train", [4], timeout=0)
    with pytest.raises(UnknownHardwareError, match="hw is a type in this pool"):
        rm.allocate("x", "reward", 1, hw="A100")
    with pytest.raises(ResourceError, match="role must be one of"):
        rm.allocate("x", "free", 1)
    with pytest.raises(ResourceError, match="count must be an integer in"):
        rm.allocate("x", "reward", 0)
    with pytest.raises(ResourceError, match="cannot allocate 3 free devices of hw='H800'"):
        rm.allocate("x", "reward", 3, hw="H800")
    with pytest.raises(ResourceError, match="an owner allocates for the role it holds"):
        rm.allocate("gen", "train", 1)
    with pytest.raises(ResourceError, match="not allowed"):
        rm.release("gen", [0])
    assert rm.store.snapshot() == snap


def test_pool_spec_validation(tmp_path):
    cat = HardwareCatalogue()
    assert validate_pool_spec({"H800": [3, 1], "H20": range(4, 6)}, cat) == {"H800": (1, 3), "H20": (4, 5)}
    with pytest.raises(UnknownHardwareError, match=r"not allowed: \['B300'\]"):
        validate_pool_spec({"B300": [0]}, cat)
    with pytest.raises(ResourceError, match=r"pool\['H20'\]: ids and seen must be disjoint, both contain \[2\]"):
        validate_pool_spec({"H800": [0, 1, 2], "H20": [2, 3]}, cat)
    with pytest.raises(ResourceError, match=r"pool\['H800'\]: ids must have unique elements"):
        validate_pool_spec({"H800": [0, 0]}, cat)
    with pytest.raises(ResourceError, match=r"pool\['H800'\]: ids must contain only integers .* got -1"):
        validate_pool_spec({"H800": [-1]}, cat)
    with pytest.raises(ResourceError, match=r"pool\['H800'\]: ids must not be empty"):
        validate_pool_spec({"H800": []}, cat)
    with pytest.raises(ResourceError, match="pool must not be empty"):
        validate_pool_spec({}, cat)
    # a reopened store must match its pool
    path = tmp_path / "m.db"
    ResourceManager(POOL, store=path).close()
    with pytest.raises(ResourceError, match=r"added \[8\]"):
        ResourceManager({"H800": range(0, 4), "H20": range(4, 9)}, store=path)
    with pytest.raises(ResourceError, match="a pool spec is given or the store already holds one"):
        ResourceManager(None, store=tmp_path / "empty.db")
    assert set(ResourceManager(None, store=path).devices()) == set(range(8))


def test_hook_protocol_is_checked(rm):
    assert isinstance(RecordingHook(), TransitionHook)
    with pytest.raises(ResourceError, match="TransitionHook"):
        rm.add_transition_hook(object())  # type: ignore[arg-type]


# a shrink makes 4 mutating store calls, each one SQLite transaction with its event:
# begin (planned), prepared, commit (committed), completed
@pytest.mark.parametrize("crash_before", [1, 2, 3, 4])
async def test_crash_recovery_each_point(tmp_path, crash_before):
    path = tmp_path / "meta.db"
    setup = ResourceManager(POOL, store=path)
    setup.allocate("gen", "rollout", 4, hw="H20")
    before = roles(setup)
    setup.close()
    crashing = ResourceManager(None, store=CrashingStore(SqliteMetadataStore(path), crash_before=crash_before))
    crashing.add_transition_hook(RecordingHook())
    with pytest.raises(SimulatedCrash):
        await crashing.shrink("rollout", "train", [4, 5])
    crashing.close()  # the process died: the kernel drops its controller lock (one controller per store, Step 14)
    # restart: a new manager on the same file
    restarted = ResourceManager(None, store=path)
    hook = RecordingHook()
    restarted.add_transition_hook(hook)
    result = await restarted.recover()
    now = roles(restarted)
    after = {**before, 4: ("train", "gen"), 5: ("train", "gen")}
    assert now in (before, after)
    assert restarted.pending_transition() is None
    if result is None:  # crashed before the plan was persisted
        assert crash_before == 1 and now == before
    elif result.phase == "aborted":
        assert now == before and hook.methods() == ["abort"]
    else:
        assert result.phase == "completed" and now == after
        assert hook.methods() == ["commit"]
    # the ledger works again
    await restarted.expand("train", "rollout", [4, 5]) if now == after else await restarted.shrink("rollout", "train", [4])
    restarted.close()


@pytest.mark.parametrize("crash_in", ["prepare", "commit"])
async def test_crash_in_hook_recovers(tmp_path, crash_in):
    path = tmp_path / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("gen", "rollout", 4, hw="H20")
    before = roles(rm)
    rm.add_transition_hook(RecordingHook(crash_in=crash_in))
    with pytest.raises(SimulatedCrash):
        await rm.shrink("rollout", "train", [6])
    rm.close()  # the process died: the kernel drops its controller lock (one controller per store, Step 14)
    restarted = ResourceManager(None, store=path)
    hook = RecordingHook()
    restarted.add_transition_hook(hook)
    result = await restarted.recover()
    if crash_in == "prepare":
        assert result.phase == "aborted" and roles(restarted) == before and hook.methods() == ["abort"]
    else:
        assert result.phase == "completed" and roles(restarted)[6] == ("train", "gen")
        assert hook.methods() == ["commit"]
    assert isinstance(result, Transition)


async def test_lender_may_grow_its_pool(rm):
    await rm.shrink("rollout", "train", [4])
    # gen now holds rollout devices and one lent to training: it may still grow its rollout pool
    assert rm.allocate("gen", "rollout", 1, hw="H800").devices == (2,)
    with pytest.raises(ResourceError, match="an owner allocates for the role it holds"):
        rm.allocate("gen", "reward", 1)
    await rm.expand("train", "rollout", [4])
    assert {d for d, r in rm.devices().items() if r.owner == "gen"} == {2, 4, 5, 6, 7}
