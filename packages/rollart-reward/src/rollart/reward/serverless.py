"""Wiring to `rollart.resource.register_serverless`: the reward service as a worker attribute.

`register_serverless(attribute=..., url=serverless_score_url(base), headers=serverless_headers(token))`
installs a `rollart.resource.ServerlessClient` (JSON POST -> JSON, retries on 5xx/timeouts) on every
worker. The token travels only in the `Authorization` header (register_serverless keeps headers out
of the metadata store; a token in the URL would be stored and logged). Idempotency still holds: the
keys travel in the body, so the client's retries are answered from the service's result cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollart import checks as check
from rollart.env.trajectory import Trajectory
from rollart.reward.client import idempotency_key
from rollart.reward.errors import RewardError
from rollart.reward.protocol import RewardResult


def serverless_score_url(base_url: str) -> str:
    """The service's `/v1/score` URL (for `register_serverless(url=...)`)."""
    # AST: AST_PRECONDITION(base_url.startswith(("http://", "https://")), got=base_url, msg="base_url is http(s)", exc=RewardError)
    check.precondition(base_url.startswith(("http://", "https://")), "base_url is http(s)", got=base_url, exc=RewardError)  # generated #8ed6e1e28a
    return f"{base_url.rstrip('/')}/v1/score"


def serverless_headers(token: str) -> dict[str, str]:
    """The bearer header for `register_serverless(headers=...)`."""
    # VAL: VAL_NON_EMPTY(token, exc=RewardError)
    check.non_empty("token", token, exc=RewardError)  # generated #189115d6b0
    return {"Authorization": f"Bearer {token}"}


def score_payload(reward: str, trajectories: Sequence[Trajectory], timeout_s: float | None = None) -> dict[str, Any]:
    """The JSON body of a batch, with one idempotency key per trajectory."""
    # VAL: VAL_NON_EMPTY(reward, exc=RewardError)
    check.non_empty("reward", reward, exc=RewardError)  # generated #3f2ced7ae5
    body: dict[str, Any] = {
        "reward": reward,
        "items": [{"key": idempotency_key(reward, t), "trajectory": t.model_dump(mode="json")} for t in trajectories],
    }
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    return body


def results_from_response(response: dict[str, Any]) -> list[RewardResult]:
    """Turn the service's JSON into results; an item that is not `ok` raises with its status and error."""
    out = []
    for item in response["results"]:
        if item["status"] != "ok":
            raise RewardError(f"item {item['key']} was not scored: {item['status']} {item.get('error') or ''}".strip())
        out.append(RewardResult(score=item["score"], details=item.get("details") or {}))
    return out
