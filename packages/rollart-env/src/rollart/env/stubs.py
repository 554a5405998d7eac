"""Named stubs for tests and benchmarks: a scripted fixed-latency LLM client, a list sink, a countdown env.

Why a stub LLM is legitimate here: the real engines live in rollart-proxy (env may not import
it); the EnvManager's behaviour under latency, failures and cancellation is what these tests and
the virtual-time benchmark measure, and a stub with controlled latency isolates exactly that.
It is named `Stub...` so nobody mistakes it for an engine.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence

from rollart import checks as check
from rollart.env.errors import EnvError, TransientEnvError
from rollart.env.protocols import GenerationRequest, GenerationResult, ResetResult, StepResult
from rollart.env.trajectory import Trajectory


class StubLLMClient:
    """An `LLMClient` that answers after a latency with scripted text (or a function of the request).

    `responses` is cycled per call; `latency_s` is a number or a callable (rng -> seconds);
    `fail_prob` raises `ConnectionError` (a transient error) with that probability.
    """

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        responses: Sequence[str] | Callable[[GenerationRequest], str] = ("ok",),
        latency_s: float | Callable[[random.Random], float] = 0.0,
        weight_version: int = 0,
        fail_prob: float = 0.0,
        eos_token_id: int | None = None,
        seed: int = 0,
    ) -> None:
        """Build the stub; `encode` turns the scripted text into token ids."""
        # VAL: VAL_INT_RANGE(weight_version, min=0, max=2**62, exc=EnvError)
        check.int_range("weight_version", weight_version, min=0, max=2**62, exc=EnvError)  # generated #6283854864
        self.encode = encode
        self.responses = responses
        self.latency_s = latency_s
        self.weight_version = weight_version
        self.fail_prob = fail_prob
        self.eos_token_id = eos_token_id
        self.rng = random.Random(seed)
        self.requests: list[GenerationRequest] = []
        self.calls = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sleep the latency (loop time), then return the scripted response truncated to max_tokens."""
        self.calls += 1
        self.requests.append(request)
        latency = self.latency_s(self.rng) if callable(self.latency_s) else self.latency_s
        await asyncio.sleep(max(0.0, latency))
        if self.fail_prob and self.rng.random() < self.fail_prob:
            raise ConnectionError("stub LLM transient failure")
        if callable(self.responses):
            text = self.responses(request)
        else:
            text = self.responses[(self.calls - 1) % len(self.responses)]
        ids = list(self.encode(text))
        finish = "stop"
        if self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        if len(ids) > request.max_tokens:
            ids, finish = ids[: request.max_tokens], "length"
        return GenerationResult(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            weight_versions=[self.weight_version] * len(ids),
            finish_reason=finish,
        )


class ListSink:
    """A `TrajectorySink` that keeps every trajectory it receives (tests, benchmarks)."""

    def __init__(self) -> None:
        """Start empty."""
        self.items: list[Trajectory] = []

    def put_nowait(self, trajectory: Trajectory) -> None:
        """Append the trajectory."""
        self.items.append(trajectory)


class CountdownStubEnv:
    """A scripted stub `Env`: terminates after `length` steps; crashes, fails or hangs on chosen calls."""

    name = "countdown"
    system_prompt = "Count down."

    def __init__(
        self,
        length: int = 3,
        crash_on_step: int | None = None,
        transient_on_steps: tuple[int, ...] = (),
        hang_on_step: int | None = None,
        crash_on_reset: int = 0,
    ) -> None:
        """Step numbers are 1-based counts of `step` calls over the env's life."""
        self.length = length
        self.crash_on_step = crash_on_step
        self.transient_on_steps = set(transient_on_steps)
        self.hang_on_step = hang_on_step
        self.crash_on_reset = crash_on_reset
        self.steps = 0
        self.step_calls = 0
        self.actions = []
        self.closed = False

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Start counting down (or crash, if asked to)."""
        if self.crash_on_reset > 0:
            self.crash_on_reset -= 1
            raise RuntimeError("reset exploded")
        self.steps = 0
        return ResetResult(observation=f"start {seed}", info={"seed": seed})

    async def step(self, action: str) -> StepResult:
        """Record the action and count down; fail, crash or hang on the chosen calls."""
        self.step_calls += 1
        if self.step_calls in self.transient_on_steps:
            raise TransientEnvError("try again")
        if self.step_calls == self.crash_on_step:
            raise RuntimeError("segfault-ish")
        if self.step_calls == self.hang_on_step:
            await asyncio.Event().wait()
        self.actions.append(action)
        self.steps += 1
        done = self.steps >= self.length
        return StepResult(f"left {self.length - self.steps}", 1.0 if done else 0.0, done, False, {})

    async def close(self) -> None:
        """Mark closed."""
        self.closed = True
