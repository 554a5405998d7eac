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
        # >>> generated VAL_ONE_OF #657922a2a3 (edit the annotation, not this block)
        if self.kind not in LATENCY_KINDS:
            raise EnvError(f"self.kind must be one of {sorted(LATENCY_KINDS, key=repr)!r}, got {self.kind!r}")
        # <<< generated
        # VAL: VAL_FINITE(self.mean, exc=EnvError)
        # >>> generated VAL_FINITE #fba3222a0e (edit the annotation, not this block)
        if isinstance(self.mean, bool) or not isinstance(self.mean, (int, float)) or not (self.mean - self.mean == 0):
            raise EnvError(f"self.mean must be a finite number, got {self.mean!r}")
        # <<< generated
        # VAL: VAL_NON_NEGATIVE(self.std, exc=EnvError)
        # >>> generated VAL_NON_NEGATIVE #ad3167060c (edit the annotation, not this block)
        if not self.std >= 0:
            raise EnvError(f"self.std must be >= 0, got {self.std!r}")
        # <<< generated
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
        # >>> generated VAL_POSITIVE #abff05f88b (edit the annotation, not this block)
        if not mean_s > 0:
            raise EnvError(f"mean_s must be > 0, got {mean_s!r}")
        # <<< generated
        # VAL: VAL_NON_NEGATIVE(sigma, exc=EnvError)
        # >>> generated VAL_NON_NEGATIVE #c841270ed7 (edit the annotation, not this block)
        if not sigma >= 0:
            raise EnvError(f"sigma must be >= 0, got {sigma!r}")
        # <<< generated
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
        # >>> generated VAL_ONE_OF #65504cee9f (edit the annotation, not this block)
        if failure_kind not in FAILURE_KINDS:
            raise EnvError(f"failure_kind must be one of {sorted(FAILURE_KINDS, key=repr)!r}, got {failure_kind!r}")
        # <<< generated
        # AST: AST_PRECONDITION(0.0 <= failure_prob <= 1.0, got=failure_prob, msg="failure_prob in [0, 1]", exc=EnvError)
        # >>> generated AST_PRECONDITION #319d67e314 (edit the annotation, not this block)
        if not (0.0 <= failure_prob <= 1.0):
            raise EnvError(f"Pre-condition: failure_prob in [0, 1], got {failure_prob!r}")
        # <<< generated
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
