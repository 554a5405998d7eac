"""Step 6: serverless endpoints, against a small real JSON-POST server on 127.0.0.1."""

from __future__ import annotations

import json
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollart.resource.cluster import Cluster
from rollart.resource.decorators import register_serverless
from rollart.resource.errors import ResourceError, ServerlessError
from rollart.resource.manager import ResourceManager
from rollart.resource.serverless import ServerlessClient
from rollart.resource.worker import Worker


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
        self.server.hits[self.path] = self.server.hits.get(self.path, 0) + 1
        if self.path == "/reward":
            self._send(200, {"reward": float(len(body["traj"])), "echo": body})
        elif self.path == "/flaky" and self.server.hits[self.path] <= 2:
            self._send(503, {"error": "warming up"})
        elif self.path == "/flaky":
            self._send(200, {"ok": self.server.hits[self.path]})
        elif self.path == "/bad":
            self._send(422, {"error": "traj missing"})
        elif self.path == "/slow":
            time.sleep(0.5)  # the test server's own thread, not control-plane code
            self._send(200, {"late": True})
        elif self.path.startswith("/auth"):
            ok = self.headers.get("Authorization") == "Bearer s3cret"
            self._send(200 if ok else 401, {"auth": ok})
        elif self.path == "/text":
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")
        else:
            self._send(500, {"error": "always failing"})

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that timed out and left: expected here
        pass


@pytest.fixture
def server():
    httpd = _QuietServer(("127.0.0.1", 0), _Handler)
    httpd.hits = {}
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


async def test_client_against_real_server(server):
    base, httpd = server
    client = ServerlessClient(f"{base}/reward", timeout=5)
    assert await client({"traj": [1, 2, 3]}) == {"reward": 3.0, "echo": {"traj": [1, 2, 3]}}
    flaky = ServerlessClient(f"{base}/flaky", retries=3, backoff=0.01)
    assert await flaky({}) == {"ok": 3} and httpd.hits["/flaky"] == 3
    # the client pickles (Ray ships it) without its connection pool, and works after unpickling
    clone = pickle.loads(pickle.dumps(client))
    assert clone._client is None and await clone({"traj": []}) == {"reward": 0.0, "echo": {"traj": []}}
    await client.aclose()
    await clone.aclose()
    await flaky.aclose()


async def test_retries_then_clear_error(server):
    base, httpd = server
    failing = ServerlessClient(f"{base}/down", retries=2, backoff=0.01)
    with pytest.raises(ServerlessError, match=r"/down failed after 3 attempt\(s\): HTTP 500") as err:
        await failing({})
    assert err.value.attempts == 3 and httpd.hits["/down"] == 3
    bad = ServerlessClient(f"{base}/bad", retries=5, backoff=0.01)
    with pytest.raises(ServerlessError, match="HTTP 422 is a client error, not retried"):
        await bad({})
    assert httpd.hits["/bad"] == 1
    slow = ServerlessClient(f"{base}/slow", timeout=0.1, retries=1, backoff=0.01)
    with pytest.raises(ServerlessError, match="timed out after timeout=0.1s"):
        await slow({})
    with pytest.raises(ServerlessError, match="not JSON"):
        await ServerlessClient(f"{base}/text", retries=0)({})
    # nothing listens on this port: a transport error, retried, then a clear error
    refused = ServerlessClient("http://127.0.0.1:9/none", retries=1, backoff=0.01)
    with pytest.raises(ServerlessError, match=r"after 2 attempt\(s\): ConnectError"):
        await refused({})
    with pytest.raises(ResourceError, match="timeout"):
        ServerlessClient(base, timeout=0)
    with pytest.raises(ResourceError, match="url must be an http"):
        ServerlessClient("fc://x")


async def test_register_serverless_on_cluster(server):
    base, _ = server

    class RewardWorker(Worker):
        @register_serverless(attribute="reward_proxy", url=f"{base}/reward", timeout=5, retries=1)
        async def compute_rewards(self, traj):
            return (await self.reward_proxy({"traj": traj}))["reward"] + self.rank

        @register_serverless(attribute="broken_proxy", url=f"{base}/down", retries=0, mode="execute_rank0")
        async def broken(self):
            return await self.broken_proxy({})

    rm = ResourceManager({"CPU": range(0, 2)})
    seen = []
    rm.subscribe(seen.append)
    rewards = await Cluster.create(rm, RewardWorker, role="reward", num_workers=2, name="rw")
    assert await rewards.compute_rewards([1, 2]) == [2.0, 3.0]
    services = {s.name: s for s in rm.store.services()}
    assert services["rw.compute_rewards"].url == f"{base}/reward"
    assert services["rw.compute_rewards"].health == "healthy"
    with pytest.raises(ServerlessError, match="HTTP 500"):
        await rewards.broken()
    broken = {s.name: s for s in rm.store.services()}["rw.broken"]
    assert broken.health == "unhealthy" and "HTTP 500" in broken.last_error
    assert [e.kind for e in seen].count("service_registered") == 2
    await rewards.shutdown()


async def test_headers_sent_and_secrets_kept_out_of_the_store(server):
    base, _ = server
    assert await ServerlessClient(f"{base}/auth", headers={"Authorization": "Bearer s3cret"})({}) == {"auth": True}
    with pytest.raises(ServerlessError, match="HTTP 401"):
        await ServerlessClient(f"{base}/auth")({})

    class Scorer(Worker):
        @register_serverless(attribute="judge", url=f"{base}/auth?access_token=abc&model=m",
                             headers={"Authorization": "Bearer s3cret"})
        async def score(self):
            return await self.judge({})

    rm = ResourceManager({"CPU": range(0, 1)})
    scorers = await Cluster.create(rm, Scorer, role="reward", num_workers=1, name="s")
    assert await scorers.score() == [{"auth": True}]
    [service] = rm.store.services()
    assert service.url == f"{base}/auth?access_token=***&model=m"
    assert "s3cret" not in repr(rm.store.snapshot()) and "abc" not in repr(rm.store.snapshot())
    await scorers.shutdown()
