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
    """A stateless reward function of a finished trajectory."""

    name: str

    async def score(self, trajectory: Trajectory) -> RewardResult: ...


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
