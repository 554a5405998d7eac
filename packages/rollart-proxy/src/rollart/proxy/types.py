"""Data crossing the proxy's seams: sampling parameters, requests, engine outputs, responses.

Dataclasses (not pydantic) because they travel through Ray's pickling and sit on the hot path of
every engine step; validation happens once, in ``LLMProxy.generate`` / ``validate_request``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
FINISH_MIGRATED = "migrated"
FINISH_WORKER_FAILED = "worker_failed"
#: Reasons with which a request ends for its client (exactly once).
FINAL_REASONS = frozenset({FINISH_STOP, FINISH_LENGTH, FINISH_ABORT})
#: Reasons with which a worker hands a request back to the proxy to be resumed elsewhere.
RESUMABLE_REASONS = frozenset({FINISH_MIGRATED, FINISH_WORKER_FAILED})


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``temperature == 0`` is greedy; ``top_k == 0`` and ``top_p == 1`` disable them."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerateRequest:
    """What a client (an EnvManager, an LLM judge) asks the proxy for: one turn of one trajectory."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    trajectory_id: str = ""
    tag: str = "default"


@dataclass(frozen=True)
class EngineRequest:
    """A request as an engine sees it, possibly resumed: ``generated_*`` hold tokens kept from an
    earlier worker (migration, weight update, failure) whose KV the engine recomputes as if they
    were prompt, but reports as generated output."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    trajectory_id: str = ""
    generated_ids: tuple[int, ...] = ()
    generated_logprobs: tuple[float, ...] = ()
    generated_versions: tuple[int, ...] = ()

    @property
    def remaining_tokens(self) -> int:
        """How many tokens the engine may still generate."""
        return self.params.max_tokens - len(self.generated_ids)

    @property
    def context_ids(self) -> tuple[int, ...]:
        """Prompt plus tokens already generated: what the engine must (re)compute KV for."""
        return self.prompt_ids + self.generated_ids


@dataclass(frozen=True)
class EngineOutput:
    """The state of one request leaving an engine: finished, aborted, or handed back for migration.

    ``token_versions[i]`` is the weight version that produced ``token_ids[i]``.
    """

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    token_versions: tuple[int, ...]
    finish_reason: str | None

    def resume_request(self, original: EngineRequest) -> EngineRequest:
        """The request that continues this output elsewhere, keeping every generated token."""
        return replace(
            original,
            generated_ids=self.token_ids,
            generated_logprobs=self.logprobs,
            generated_versions=self.token_versions,
        )


@dataclass(frozen=True)
class EngineLoad:
    """What routing and the scheduler need to know about an engine's occupancy."""

    running: int
    waiting: int
    tokens_in_flight: int
    free_kv_tokens: int


@dataclass(frozen=True)
class GenerateResponse:
    """What the proxy answers, once per request."""

    request_id: str
    trajectory_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    token_versions: tuple[int, ...]
    finish_reason: str
    abort_reason: str | None = None
    worker_ids: tuple[str, ...] = ()

    @property
    def versions(self) -> tuple[int, ...]:
        """The distinct weight versions that produced this output, in order."""
        return tuple(dict.fromkeys(self.token_versions))
