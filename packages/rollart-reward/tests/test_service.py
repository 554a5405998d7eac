"""The reward service as a real process on 127.0.0.1: auth, limits, structured 4xx, idempotency,
deadlines, a kill mid-batch with restart, and the register_serverless wiring."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import httpx
import pytest

from rollart.env.trajectory import Trajectory, Turn
from rollart.reward.cache import ResultCache
from rollart.reward.client import RewardClient
from rollart.reward.errors import RewardRequestError, RewardTimeoutError

TOKEN = "test-token-123456"  # the conftest's server token


def make_traj(i, sleep_s=0.0, answer="<answer>4</answer>"):
    return Trajectory(
        id=f"traj-{i}",
        turns=[Turn(prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.1], response_text=answer)],
        info={"ground_truth": "4", "sleep_s": sleep_s},
    )


def test_result_cache_claims_once_and_takes_over_dead_owners(tmp_path):
    path = str(tmp_path / "c.sqlite")
    a = ResultCache(path, f"{os.getpid()}:a")
    live_other = ResultCache(path, "1:other")  # pid 1 is alive: its claims are respected
    dead_other = ResultCache(path, "999999999:dead")
    assert a.claim("k1").outcome == "claimed"
    assert live_other.claim("k1").outcome == "busy"
    assert a.complete("k1", 0.5, {"x": 1}) is True
    assert a.complete("k1", 0.9, {}) is False  # never stored twice
    done = live_other.claim("k1")
    assert done.outcome == "done" and done.result == {"score": 0.5, "details": {"x": 1}}
    assert dead_other.claim("k2").outcome == "claimed"
    assert a.claim("k2").outcome == "claimed"  # the owner process is gone: take over
    assert dead_other.complete("k2", 1.0, {}) is False  # the old owner lost its claim
    assert live_other.claim("k3").outcome == "claimed"
    live_other.release("k3")
    assert a.claim("k3").outcome == "claimed"
    assert a.completions() == {"k1": 1}


async def test_auth_limits_and_structured_errors(shared_server):
    url = shared_server.url
    good = {"reward": "format", "items": [{"key": "a", "trajectory": make_traj(0).model_dump(mode="json")}]}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"{url}/health")).json()["status"] == "ok"
        r = await http.post(f"{url}/v1/score", json=good)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        r = await http.post(f"{url}/v1/score", json=good, headers={"Authorization": "Bearer wrong-token"})
        assert r.status_code == 401
        r = await http.post(f"{url}/v1/score?access_token={TOKEN}", json=good)
        assert r.status_code == 401  # tokens in URLs are not accepted (they leak into logs and stores)
        assert (await http.get(f"{url}/metrics")).status_code == 401
        r = await http.post(f"{url}/v1/score", json=good, headers=auth)
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "ok"
        r = await http.post(f"{url}/v1/score", content=b"x" * (65 * 1024), headers=auth)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        r = await http.post(f"{url}/v1/score", content=b"{not json", headers=auth)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
        r = await http.post(f"{url}/v1/score", json={"reward": "format", "items": [{"key": "a"}]}, headers=auth)
        err = r.json()["error"]
        assert r.status_code == 422 and err["errors"][0]["field"] == "items.0.trajectory"
        many = {"reward": "format", "items": [{"key": str(i), "trajectory": {"id": str(i)}} for i in range(51)]}
        r = await http.post(f"{url}/v1/score", json=many, headers=auth)
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_items"
        r = await http.post(f"{url}/v1/score", json={**good, "reward": "nope"}, headers=auth)
        assert r.status_code == 404 and "format" in r.json()["error"]["allowed"]
        dup = {"reward": "format", "items": good["items"] * 2}
        r = await http.post(f"{url}/v1/score", json=dup, headers=auth)
        assert r.status_code == 422 and r.json()["error"]["code"] == "duplicate_keys"
        r = await http.get(f"{url}/nowhere")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    client = RewardClient(url, "wrong-token", max_attempts=5)
    with pytest.raises(RewardRequestError, match="HTTP 401 unauthorized"):
        await client.score("format", make_traj(1))
    assert client.attempts == 1  # a 4xx is not retried
    await client.aclose()


async def test_client_scores_and_a_repeat_is_served_from_the_cache(shared_server):
    client = RewardClient(shared_server.url, TOKEN)
    trajs = [make_traj(100 + i, sleep_s=0.01) for i in range(6)]
    first = await client.score_batch("slow", trajs, deadline_s=30)
    again = await client.score_batch("slow", trajs, deadline_s=30)
    assert [r.score for r in first] == [float(len(t.id)) for t in trajs] == [r.score for r in again]
    log = shared_server.scored_log()
    assert sorted(t.id for t in trajs) == sorted(x for x in log if x.startswith("traj-10"))  # scored once each
    math = await client.score_batch("math", [make_traj(1), make_traj(2, answer="<answer>5</answer>")])
    assert [r.score for r in math] == [1.0, 0.0]
    await client.aclose()


async def test_hung_and_failing_rewards_never_hold_the_caller_past_its_deadline(shared_server):
    client = RewardClient(shared_server.url, TOKEN, max_attempts=50)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(RewardTimeoutError, match="timeout"):
        await client.score("hang", make_traj(7), deadline_s=1.5)
    assert loop.time() - t0 < 10.0  # a generous bound: the deadline is what ended it, not a server
    with pytest.raises(RewardTimeoutError, match="reward function bug"):
        await client.score("boom", make_traj(8), deadline_s=1.0)
    assert (await client.score("format", make_traj(9))).score == 1.0  # the server is still fine
    await client.aclose()


@pytest.mark.slow
async def test_server_killed_mid_batch_restarts_and_nothing_is_lost_or_scored_twice(server_factory):
    srv = server_factory(workers=2).start()
    trajs = [make_traj(i, sleep_s=0.05 + 0.1 * (i % 8)) for i in range(16)]
    trajs.append(make_traj(99, sleep_s=6.0))  # certainly still running when the server dies
    client = RewardClient(srv.url, TOKEN, timeout_s=20.0, max_attempts=100, backoff_max_s=0.5)
    task = asyncio.create_task(client.score_batch("slow", trajs, deadline_s=120))

    def done_keys():
        try:
            with sqlite3.connect(srv.cache_path) as db:
                return {k for (k,) in db.execute("SELECT key FROM results WHERE state = 'done'")}
        except sqlite3.OperationalError:
            return set()

    for _ in range(600):
        if done_keys():
            break
        await asyncio.sleep(0.05)
    srv.kill()
    stored_before_kill = done_keys()
    assert 0 < len(stored_before_kill) < len(trajs)  # really mid-batch
    await asyncio.sleep(0.5)
    srv.start()
    results = await task
    assert [r.score for r in results] == [float(len(t.id)) for t in trajs]  # nothing lost
    with sqlite3.connect(srv.cache_path) as db:
        completions = dict(db.execute("SELECT key, completions FROM results"))
    assert completions == {f"slow:{t.id}": 1 for t in trajs}  # every result stored exactly once
    log = srv.scored_log()
    for key in stored_before_kill:  # results stored before the crash were never recomputed
        assert log.count(key.split(":", 1)[1]) == 1
    assert client.attempts >= 2
    await client.aclose()


async def test_register_serverless_installs_a_service_client_on_workers(shared_server):
    pytest.importorskip("rollart.resource.decorators")
    from rollart.resource.cluster import Cluster
    from rollart.resource.decorators import register_serverless
    from rollart.resource.manager import ResourceManager
    from rollart.resource.worker import Worker
    from rollart.reward.serverless import results_from_response, score_payload, serverless_headers, serverless_score_url

    url = serverless_score_url(shared_server.url)
    headers = serverless_headers(TOKEN)

    class RewardWorker(Worker):
        @register_serverless(attribute="reward_proxy", url=url, timeout=10, retries=2, headers=headers)
        async def compute_rewards(self, trajectories):
            trajs = [Trajectory.model_validate(t) for t in trajectories]
            response = await self.reward_proxy(score_payload("math", trajs))
            return [r.score for r in results_from_response(response)]

    rm = ResourceManager({"CPU": range(0, 2)})
    workers = await Cluster.create(rm, RewardWorker, role="reward", num_workers=2, name="rw")
    payload = [make_traj(300).model_dump(mode="json"), make_traj(301, answer="<answer>3</answer>").model_dump(mode="json")]
    assert await workers.compute_rewards(payload) == [[1.0, 0.0], [1.0, 0.0]]
    assert all(TOKEN not in repr(s) for s in rm.store.services())  # the secret is not in the store
    await workers.shutdown()
