"""The reward-function protocol and the registry the service exposes.

Why async and stateless: rewards run in the EnvManager's loop, in the service's workers, or
behind `register_serverless`; an async `score(trajectory)` with no hidden state runs the same in
all three, and a retried call computes the same thing.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

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
        # >>> generated VAL_NON_EMPTY #d65d6adaea (edit the annotation, not this block)
        if len(fn.name) == 0:
            raise RewardError(f"fn.name must not be empty, got {fn.name!r}")
        # <<< generated
        # AST: AST_PRECONDITION(fn.name not in self._fns, got=fn.name, msg="reward names are unique", exc=RewardError)
        # >>> generated AST_PRECONDITION #d7129799ab (edit the annotation, not this block)
        if not (fn.name not in self._fns):
            raise RewardError(f"Pre-condition: reward names are unique, got {fn.name!r}")
        # <<< generated
        self._fns[fn.name] = fn
        return fn

    def get(self, name: str) -> RewardFn:
        """The function called `name`."""
        # VAL: VAL_ONE_OF(name, choices=self._fns, exc=RewardError)
        # >>> generated VAL_ONE_OF #c30424959d (edit the annotation, not this block)
        if name not in self._fns:
            raise RewardError(f"name must be one of {sorted(self._fns, key=repr)!r}, got {name!r}")
        # <<< generated
        return self._fns[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._fns)
