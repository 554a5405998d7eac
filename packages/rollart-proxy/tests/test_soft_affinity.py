"""Step 50: soft affinity (D51) routes to exactly one live worker, keeps to the preferred hardware
while it has room, spills instead of waiting once it is full, and stays O(log n) in workers."""

from __future__ import annotations

import asyncio
import math
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollart.proxy.errors import ProxyError
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.routing import AffinityRouter, LoadIndex, SoftAffinityRouter, WorkerView, make_router
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import run_virtual
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker

HW = ("H800", "H20", "A100")
CAPACITY = 3
AFFINITY = {"prefill": "H800", "decode": "H20", "default": "H800"}

worker_state = st.tuples(st.sampled_from(HW), st.booleans(), st.integers(0, CAPACITY), st.integers(0, 40))


def _request(tag: str) -> GenerateRequest:
    return GenerateRequest((1, 2), SamplingParams(max_tokens=4), tag=tag)


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(st.tuples(st.integers(0, 7), worker_state), min_size=1, max_size=120),
    tag=st.sampled_from(["prefill", "decode", "code"]),
    sticky=st.one_of(st.none(), st.integers(0, 7)),
    exclude=st.one_of(st.none(), st.integers(0, 7)),
)
def test_indexed_soft_choice_equals_the_view_choice(history, tag, sticky, exclude):
    index = LoadIndex(CAPACITY)
    final: dict[int, tuple[str, bool, int, int]] = {}
    for rank, (hw, active, inflight, tokens) in history:
        hw = final.get(rank, (hw,))[0]
        index.update(rank, hw, active, inflight, tokens)
        final[rank] = (hw, active, inflight, tokens)
    router = SoftAffinityRouter(AFFINITY)
    views = [WorkerView(r, hw, n, t, CAPACITY) for r, (hw, active, n, t) in sorted(final.items()) if active]
    if exclude is not None and len(views) > 1:
        views = [v for v in views if v.rank != exclude]
    sticky = sticky if exclude is None else None
    expected = router.choose(_request(tag), views, sticky) if views else None
    got = router.choose_indexed(_request(tag), index, sticky, exclude) if index.active_count(None) > 0 else None
    assert got == expected


class SoftRoutingMachine(RuleBasedStateMachine):
    """Workers come and go and fill up; every decision is checked against the pool it was made on."""

    def __init__(self) -> None:
        super().__init__()
        self.index = LoadIndex(CAPACITY)
        self.soft = SoftAffinityRouter(AFFINITY)
        self.hard = AffinityRouter(AFFINITY)
        self.workers: dict[int, list] = {}  # rank -> [hardware, active, inflight, tokens]

    def _push(self, rank: int) -> None:
        hw, active, inflight, tokens = self.workers[rank]
        self.index.update(rank, hw, active, inflight, tokens)

    @rule(rank=st.integers(0, 9), hw=st.sampled_from(HW))
    def add_worker(self, rank, hw):
        if rank not in self.workers:
            self.workers[rank] = [hw, True, 0, 0]
            self._push(rank)

    @precondition(lambda self: self.workers)
    @rule(data=st.data())
    def toggle_active(self, data):
        rank = data.draw(st.sampled_from(sorted(self.workers)))
        self.workers[rank][1] = not self.workers[rank][1]
        self._push(rank)

    @precondition(lambda self: any(w[2] for w in self.workers.values()))
    @rule(data=st.data())
    def finish_one(self, data):
        rank = data.draw(st.sampled_from(sorted(r for r, w in self.workers.items() if w[2])))
        self.workers[rank][2] -= 1
        self.workers[rank][3] = max(0, self.workers[rank][3] - 6)
        self._push(rank)

    @rule(tag=st.sampled_from(["prefill", "decode", "code"]), sticky=st.one_of(st.none(), st.integers(0, 9)))
    def route(self, tag, sticky):
        request = _request(tag)
        active = {r: w for r, w in self.workers.items() if w[1]}
        rank = self.soft.choose_indexed(request, self.index, sticky, None) if active else None
        room = {r: w for r, w in active.items() if w[2] < CAPACITY}
        preferred = AFFINITY.get(tag, AFFINITY["default"])
        preferred_room = {r for r, w in room.items() if w[0] == preferred}
        if rank is None:
            assert not room  # work-conserving: it waits only when no live worker has room
            return
        assert rank in room  # exactly one live worker with room
        if preferred_room:  # spare capacity on the preferred hardware: never spills
            assert rank in preferred_room
        hard = self.hard.choose_indexed(request, self.index, sticky, None)
        if hard is not None:  # where hard affinity routes, soft makes the same choice
            assert rank == hard
        self.workers[rank][2] += 1
        self.workers[rank][3] += 6
        self._push(rank)

    @invariant()
    def index_counts_agree(self):
        assert self.index.active_count(None) == sum(1 for w in self.workers.values() if w[1])


