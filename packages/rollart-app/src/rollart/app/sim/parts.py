"""Simulation parts for `rollart sim` (design D22): a synthetic workload behind the real seams.

Each part here is a *simulation*, named as such, and plugs into the same builder as a real run:

    SyntheticEnv            env `synthetic`: turns and observation lengths drawn per episode, its
                            latency and failures from rollart-env's `LatencyWrapper`
    SyntheticPrompts        the prompt builder of `synthetic`: an observation "n" becomes n token ids
    SampledResponseLength   an LLMClient wrapper capping each turn's max_tokens at a sampled length
                            (SimEngine decodes to max_tokens; the real policy would stop at EOS)
    synthetic_reward        1.0 for a finished trajectory (a simulation does not learn)

The elastic simulated trainer is `rollart.app.sim.trainer` (it needs torch; these parts do not).

Token counts and latencies are drawn from `Distribution` specs: `fixed` (mean), `gaussian`
N(mean, std) clipped at 0, `lognormal` with the given *mean* and log-sigma `std` (long tail).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollart import checks as check
from rollart.env.envs.latency import LatencyDistribution, LatencyWrapper
from rollart.env.protocols import GenerationRequest, GenerationResult, ResetResult, StepResult
from rollart.env.trajectory import Trajectory
from rollart.scheduler.errors import ConfigError

DIST_KINDS = ("fixed", "gaussian", "lognormal")


@dataclass(frozen=True)
class Distribution:
    """A non-negative quantity (seconds or tokens): fixed, gaussian or lognormal-with-mean, capped at `max`."""

    kind: str = "fixed"
    mean: float = 0.0
    std: float = 0.0
    max: float | None = None

    def __post_init__(self) -> None:
        """Refuse unknown kinds and negative figures, naming the field."""
        # VAL: VAL_ONE_OF(self.kind, choices=DIST_KINDS, exc=ConfigError)
        check.one_of("kind", self.kind, DIST_KINDS, exc=ConfigError)  # generated #eca85a8b22
        # VAL: VAL_NON_NEGATIVE(self.mean, exc=ConfigError)
        check.non_negative("mean", self.mean, exc=ConfigError)  # generated #5a0239b3fd
        # VAL: VAL_NON_NEGATIVE(self.std, exc=ConfigError)
        check.non_negative("std", self.std, exc=ConfigError)  # generated #6426593599

    @classmethod
    def of(cls, spec: Any) -> Distribution:
        """From a number (fixed), a mapping {kind, mean, std, max} or a Distribution."""
        if isinstance(spec, Distribution):
            return spec
        if isinstance(spec, Mapping):
            return cls(**spec)
        return cls("fixed", float(spec))

    def latency(self) -> LatencyDistribution:
        """The same law as rollart-env's LatencyDistribution (the cap is applied by `sample`)."""
        if self.kind == "lognormal" and self.mean > 0:
            return LatencyDistribution.lognormal_with_mean(self.mean, self.std)
        if self.kind == "gaussian":
            return LatencyDistribution("gaussian", self.mean, self.std)
        return LatencyDistribution("fixed", self.mean, 0.0)

    def sample(self, rng: random.Random) -> float:
        """One draw, >= 0 and <= max."""
        value = self.latency().sample(rng)
        return value if self.max is None else min(value, self.max)

    def sample_int(self, rng: random.Random, low: int = 1) -> int:
        """One draw rounded to an integer >= `low`."""
        return max(low, int(round(self.sample(rng))))


class _SyntheticCore:
    """The episode itself: `turns` turns, each observation a count of tokens; no delays (LatencyWrapper adds them)."""

    name = "synthetic"
    system_prompt = ""

    def __init__(self, turns: Distribution, prompt_tokens: Distribution, observation_tokens: Distribution) -> None:
        self.turns_dist, self.prompt_dist, self.obs_dist = turns, prompt_tokens, observation_tokens
        self.rng = random.Random(0)
        self.turns = 1
        self.done = 0

    async def reset(self, seed: int | None = None) -> ResetResult:
        self.rng = random.Random(seed)
        self.turns = self.turns_dist.sample_int(self.rng)
        self.done = 0
        return ResetResult(str(self.prompt_dist.sample_int(self.rng)), {})

    async def step(self, action: str) -> StepResult:
        self.done += 1
        end = self.done >= self.turns
        return StepResult(str(self.obs_dist.sample_int(self.rng)), 1.0 if end else 0.0, end, False, {"success": end})

    async def close(self) -> None:
        return None


def synthetic_env(turns: Any = 4, prompt_tokens: Any = 512, observation_tokens: Any = 128, step_latency: Any = 0.0,
                  reset_latency: Any = 0.0, failure_prob: float = 0.0, failure_kind: str = "crash", seed: int = 0) -> Any:
    """Env `synthetic` (a simulation): a `_SyntheticCore` inside rollart-env's LatencyWrapper.

    The episode's shape comes from the reset seed (the group's seed, so a GRPO group shares it);
    latencies and failures from the wrapper's own generator, seeded from the running loop's `rng`
    (rollart-resource's VirtualTimeLoop has one seeded per run) so a run is deterministic for a seed.
    """
    loop_rng = getattr(asyncio.get_running_loop(), "rng", None)
    wrapper_seed = loop_rng.randrange(1 << 62) if loop_rng is not None else random.randrange(1 << 62)
    core = _SyntheticCore(Distribution.of(turns), Distribution.of(prompt_tokens), Distribution.of(observation_tokens))
    step, reset = Distribution.of(step_latency), Distribution.of(reset_latency)
    return LatencyWrapper(core, step_latency=step.latency(), reset_latency=reset.latency(), failure_prob=failure_prob,
                          failure_kind=failure_kind, seed=seed ^ wrapper_seed)


class SyntheticPrompts:
    """Prompt builder of `synthetic`: observation "n" -> n token ids; responses decode to ""."""

    def __init__(self, tokenizer: Any = None) -> None:
        """The tokenizer is not needed (token counts are the whole story)."""

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        """`int(observation)` token ids."""
        return [1] * max(1, int(observation))

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        """`int(observation)` token ids of environment feedback."""
        return [2] * max(1, int(observation))

    def decode(self, token_ids: list[int]) -> str:
        """The synthetic env ignores the action."""
        return ""


class SampledResponseLength:
    """LLMClient wrapper (a simulation): each turn's max_tokens is capped at a length drawn for that turn.

    Draws come from the running loop's seeded `rng` (rollart-resource's VirtualTimeLoop), else from
    the wrapper's own generator, so a virtual-time run is deterministic for its seed (trajectory ids
    are random uuids and cannot key the draw).
    """

    def __init__(self, inner: Any, lengths: Distribution, seed: int = 0) -> None:
        """`inner` is the real client (ProxyLLMClient over the LLMProxy)."""
        self.inner, self.lengths = inner, lengths
        self._rng = random.Random(seed)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Draw the turn's length, cap `max_tokens`, call the real client."""
        rng = getattr(asyncio.get_running_loop(), "rng", None) or self._rng
        n = self.lengths.sample_int(rng)
        return await self.inner.generate(dataclasses.replace(request, max_tokens=min(request.max_tokens, n)))


async def synthetic_reward(trajectory: Trajectory) -> float:
    """1.0 when the episode finished (a simulation does not learn; the pipeline still needs a score)."""
    return 1.0 if trajectory.success else 0.0
