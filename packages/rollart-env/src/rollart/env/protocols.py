"""The seams of rollart.env: Env, LLMClient, TrajectorySink, PromptBuilder and their data.

Why Protocols with env-owned dataclasses: rollart.env imports no other rollart package
(design/000-overview.md §2); the scheduler adapts `LLMProxy.generate` to `LLMClient` and the SampleBuffer
to `TrajectorySink`, so both sides can be tested alone.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollart import checks as check
from rollart.env.errors import EnvError
from rollart.env.trajectory import Trajectory

FINISH_REASONS = frozenset({"stop", "length", "abort"})


@dataclass(frozen=True)
class ResetResult:
    """What `Env.reset` returns: the first observation as text and an info dict (e.g. ground truth)."""

    observation: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """Gymnasium-shaped step result with a text observation."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """An async, text-in/text-out, gymnasium-shaped environment.

    `step` receives the policy's raw text; parsing it into an action is the environment's job,
    because only it knows its action grammar (an unparsable action is an environment outcome,
    e.g. a penalty, not an infrastructure error).
    """

    name: str
    system_prompt: str

    async def reset(self, seed: int | None = None) -> ResetResult: ...

    async def step(self, action: str) -> StepResult: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings forwarded to the inference engine.

    ``top_k == 0`` disables top-k, as in rollart.proxy's SamplingParams and transformers (vLLM's
    -1 is the vLLM engine's business: it converts at its boundary).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # VAL: VAL_INT_RANGE(self.top_k, min=0, max=1 << 31, exc=EnvError)
        check.int_range("top_k", self.top_k, min=0, max=1 << 31, exc=EnvError)  # generated #08edbeb440
        pass


@dataclass(frozen=True)
class GenerationRequest:
    """One generation call: the full context as token ids (never text, so nothing is re-tokenized)."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    trajectory_id: str
    tag: str = "default"


@dataclass(frozen=True)
class GenerationResult:
    """What the engine produced: token ids, their log-probs and the weight version of each token."""

    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    finish_reason: str  # one of FINISH_REASONS


@runtime_checkable
class LLMClient(Protocol):
    """The generate call the EnvManager makes (the scheduler adapts LLMProxy.generate to it)."""

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...


@runtime_checkable
class TrajectorySink(Protocol):
    """Where finished trajectories go; must not block (the EnvManager keeps rolling)."""

    def put_nowait(self, trajectory: Trajectory) -> None: ...


@runtime_checkable
class PromptBuilder(Protocol):
    """Turns observations into *new* context tokens; earlier tokens are never re-tokenized."""

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]: ...

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


def protocol_problems(obj: Any, protocol: type) -> list[str]:
    """What `obj` (an instance, or a class when no instance exists yet) lacks of `protocol`.

    Why not `isinstance(obj, protocol)`: a runtime-checkable Protocol only checks that the names
    exist, so a `def step` where `async def step` is required passes and every trajectory then
    fails at run time. This names each missing method, each plain function where a coroutine
    function is required (and the reverse), and, for an instance, each missing attribute.
    """
    owner = obj.__name__ if inspect.isclass(obj) else type(obj).__name__
    problems = []
    for name, spec in vars(protocol).items():
        if name.startswith("_") or not inspect.isfunction(spec):
            continue
        member = getattr(obj, name, None)
        if member is None or not callable(member):
            problems.append(f"{owner}.{name} is missing (the {protocol.__name__} protocol needs it)")
        elif inspect.iscoroutinefunction(spec) and not inspect.iscoroutinefunction(member):
            problems.append(f"{owner}.{name} must be `async def`, it is a plain function")
        elif not inspect.iscoroutinefunction(spec) and inspect.iscoroutinefunction(member):
            problems.append(f"{owner}.{name} must be a plain function, it is `async def`")
    if not inspect.isclass(obj):
        for name in getattr(protocol, "__annotations__", {}):
            if not hasattr(obj, name):
                problems.append(f"{owner}.{name} is missing (the {protocol.__name__} protocol needs it)")
    return problems