TestSoftRoutingMachine = SoftRoutingMachine.TestCase
TestSoftRoutingMachine.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)


@pytest.mark.parametrize("n", [64, 3000])
def test_a_soft_decision_touches_o_log_n_heap_entries(n, monkeypatch):
    """At 3,000 workers a decision reads O(log n) heap entries, not a view of every worker."""
    index = LoadIndex(4)
    for rank in range(n):  # the preferred hardware (H20) is a tenth of the pool and full
        index.update(rank, "H20" if rank % 10 == 0 else "H800", True, 4 if rank % 10 == 0 else rank % 3, rank % 97)
    reads = 0
    current = LoadIndex._current

    def counted(self, entry):
        nonlocal reads
        reads += 1
        return current(self, entry)

    monkeypatch.setattr(LoadIndex, "_current", counted)
    router = SoftAffinityRouter({"decode": "H20", "default": "H800"})
    decisions = 500
    for i in range(decisions):
        rank = router.choose_indexed(_request("decode"), index, None, None)
        assert rank is not None and rank % 10 != 0  # spilled off the full H20s
        index.update(rank, "H800", True, min(3, 1 + i % 3), 100 + i)  # the decision's load update
    assert reads <= decisions * 4 * math.log2(n)


def test_make_router_names_the_policy_and_the_choices():
    assert type(make_router("hard", AFFINITY)) is AffinityRouter
    assert type(make_router("soft", AFFINITY)) is SoftAffinityRouter
    with pytest.raises(ProxyError, match=r"policy must be one of \['hard', 'soft'\], got 'sloppy'"):
        make_router("sloppy", AFFINITY)


def _served_on(router, n_requests: int) -> list[str]:
    """Hardware that served each of ``n_requests`` concurrent decode requests: 1 H20 and 2 H800, 1 slot each."""

    async def go():
        hws = ("H20", "H800", "H800")
        workers = [InferenceWorker(f"w{i}-{hw}", partial(SimEngine, QWEN3_8B, lookup_hardware(hw)), hardware=hw, devices=(i,))
                   for i, hw in enumerate(hws)]
        for w in workers:
            await w.start()
        proxy = LLMProxy(workers, router=router, max_inflight_per_worker=1)
        outs = await asyncio.gather(*(proxy.generate(GenerateRequest((1, 2, 3), SamplingParams(max_tokens=64), tag="decode"))
                                      for _ in range(n_requests)))
        await proxy.close()
        return [o.worker_ids[0].split("-")[1] for o in outs]

    return run_virtual(go())


def test_a_full_preferred_pool_spills_to_the_idle_hardware_and_hard_affinity_waits():
    soft = _served_on(SoftAffinityRouter({"decode": "H20", "default": "H800"}), 3)
    hard = _served_on(AffinityRouter({"decode": "H20", "default": "H800"}), 3)
    assert sorted(soft) == ["H20", "H800", "H800"]  # the two that found the H20 full ran on the idle H800s
    assert hard == ["H20"] * 3  # one after the other on the one H20
