"""Step 12: abort is persisted (``aborting``) before the hooks hear it, and recover() delivers every open phase."""

from __future__ import annotations

import pytest

from rollart.resource.ledger import OPEN_PHASES, PHASE_MOVES, TransitionVetoed
from rollart.resource.manager import ResourceManager
from rollart.resource.testing import RecordingHook, SimulatedCrash

POOL = {"H20": range(0, 6)}


class DiesInAbort(RecordingHook):
    """Records like RecordingHook; the process "dies" the first time it is told to abort."""

    def __init__(self, veto=None):
        super().__init__(veto=veto)
        self.dies = True

    async def abort(self, transition):
        await super().abort(transition)
        if self.dies:
            self.dies = False
            raise SimulatedCrash("killed while hooks hear the abort")


def roles(rm):
    return {d: (r.role, r.owner) for d, r in rm.devices().items()}


def test_aborting_is_an_open_phase():
    assert "aborting" in OPEN_PHASES
    assert PHASE_MOVES["planned"] == ("prepared", "aborting") and PHASE_MOVES["aborting"] == ("aborted",)


async def test_crash_while_hooks_hear_abort_is_finished_by_recover(tmp_path):
    path = tmp_path / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("gen", "rollout", 4)
    before = roles(rm)
    first, dying, vetoer = RecordingHook(), DiesInAbort(), RecordingHook(veto="pool too small")
    for hook in (first, dying, vetoer):
        rm.add_transition_hook(hook)
    with pytest.raises(SimulatedCrash):
        await rm.shrink("rollout", "train", [0])
    # abort goes in reverse order: the vetoer heard it, the dying hook heard it and died, `first` never heard it
    assert first.methods() == ["prepare"] and vetoer.methods() == ["prepare", "abort"]
    pending = rm.pending_transition()
    assert pending is not None and pending.phase == "aborting"
    assert rm.store.transition_reason(pending.id) == "pool too small"
    rm.close()  # the process died: the OS releases its lock

    restarted = ResourceManager(None, store=path)
    hooks = [RecordingHook(), RecordingHook(), RecordingHook()]
    for hook in hooks:
        restarted.add_transition_hook(hook)
    result = await restarted.recover()
    assert result.phase == "aborted" and roles(restarted) == before
    assert [h.methods() for h in hooks] == [["abort"]] * 3  # every hook hears the outcome, again
    assert restarted.pending_transition() is None
    kinds = [e.kind for e in restarted.store.events() if e.payload.get("id") == pending.id]
    assert kinds == ["transition_planned", "transition_aborting", "transition_recovering", "transition_aborted"]
    restarted.close()


async def test_veto_persists_aborting_then_aborted(tmp_path):
    rm = ResourceManager(POOL, store=tmp_path / "m.db")
    rm.allocate("gen", "rollout", 4)
    seen = []
    rm.subscribe(lambda e: seen.append(e.kind))

    class PhaseProbe(RecordingHook):
        async def abort(self, transition):
            await super().abort(transition)
            # while hooks hear the abort, the store already says so
            seen.append(f"store says {rm.pending_transition().phase}")

    rm.add_transition_hook(PhaseProbe(veto="no"))
    with pytest.raises(TransitionVetoed, match="no"):
        await rm.shrink("rollout", "train", [1])
    assert seen == ["transition_planned", "transition_aborting", "store says aborting", "transition_aborted"]
    rm.close()
