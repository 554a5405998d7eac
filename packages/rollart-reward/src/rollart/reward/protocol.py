"""The reward-function protocol and the registry the service exposes.

Why async and stateless: rewards run in the EnvManager's loop, in the service's workers, or
behind `register_serverless`; an async `score(trajectory)` with no hidden state runs the same in
all three, and a retried call computes the same thing.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from rollart import checks as check
from rollart.env.trajectory import Trajectory
from rollart.reward.errors import RewardError


class RewardResult(BaseModel):
    """A score plus details (e.g. the extracted answer, the judge's raw text)."""

    score: float
    details: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class RewardFn(Protocol):
    """A stateless reward function of a finished trajectory.

    The same object serves in process (rollart-app wraps it into the `ScoringSink`'s scorer) and in
    the reward service (`RewardRegistry`, `/v1/score`), so it may not rely on either.
    """

    name: str
    """The registry key: unique and non-empty in a `RewardRegistry` (`register` checks both); a
    `/v1/score` request and a run config's `tasks[].reward.name` select the function by it."""

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Score one finished trajectory (its turns, `info`, `env_return`, ...).

        Called by the `ScoringSink` once per finished, not yet rewarded trajectory, and by the
        service once per item whose idempotency key has no stored result. Many calls run
        concurrently on one event loop, so it must never block the loop (run CPU-bound checks with
        `asyncio.to_thread`) and must keep no state between calls: the service may compute a key
        again after a timeout, and the result must be the same. Do not modify the trajectory
        (the sink sets `Trajectory.reward` from `RewardResult.score`).

        Returns a finite `score` (in process a non-finite one fails the trajectory) and
        JSON-serialisable `details` (the service stores and returns them). It runs under a deadline
        (`ScoringSink.deadline_s`, the service's per-request deadline) and is cancelled when it
        passes. An exception or a timeout is never a reward: in process the trajectory ends FAILED
        with the reason, in the service the item is answered `error` / `timeout` and may be
        retried under the same key.
        """
        ...


class RewardRegistry:
    """Named reward functions (what the service exposes at `/v1/score`)."""

    def __init__(self) -> None:
        """Start empty."""
        self._fns: dict[str, RewardFn] = {}

    def register(self, fn: RewardFn) -> RewardFn:
        """Add `fn` under `fn.name`; names are unique."""
        # VAL: VAL_NON_EMPTY(fn.name, exc=RewardError)
        check.non_empty("fn.name", fn.name, exc=RewardError)  # generated #d3110fb7a3
        # AST: AST_PRECONDITION(fn.name not in self._fns, got=fn.name, msg="reward names are unique", exc=RewardError)
        check.precondition(fn.name not in self._fns, "reward names are unique", got=fn.name, exc=RewardError)  # generated #bc09e5b683
        self._fns[fn.name] = fn
        return fn

    def get(self, name: str) -> RewardFn:
        """The function called `name`."""
        # VAL: VAL_ONE_OF(name, choices=self._fns, exc=RewardError)
        check.one_of("name", name, self._fns, exc=RewardError)  # generated #02778d6c5c
        return self._fns[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._fns)
