"""Step 23: the O(log n) routing index makes exactly the decision of the view-based router (D16)."""

from __future__ import annotations

import asyncio
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.proxy.proxy import ACTIVE, DRAINING, LLMProxy
from rollart.proxy.routing import AffinityRouter, LoadIndex, WorkerView
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import run_virtual
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker

HW = ("H800", "H20", "A100")
CAPACITY = 3

worker_state = st.tuples(st.sampled_from(HW), st.booleans(), st.integers(0, CAPACITY), st.integers(0, 40))


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(st.tuples(st.integers(0, 7), worker_state), min_size=1, max_size=120),
    tag=st.sampled_from(["lake", "math", "code"]),
    affinity=st.sampled_from([None, {"lake": "H800", "default": "H20"}, {"lake": "A100", "math": "H800", "default": "H800"}]),
    sticky=st.one_of(st.none(), st.integers(0, 7)),
    exclude=st.one_of(st.none(), st.integers(0, 7)),
)
def test_indexed_choice_equals_the_view_choice(history, tag, affinity, sticky, exclude):
    index = LoadIndex(CAPACITY)
    final: dict[int, tuple[str, bool, int, int]] = {}
    for rank, (hw, active, inflight, tokens) in history:  # many updates: exercises lazy invalidation
        hw = final.get(rank, (hw,))[0]  # a worker keeps its hardware
        index.update(rank, hw, active, inflight, tokens)
        final[rank] = (hw, active, inflight, tokens)
    router = AffinityRouter(affinity)
    request = GenerateRequest((1, 2), SamplingParams(max_tokens=4), tag=tag)
    # the proxy's view path: active workers, the migrated-from one filtered while another is active
    views = [WorkerView(r, hw, n, t, CAPACITY) for r, (hw, active, n, t) in sorted(final.items()) if active]
    if exclude is not None and len(views) > 1:
        views = [v for v in views if v.rank != exclude]
    expected = router.choose(request, views, sticky if exclude is None else None) if views else None
    has_active = index.active_count(None) > 0
    got = router.choose_indexed(request, index, sticky if exclude is None else None, exclude) if has_active else None
    assert has_active == bool(views)
    assert got == expected


def test_proxy_index_follows_inflight_and_state_changes():
    async def go():
        workers = [
            InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware("H20")), hardware="H20", devices=(i,))
            for i in range(3)
        ]
        for w in workers:
            await w.start()
        proxy = LLMProxy(workers, max_inflight_per_worker=2)
        index = proxy._index
        slot = proxy.slots[1]
        slot.inflight["a"] = 100
        slot.inflight["b"] = 50
        full = (index.routable(1), index.least_loaded(None, None))
        del slot.inflight["a"]
        partly = (index.routable(1), index.least_loaded(None, 0))
        slot.inflight.pop("b")
        slot.state = DRAINING
        drained = (index.active_count("H20"), index.least_loaded(None, 0))
        slot.state = ACTIVE
        back = index.active_count("H20")
        outs = await asyncio.gather(*(proxy.generate(GenerateRequest((1, 2, 3), SamplingParams(max_tokens=3))) for _ in range(9)))
        await proxy.close()
        return full, partly, drained, back, outs, [len(s.inflight) for s in proxy.slots]

    full, partly, drained, back, outs, left = run_virtual(go())
    assert full == (False, 0)  # two requests: worker 1 is full, worker 0 (empty, lowest rank) wins
    assert partly == (True, 2)  # worker 1 holds 50 tokens; excluding 0 leaves 2 (0 tokens)
    assert drained == (2, 2)
    assert back == 3
    assert all(o.finish_reason == "length" for o in outs) and left == [0, 0, 0]
