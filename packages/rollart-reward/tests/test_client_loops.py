"""One `RewardClient` across event loops (design D26): each loop gets its own connection pool, closed
on that loop when it shuts down; a second `asyncio.run` with the same client used to fail inside httpx
with "Event loop is closed"."""

from __future__ import annotations

import asyncio
import gc
import warnings

from rollart.env.trajectory import Trajectory
from rollart.reward.client import RewardClient

TOKEN = "test-token-123456"  # the conftest's server token


def unclosed_connections(caught: list[warnings.WarningMessage], port: int) -> list[str]:
    """Connections to the server that were garbage-collected open instead of closed on their loop."""
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)
            and ("transport" in str(w.message) or str(port) in str(w.message))]


def test_one_client_scores_in_two_consecutive_asyncio_runs(server):
    client = RewardClient(server.url, token=TOKEN)
    gc.collect()  # earlier garbage must not be counted below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        first = asyncio.run(client.score("env_success", Trajectory(id="run-1", success=True), deadline_s=20))
        second = asyncio.run(client.score("env_success", Trajectory(id="run-2", success=False), deadline_s=20))
        third = asyncio.run(client.score_batch("env_success", [Trajectory(id="run-1", success=True)], deadline_s=20))
        health = asyncio.run(client.health())
        gc.collect()
    assert (first.score, second.score, third[0].score) == (1.0, 0.0, 1.0)
    assert health["status"] == "ok"
    assert server.scored_log() == []  # env_success does not log; the cache answered run-1 the second time
    assert unclosed_connections(caught, server.port) == []  # each run's pool was closed on its own loop


def test_aclose_closes_the_pool_and_a_hand_closed_loop_does_not_break_the_client(server):
    client = RewardClient(server.url, token=TOKEN)

    async def score_then_close(tid: str) -> float:
        result = await client.score("env_success", Trajectory(id=tid, success=True), deadline_s=20)
        await client.aclose()
        return result.score

    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        # a loop closed by hand, without shutdown_asyncgens: only aclose() can close its pool
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(score_then_close("hand-1")) == 1.0
        finally:
            loop.close()
        del loop
        gc.collect()
        assert unclosed_connections(caught, server.port) == []

    # the same hand-made pattern without aclose(): the next loop still works (the lost pool is dropped)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(client.score("env_success", Trajectory(id="hand-2", success=True))).score == 1.0
    finally:
        loop.close()
    assert asyncio.run(score_then_close("after")) == 1.0
    assert asyncio.run(client.health())["status"] == "ok"  # usable after aclose
