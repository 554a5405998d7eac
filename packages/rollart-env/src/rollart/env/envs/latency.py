"""`LatencyWrapper`: injects reset/step delays and failures drawn from distributions.

Why: the paper's experiments inject environment latency N(mu, sigma) per turn (Fig. 12a) and
production sees fail-slow and fail-stop environments (§8); the wrapper reproduces both on any
`Env`, with delays from `asyncio.sleep` so it runs in real or virtual time.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

from rollart import checks as check
from rollart.env.errors import EnvCrashedError, EnvError, TransientEnvError
from rollart.env.protocols import Env, ResetResult, StepResult

LATENCY_KINDS = frozenset({"fixed", "gaussian", "lognormal"})
FAILURE_KINDS = frozenset({"transient", "crash", "hang"})


@dataclass(frozen=True)
class LatencyDistribution:
    """A delay distribution in seconds, clipped at 0.

    fixed: `mean`; gaussian: N(mean, std); lognormal: exp(N(mean, std)) (parameters of the log).
    """

    kind: str = "fixed"
    mean: float = 0.0
    std: float = 0.0

    def __post_init__(self) -> None:
        # VAL: VAL_ONE_OF(self.kind, choices=LATENCY_KINDS, exc=EnvError)
        check.one_of("kind", self.kind, LATENCY_KINDS, exc=EnvError)  # generated #4799926c4f
        # VAL: VAL_FINITE(self.mean, exc=EnvError)
        check.finite("mean", self.mean, exc=EnvError)  # generated #56bcc73cec
        # VAL: VAL_NON_NEGATIVE(self.std, exc=EnvError)
        check.non_negative("std", self.std, exc=EnvError)  # generated #362a588c43
        pass

    def sample(self, rng: random.Random) -> float:
        """One delay (never negative)."""
        if self.kind == "gaussian":
            return max(0.0, rng.gauss(self.mean, self.std))
        if self.kind == "lognormal":
            return rng.lognormvariate(self.mean, self.std)
        return max(0.0, self.mean)

    @classmethod
    def lognormal_with_mean(cls, mean_s: float, sigma: float) -> LatencyDistribution:
        """A long-tailed lognormal whose mean is `mean_s` (mu = ln(mean_s) - sigma^2 / 2, D12).

        Why: traces give a mean and a spread, not the log-parameters `lognormal` takes.
        """
        # deps: none
        # VAL: VAL_POSITIVE(mean_s, exc=EnvError)
        check.positive("mean_s", mean_s, exc=EnvError)  # generated #a0c9af58cf
        # VAL: VAL_NON_NEGATIVE(sigma, exc=EnvError)
        check.non_negative("sigma", sigma, exc=EnvError)  # generated #e2c2321e50
        return cls("lognormal", math.log(mean_s) - sigma * sigma / 2.0, sigma)


class LatencyWrapper:
    """Wraps an `Env`: sleeps a sampled delay before each call and fails with `failure_prob`."""

    def __init__(
        self,
        env: Env,
        step_latency: LatencyDistribution | None = None,
        reset_latency: LatencyDistribution | None = None,
        failure_prob: float = 0.0,
        failure_kind: str = "transient",
        seed: int = 0,
    ) -> None:
        """`failure_kind`: 'transient' (TransientEnvError), 'crash' (EnvCrashedError) or 'hang' (never returns)."""
        # VAL: VAL_ONE_OF(failure_kind, choices=FAILURE_KINDS, exc=EnvError)
        check.one_of("failure_kind", failure_kind, FAILURE_KINDS, exc=EnvError)  # generated #6039366fbf
        # AST: AST_PRECONDITION(0.0 <= failure_prob <= 1.0, got=failure_prob, msg="failure_prob in [0, 1]", exc=EnvError)
        check.precondition(0.0 <= failure_prob <= 1.0, "failure_prob in [0, 1]", got=failure_prob, exc=EnvError)  # generated #d88dbed403
        self.env = env
        self.name = env.name
        self.system_prompt = env.system_prompt
        self.step_latency = step_latency or LatencyDistribution()
        self.reset_latency = reset_latency or LatencyDistribution()
        self.failure_prob = failure_prob
        self.failure_kind = failure_kind
        self.rng = random.Random(seed)

    async def _delay_and_maybe_fail(self, dist: LatencyDistribution) -> None:
        await asyncio.sleep(dist.sample(self.rng))
        if self.failure_prob and self.rng.random() < self.failure_prob:
            if self.failure_kind == "transient":
                raise TransientEnvError("injected transient failure")
            if self.failure_kind == "crash":
                raise EnvCrashedError("injected crash")
            await asyncio.Event().wait()  # hang: only the caller's deadline ends this

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Delay, maybe fail, then reset the inner env."""
        await self._delay_and_maybe_fail(self.reset_latency)
        return await self.env.reset(seed=seed)

    async def step(self, action: str) -> StepResult:
        """Delay, maybe fail (before the action is applied, so a retry is safe), then step."""
        await self._delay_and_maybe_fail(self.step_latency)
        return await self.env.step(action)

    async def close(self) -> None:
        """Close the inner env."""
        await self.env.close()
