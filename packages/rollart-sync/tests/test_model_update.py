"""ModelUpdateGroup: publish, fetch once, load into every worker; versions never go backwards."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rollart.sync.errors import StaleVersionError, SyncError, SyncTimeoutError, VersionNotAvailableError
from rollart.sync.local import LocalChannel
from rollart.sync.model_update import ModelUpdateGroup, WeightLoader


class TinyModelWorker:
    """A real torch module that loads weights the way an inference engine does: copy into its parameters."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        self.version: int | None = None
        self.history: list[int] = []
        self.delay = delay
        self.fail = fail

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("engine refused the weights")
        self.model.load_state_dict(dict(weights))  # copies: the channel's buffers stay untouched
        self.version = version
        self.history.append(version)


def _trained(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).state_dict().items()}


def _same(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


async def test_model_update_loads_every_worker_and_skips_held_versions():
    workers = [TinyModelWorker(), TinyModelWorker()]
    assert all(isinstance(w, WeightLoader) for w in workers)
    group = ModelUpdateGroup(LocalChannel(), workers, timeout=5.0)
    report = await group.model_update(_trained(1), 1)
    assert report.version == 1 and report.applied == (0, 1) and report.skipped == ()
    assert all(_same(w.model, _trained(1)) for w in workers)
    again = await group.update()
    assert again.applied == () and again.skipped == (0, 1)
    assert group.worker_versions() == (1, 1) and group.published_version == 1
    with pytest.raises(StaleVersionError):
        group.publish(_trained(0), 0)


async def test_a_failed_or_slow_worker_is_reported_and_not_advanced():
    ok, bad = TinyModelWorker(), TinyModelWorker(fail=True)
    group = ModelUpdateGroup(LocalChannel(), [ok, bad], timeout=5.0)
    with pytest.raises(SyncError, match=r"workers \[1\] failed to load version 1"):
        await group.model_update(_trained(1), 1)
    assert group.worker_versions() == (1, None)
    slow = ModelUpdateGroup(LocalChannel(), [TinyModelWorker(delay=5.0)], timeout=5.0)
    slow.publish(_trained(2), 2)
    with pytest.raises(SyncTimeoutError, match="worker 0 did not load version 2"):
        await slow.update(timeout=0.05)
    assert slow.worker_versions() == (None,)


class VersionOrderMachine(RuleBasedStateMachine):
    """Random interleavings of publishes and (concurrent) fetch-and-apply calls on one channel."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.workers = [TinyModelWorker(), TinyModelWorker()]
        self.group = ModelUpdateGroup(LocalChannel(keep_last=3), self.workers, timeout=5.0)
        self.published: dict[int, dict[str, torch.Tensor]] = {}
        self.next_version = 0

    def teardown(self) -> None:
        self.loop.close()

    @rule(gap=st.integers(1, 3))
    def publish(self, gap: int) -> None:
        self.next_version += gap
        v = self.next_version
        self.published[v] = _trained(v)

        async def publish_and_wait() -> int:
            return await self.group.publish(self.published[v], v).wait(1.0)  # publish runs inside the loop

        assert self.loop.run_until_complete(publish_and_wait()) == v

    @rule(stale=st.integers(0, 5))
    def publish_stale_is_refused(self, stale: int) -> None:
        if self.group.published_version is None:
            return
        try:
            self.group.publish(_trained(0), self.group.published_version - stale)
        except StaleVersionError:
            return
        raise AssertionError("a non-increasing version was accepted")

    @rule(picks=st.lists(st.integers(0, 12), min_size=1, max_size=3))
    def concurrent_updates(self, picks: list[int]) -> None:
        """Several updates race: "latest" and specific (possibly evicted or future) versions."""
        if not self.published:
            return

        async def one(pick: int):
            version = "latest" if pick == 0 else pick
            try:
                return await self.group.update(version, timeout=0.05)
            except (VersionNotAvailableError, SyncTimeoutError) as exc:
                return exc

        async def race():
            return await asyncio.gather(*(one(p) for p in picks))

        results = self.loop.run_until_complete(race())
        for r in results:
            if isinstance(r, SyncTimeoutError):
                assert r.args[0].startswith("version")  # only a never-published version may time out

    @invariant()
    def worker_versions_never_go_backwards_and_match_their_weights(self) -> None:
        for w in self.workers:
            assert w.history == sorted(set(w.history))
            if w.version is not None:
                assert _same(w.model, self.published[w.version])


VersionOrderMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)
TestVersionOrderMachine = VersionOrderMachine.TestCase
