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
    """A short name of the environment kind (e.g. `frozenlake`), for logs and wrappers.

    `EnvManager` checks that an instance has it; trajectories are named after the manager, not this.
    """

    system_prompt: str
    """The system message of this environment's prompts, read once per trajectory right after `reset`.

    `EnvManager` hands it to `PromptBuilder.initial_ids`; `""` means none. A run config's
    `tasks[].system_prompt` replaces it when set (rollart-app wraps the prompt builder).
    """

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Start a new episode and return its first observation; called by `EnvManager` once per trajectory.

        Called on the same instance for trajectory after trajectory, also after the previous one was
        cancelled in the middle of a `step` (a staleness or redundancy abort), so it must bring the
        environment to a fresh episode whatever state it was left in. `seed` makes the episode
        reproducible (`None`: the environment's choice). `ResetResult.info` is copied into
        `Trajectory.info`, where rewards find e.g. a ground truth.

        Each call runs under `EnvManagerConfig.reset_policy`: a per-call deadline and retries with
        backoff on `TransientEnvError` / `ConnectionError` and on a timeout. Any other exception (or
        retries exhausted) counts as a crash: the manager closes this instance, builds a new one from
        its factory and resets that, up to `max_restarts` times, then fails the trajectory
        (`env_crash:` / `env_timeout:`). Must never block the event loop (run blocking work in a thread).
        """
        ...

    async def step(self, action: str) -> StepResult:
        """Apply the policy's response of this turn and return what follows; called once per turn by `EnvManager`.

        `action` is `PromptBuilder.decode` of the generated tokens, raw: an action that does not parse
        is an outcome of the episode (a penalty, an error message as observation), not an exception.
        `reward` adds to `Trajectory.env_return`; `terminated` or `truncated` ends the trajectory
        (`info["success"]` sets `Trajectory.success`, default `terminated and reward > 0`); `info`
        is merged into `Trajectory.info`.

        Runs under `EnvManagerConfig.step_policy`'s deadline. `TransientEnvError` and
        `ConnectionError` are retried with the same action, so raise them only when the action did
        not take effect; a timeout is not retried (the action may have been applied) and fails the
        trajectory `env_timeout:`; any other exception (or transient errors past the last attempt)
        fails it `env_crash:`, and both make the manager replace this instance before the next
        trajectory. The call may be cancelled at any await point (the trajectory is aborted); never
        raise `CancelledError` yourself (it counts as a crash). Must never block the event loop.
        """
        ...

    async def close(self) -> None:
        """Release the environment's resources; after it the manager never uses this instance again.

        Called at most once per instance by `EnvManager`: when it replaces a crashed or timed-out
        environment and from `EnvManager.close`. Bounded by `EnvManagerConfig.close_timeout_s`;
        an exception or a timeout is logged and otherwise ignored, so a half-broken environment can
        still be closed. It may follow a cancelled `step`.
        """
        ...


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

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one turn's response to the full context `request.prompt_ids`; called once per turn.

        Returns the generated ids with one log-prob each and either one weight version per token or
        none; `EnvManager` checks both and that `finish_reason` is one of `FINISH_REASONS` (a
        violation fails the trajectory `llm_error:`). `finish_reason="abort"` (the proxy dropped the
        request, e.g. a staleness abort) ends the trajectory ABORTED `llm_abort`, keeping the
        tokens returned. A client shared by many managers sees overlapping calls; one manager has at
        most one in flight.

        Runs under `EnvManagerConfig.llm_policy`: a per-call deadline and retries on a timeout,
        `TransientEnvError` or `ConnectionError` (so a retried request may be sent again); any other
        exception fails the trajectory `llm_error:`. May be cancelled at any await point when the
        trajectory is aborted; never raise `CancelledError` yourself (it fails the trajectory).
        """
        ...


@runtime_checkable
class TrajectorySink(Protocol):
    """Where finished trajectories go; must not block (the EnvManager keeps rolling)."""

    def put_nowait(self, trajectory: Trajectory) -> None:
        """Take one ended trajectory; called by `EnvManager` exactly once per trajectory, whatever its end.

        The trajectory arrives with its final `status` (finished, aborted or failed), `reason` and
        `t_end` set; the manager does not change it afterwards. Called synchronously from the
        manager's task on the event loop, so it must return at once: start any slow work (scoring)
        as a task. An exception is logged and counted (`EnvCounters.sink_errors`) and the
        trajectory is then lost to the sink, so raise only for a programming error (e.g. the same
        id put twice).
        """
        ...


@runtime_checkable
class PromptBuilder(Protocol):
    """Turns observations into *new* context tokens; earlier tokens are never re-tokenized.

    Each `EnvManager` has its own builder and runs one trajectory at a time, so a builder may keep
    per-trajectory state between `initial_ids` and the calls that follow it. Every method is called
    synchronously on the event loop and must be quick; an exception fails the trajectory
    (`internal_error:`).
    """

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        """The ids of the first prompt: `system_prompt` (may be empty), the reset observation and
        whatever opens the policy's turn (e.g. a chat template's generation prompt).

        Called once per trajectory, right after `Env.reset`; the context of every later turn starts
        with exactly these ids.
        """
        ...

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        """The ids to append after the response `previous_response_ids` so the policy can answer `observation`.

        Called after every `Env.step` that did not end the episode (and not after the last allowed
        turn). Returns only new ids: whatever closes the previous response (unless it already ended
        with that token), the observation, and what opens the next turn. The context is the concatenation
        of earlier prompts, responses and these ids, never a re-tokenized rendering of the history.
        """
        ...

    def decode(self, token_ids: list[int]) -> str:
        """The text of one generated response, as `Env.step` receives it and `Turn.response_text` keeps it.

        Called once per turn with that turn's generated ids; special tokens are usually dropped so
        the environment parses only what the policy wrote.
        """
        ...


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
