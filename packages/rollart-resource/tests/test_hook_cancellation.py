"""Step 13: CancelledError in each hook phase, hooks that swallow cancellation, and cancelled callers.

None of these may leave a transition open in a live controller, stop other hooks hearing the outcome, or
let a hook keep the transition past its deadline.
"""

from __future__ import annotations

import asyncio

import pytest

from rollart.resource.hooks import call_hook
from rollart.resource.ledger import Transition, TransitionVetoed
from rollart.resource.manager import ResourceManager
from rollart.resource.testing import RecordingHook

POOL = {"H20": range(0, 6)}


class CancelledIn(RecordingHook):
    """Raises CancelledError (as a hook whose inner task was cancelled would) in one phase."""

    def __init__(self, phase, veto=None):
        super().__init__(veto=veto)
        self.phase = phase

    async def prepare(self, transition):
        await super().prepare(transition)
        if self.phase == "prepare":
            raise asyncio.CancelledError("inner task cancelled")

    async def commit(self, transition):
        await super().commit(transition)
        if self.phase == "commit":
            raise asyncio.CancelledError("inner task cancelled")

    async def abort(self, transition):
        await super().abort(transition)
        if self.phase == "abort":
            raise asyncio.CancelledError("inner task cancelled")


class SwallowsCancellation(RecordingHook):
    """Ignores the first cancellation in one phase and keeps working for `work` more seconds."""

    def __init__(self, phase, work=3.0):
        super().__init__()
        self.phase, self.work = phase, work
        self.finished = asyncio.Event()

    async def _stubborn(self):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # swallowed
        await asyncio.sleep(self.work)
        self.finished.set()

    async def prepare(self, transition):
        await super().prepare(transition)
        if self.phase == "prepare":
            await self._stubborn()

    async def commit(self, transition):
        await super().commit(transition)
        if self.phase == "commit":
            await self._stubborn()


@pytest.fixture
def rm():
    manager = ResourceManager(POOL)
    manager.allocate("gen", "rollout", 4)
    yield manager
    manager.close()


def failures(rm):
    return [(e.payload["method"], e.payload["hook"], e.payload["error"]) for e in rm.store.events()
            if e.kind == "hook_failed"]


async def test_cancelled_error_in_prepare_aborts_and_frees_the_ledger(rm):
    before, cancelled, after = RecordingHook(), CancelledIn("prepare"), RecordingHook()
    for hook in (before, cancelled, after):
        rm.add_transition_hook(hook)
    with pytest.raises(TransitionVetoed, match="hook prepare failed: CancelledError"):
        await rm.shrink("rollout", "train", [0])
    assert rm.pending_transition() is None and rm.store.transitions()[-1].phase == "aborted"
    assert before.methods() == ["prepare", "abort"] and cancelled.methods() == ["prepare", "abort"]
    assert after.methods() == ["abort"]
    cancelled.phase = None
    assert (await rm.shrink("rollout", "train", [0])).phase == "completed"  # no TransitionInFlight, no recover()


async def test_cancelled_error_in_commit_completes_and_is_recorded(rm):
    first, cancelled, last = RecordingHook(), CancelledIn("commit"), RecordingHook()
    for hook in (first, cancelled, last):
        rm.add_transition_hook(hook)
    t = await rm.shrink("rollout", "train", [1])
    assert t.phase == "completed" and rm.pending_transition() is None
    assert last.methods() == ["prepare", "commit"]  # the hook after the failing one still heard the commit
    assert failures(rm) == [("commit", "CancelledIn", "CancelledError: CancelledIn.commit raised CancelledError")]
    assert (await rm.expand("train", "rollout", [1])).phase == "completed"


async def test_cancelled_error_in_abort_does_not_silence_the_other_hooks(rm):
    first, cancelled, vetoer = RecordingHook(), CancelledIn("abort"), RecordingHook(veto="busy")
    for hook in (first, cancelled, vetoer):
        rm.add_transition_hook(hook)
    with pytest.raises(TransitionVetoed, match="busy"):
        await rm.shrink("rollout", "train", [2])
    # abort runs in reverse: vetoer, cancelled (raises CancelledError), then first must still hear it
    assert first.methods() == ["prepare", "abort"] and vetoer.methods() == ["prepare", "abort"]
    assert rm.pending_transition() is None and rm.store.transitions()[-1].phase == "aborted"
    assert [f[:2] for f in failures(rm)] == [("abort", "CancelledIn")]


async def test_prepare_deadline_holds_for_a_hook_that_swallows_cancellation(rm):
    stubborn = SwallowsCancellation("prepare", work=3.0)
    rm.add_transition_hook(stubborn)
    with pytest.raises(TransitionVetoed, match=r"prepare exceeded timeout=0.2s \(SwallowsCancellation\)"):
        await rm.shrink("rollout", "train", [0], timeout=0.2)
    # the caller got its answer while the hook was still busy: the deadline did not wait for it
    assert not stubborn.finished.is_set()
    assert rm.pending_transition() is None and stubborn.methods() == ["prepare", "abort"]


async def test_commit_deadline_holds_and_is_recorded(rm):
    stubborn = SwallowsCancellation("commit", work=5.0)
    rm.add_transition_hook(stubborn)
    t = await rm.shrink("rollout", "train", [0], timeout=0.2)  # commit hooks get NOTIFY_GRACE (1 s) at least
    assert t.phase == "completed" and not stubborn.finished.is_set()
    assert failures(rm) == [("commit", "SwallowsCancellation", "deadline exceeded")]


async def test_cancelled_caller_during_prepare_aborts(rm):
    gate, entered = asyncio.Event(), asyncio.Event()

    class Waits(RecordingHook):
        async def prepare(self, transition):
            await super().prepare(transition)
            entered.set()
            await gate.wait()

    hook = Waits()
    rm.add_transition_hook(hook)
    task = asyncio.ensure_future(rm.shrink("rollout", "train", [3]))
    await asyncio.wait_for(entered.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rm.pending_transition() is None
    assert rm.store.transitions()[-1].phase == "aborted" and hook.methods() == ["prepare", "abort"]
    assert "cancelled" in rm.store.transition_reason(rm.store.transitions()[-1].id)


async def test_cancelled_caller_after_commit_still_completes(rm):
    gate, entered = asyncio.Event(), asyncio.Event()

    class WaitsInCommit(RecordingHook):
        async def commit(self, transition):
            await super().commit(transition)
            entered.set()
            await gate.wait()

    slow, other = WaitsInCommit(), RecordingHook()
    rm.add_transition_hook(slow)
    rm.add_transition_hook(other)
    task = asyncio.ensure_future(rm.shrink("rollout", "train", [3]))
    await asyncio.wait_for(entered.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()  # the end of the transition runs shielded: the roles are applied, every hook hears the commit
    await asyncio.wait_for(asyncio.gather(*rm._background), timeout=10)
    assert rm.store.transitions()[-1].phase == "completed" and other.methods() == ["prepare", "commit"]
    assert rm.devices()[3].role == "train"


async def test_call_hook_outcomes():
    t = Transition("t", "shrink", "rollout", "train", (0,), "planned")
    background: set = set()
    assert (await call_hook(RecordingHook(), "prepare", t, 1.0, background)).ok
    vetoed = await call_hook(RecordingHook(veto="x"), "prepare", t, 1.0, background)
    assert isinstance(vetoed.error, TransitionVetoed) and vetoed.describe() == "RecordingHook.prepare failed: TransitionVetoed: x"
    late = await call_hook(SwallowsCancellation("prepare"), "prepare", t, 0.05, background)
    assert late.timed_out and len(background) == 1  # abandoned, still referenced until it ends
    for task in list(background):
        task.cancel()
