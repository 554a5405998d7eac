"""`EnvManager`: one environment, one trajectory at a time, token-exact (paper Fig. 7).

Why trajectory-level: each manager steps its environment as soon as its own generation returns,
so a slow environment delays only its own trajectory (paper §4.2, Fig. 5). Why token-exact: the
context is kept as token ids — each turn appends the ids the engine generated and the ids of the
*new* text only — so the trainer sees exactly what the policy saw; re-tokenizing the decoded
history drifts (merges across turn boundaries) and silently corrupts log-prob ratios.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Protocol, TypeVar

from rollart import checks as check
from rollart.env.error_report import EnvFault, ErrorReport
from rollart.env.errors import EnvCrashedError, EnvError, EnvProtocolError, EnvTimeoutError, LLMCallError
from rollart.env.protocols import (
    FINISH_REASONS,
    Env,
    GenerationRequest,
    GenerationResult,
    LLMClient,
    PromptBuilder,
    SamplingParams,
    TrajectorySink,
    protocol_problems,
)
from rollart.env.retry import RetryPolicy, call_with_retries
from rollart.env.trajectory import ALLOWED_TRANSITIONS, Trajectory, TrajectoryStatus, Turn

log = logging.getLogger(__name__)
T = TypeVar("T")


def cancelled_from_outside() -> bool:
    """True when the running task itself is being cancelled (`Task.cancelling() > 0`).

    Why: a `CancelledError` can also be *raised* by an env, an LLM client or a library they use,
    without anyone cancelling the manager. Treating every `CancelledError` as a shutdown let one
    env stop its manager's loop for good (issue 12: 6 of 8 managers stopped, 133 of 320 seeds never
    ran). Only a cancellation requested on this task (by `cancel`, or by whoever owns the task) is
    one; any other `CancelledError` is a fault of the callee.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class TurnBarrier(Protocol):
    """A synchronisation point between turns; only the batch-level baseline (`EnvGroup`) sets one.

    `EnvManager.turn_barrier` is `None` for trajectory-level rollout (the default); `EnvGroup` sets
    a `LockstepBarrier` shared by its managers for one batch and clears it afterwards.
    """

    async def wait(self) -> None:
        """Block until every party still in the batch has reached the same point.

        `EnvManager` calls it before each generation and before each `Env.step` of a turn. It may
        raise `TimeoutError` (the trajectory then fails) and may be cancelled with the trajectory.
        """
        ...

    def leave(self) -> None:
        """Stop counting this manager as a party, releasing the others if they only waited for it.

        Called once per trajectory when it ends, however it ends (finished, failed, cancelled), so a
        party that left never holds the batch. Must not block or raise.
        """
        ...


@dataclass(frozen=True)
class EnvManagerConfig:
    """Limits and resilience settings of one EnvManager."""

    max_turns: int = 8
    max_tokens_per_turn: int = 256
    max_total_tokens: int = 4096
    max_context_tokens: int = 8192
    sampling: SamplingParams = field(default_factory=SamplingParams)
    reset_policy: RetryPolicy = field(default_factory=RetryPolicy)
    step_policy: RetryPolicy = field(default_factory=RetryPolicy)
    llm_policy: RetryPolicy = field(default_factory=lambda: RetryPolicy(timeout_s=600.0))
    close_timeout_s: float = 5.0
    max_restarts: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        # VAL: VAL_INT_RANGE(self.max_turns, min=1, max=10_000, exc=EnvError)
        check.int_range("max_turns", self.max_turns, min=1, max=10_000, exc=EnvError)  # generated #b2fe1d33e0
        # VAL: VAL_INT_RANGE(self.max_tokens_per_turn, min=1, max=1_000_000, exc=EnvError)
        check.int_range("max_tokens_per_turn", self.max_tokens_per_turn, min=1, max=1_000_000, exc=EnvError)  # generated #c3502e3839
        # VAL: VAL_INT_RANGE(self.max_total_tokens, min=1, max=100_000_000, exc=EnvError)
        check.int_range("max_total_tokens", self.max_total_tokens, min=1, max=100_000_000, exc=EnvError)  # generated #37d2383b05
        # VAL: VAL_INT_RANGE(self.max_context_tokens, min=1, max=100_000_000, exc=EnvError)
        check.int_range("max_context_tokens", self.max_context_tokens, min=1, max=100_000_000, exc=EnvError)  # generated #6e4ee26301
        # VAL: VAL_TIMEOUT(self.close_timeout_s, exc=EnvError)
        check.timeout("close_timeout_s", self.close_timeout_s, exc=EnvError)  # generated #af3d5485f4
        # VAL: VAL_INT_RANGE(self.max_restarts, min=0, max=100, exc=EnvError)
        check.int_range("max_restarts", self.max_restarts, min=0, max=100, exc=EnvError)  # generated #66153d8d2b
        pass


@dataclass
class EnvCounters:
    """Outcome counters of one manager (exported by the scheduler's metrics)."""

    started: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    reset_retries: int = 0
    step_retries: int = 0
    llm_retries: int = 0
    env_timeouts: int = 0
    env_crashes: int = 0
    env_restarts: int = 0
    llm_errors: int = 0
    sink_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return asdict(self)


class EnvManager:
    """Runs trajectories on one environment through an `LLMClient`, handing each to a sink."""

    def __init__(
        self,
        env_factory: Callable[[], Env],
        llm: LLMClient,
        prompts: PromptBuilder,
        sink: TrajectorySink,
        config: EnvManagerConfig | None = None,
        name: str = "env-0",
        tag: str = "default",
        errors: ErrorReport | None = None,
    ) -> None:
        """Create the manager and check its parts against their protocols, so a sync `step` or a
        missing prompt method fails here with EnvProtocolError instead of failing every trajectory.

        When `env_factory` is a class its methods are checked; otherwise it is called once now and
        that environment serves the first trajectory (a factory that raises is left to run time,
        where it counts as an env crash as before). Later environments are re-created lazily.
        `errors` (shared by a task's managers) logs and counts the env's exceptions (D29).
        """
        # VAL: VAL_NON_EMPTY(name, exc=EnvError)
        check.non_empty("name", name, exc=EnvError)  # generated #2b3c116a0c
        first_env = None
        if not inspect.isclass(env_factory):
            try:
                first_env = env_factory()
            except Exception:  # noqa: BLE001 - a failing factory is an env crash, reported per trajectory
                log.warning("env factory of %s failed at construction; it is retried per trajectory", name, exc_info=True)
        env_probe = env_factory if inspect.isclass(env_factory) else first_env
        problems = [*(protocol_problems(env_probe, Env) if env_probe is not None else []),
                    *protocol_problems(prompts, PromptBuilder), *protocol_problems(llm, LLMClient),
                    *protocol_problems(sink, TrajectorySink)]
        # AST: AST_PRECONDITION(not problems, got=problems, msg="the parts of an EnvManager follow their protocols", exc=EnvProtocolError)
        check.precondition(not problems, "the parts of an EnvManager follow their protocols", got=problems, exc=EnvProtocolError)  # generated #739851214b
        self.env_factory = env_factory
        self.llm = llm
        self.prompts = prompts
        self.sink = sink
        self.config = config or EnvManagerConfig()
        self.name = name
        self.tag = tag
        self.counters = EnvCounters()
        self.errors = errors if errors is not None else ErrorReport(label=name)
        self._fault: EnvFault | None = None
        self.turn_barrier: TurnBarrier | None = None
        self._rng = random.Random(self.config.seed)
        self._env: Env | None = first_env
        self._env_needs_restart = False
        self._current: Trajectory | None = None
        self._task: asyncio.Task | None = None
        self._cancel_reason: str | None = None

    @property
    def current(self) -> Trajectory | None:
        """The trajectory in flight, if any."""
        return self._current

    def cancel(self, reason: str) -> bool:
        """Abort the trajectory in flight at its current await point (staleness or redundancy).

        Returns False when nothing is in flight. The trajectory ends ABORTED with
        reason `cancelled:<reason>` and still goes to the sink, so nothing is silently lost.
        """
        # VAL: VAL_NON_EMPTY(reason, exc=EnvError)
        check.non_empty("reason", reason, exc=EnvError)  # generated #d9a51ecd74
        if self._current is None or self._task is None or self._current.ended or self._cancel_reason is not None:
            return False
        self._cancel_reason = reason
        self._task.cancel(msg=reason)
        return True

    async def run_trajectory(self, seed: int | None = None, group_id: str = "") -> Trajectory:
        """Run one episode to its end; always returns the ended trajectory (never raises for env/LLM faults).

        An outside cancellation (shutdown) also ends the trajectory, then propagates.
        """
        # deps: EnvManager._rollout, EnvManager._end
        # AST: AST_PRECONDITION(self._current is None, got=self._current, msg="one trajectory at a time per manager", exc=EnvError)
        check.precondition(self._current is None, "one trajectory at a time per manager", got=self._current, exc=EnvError)  # generated #8f6bcb3ec5
        loop = asyncio.get_running_loop()
        traj = Trajectory(
            id=f"{self.name}-{uuid.uuid4().hex[:12]}", group_id=group_id, env_name=self.name, tag=self.tag, seed=seed
        )
        traj.t_start = loop.time()
        self._current, self._task, self._cancel_reason = traj, asyncio.current_task(), None
        self._fault = None
        self.counters.started += 1
        try:
            status, reason = await self._rollout(traj, seed)
        except asyncio.CancelledError as exc:
            if not cancelled_from_outside():  # raised by a callee, not a cancel of this task
                log.error("%s: a callee raised CancelledError without a cancel of the manager", self.name)
                status, reason = TrajectoryStatus.FAILED, f"internal_error:{exc!r}"
            elif self._cancel_reason is None:
                self._end(traj, TrajectoryStatus.ABORTED, "cancelled:shutdown")
                raise
            else:
                if self._task is not None:
                    self._task.uncancel()
                status, reason = TrajectoryStatus.ABORTED, f"cancelled:{self._cancel_reason}"
        except EnvTimeoutError as exc:
            status, reason = TrajectoryStatus.FAILED, f"env_timeout:{exc}"
            self._attach_fault(traj)
        except EnvCrashedError as exc:
            status, reason = TrajectoryStatus.FAILED, f"env_crash:{exc}"
            self._attach_fault(traj)
        except LLMCallError as exc:
            self.counters.llm_errors += 1
            status, reason = TrajectoryStatus.FAILED, f"llm_error:{exc}"
        except Exception as exc:  # a bug must not take the manager down; the trajectory still ends once
            log.exception("internal error in %s", self.name)
            status, reason = TrajectoryStatus.FAILED, f"internal_error:{exc!r}"
        finally:
            if self.turn_barrier is not None:
                self.turn_barrier.leave()
        self._end(traj, status, reason)
        return traj

    async def run(self, seeds: Iterable[int | None], group_id: str = "") -> int:
        """Run trajectories back to back, one per seed, until the seeds run out; returns how many ended.

        Cancel the task running this to stop: the trajectory in flight ends `cancelled:shutdown`.
        """
        # deps: EnvManager.run_trajectory, EnvManager.failure_backoff
        done = 0
        consecutive_failures = 0
        for seed in seeds:
            traj = await self.run_trajectory(seed=seed, group_id=group_id)
            done += 1
            consecutive_failures = consecutive_failures + 1 if traj.status == TrajectoryStatus.FAILED else 0
            await asyncio.sleep(self.failure_backoff(consecutive_failures))
        return done

    def failure_backoff(self, consecutive_failures: int) -> float:
        """Pause before the next trajectory after failures, so a broken env never spins the loop hot.

        0 after a success; else full jitter under min(max_delay, base * 2**(k-1)) of the reset policy
        (at least `base_delay_s`, so even a zero-time crash loop lets virtual time advance).
        """
        # VAL: VAL_INT_RANGE(consecutive_failures, min=0, max=2**31, exc=EnvError)
        check.int_range("consecutive_failures", consecutive_failures, min=0, max=2**31, exc=EnvError)  # generated #8e82f3b94b
        if consecutive_failures == 0:
            return 0.0
        policy = self.config.reset_policy
        cap = min(policy.max_delay_s, policy.base_delay_s * 2 ** min(consecutive_failures - 1, 30))
        return max(policy.base_delay_s, self._rng.uniform(0.0, cap))

    async def close(self) -> None:
        """Close the environment (bounded by `close_timeout_s`; errors are logged, not raised)."""
        env, self._env = self._env, None
        if env is not None:
            await self._close_env(env)

    # ------------------------------------------------------------------ internals

    async def _rollout(self, traj: Trajectory, seed: int | None) -> tuple[TrajectoryStatus, str]:
        cfg = self.config
        loop = asyncio.get_running_loop()
        env, reset = await self._reset_with_restarts(seed)
        traj.initial_observation = reset.observation
        traj.info = dict(reset.info)
        new_ids = list(self.prompts.initial_ids(env.system_prompt, reset.observation))
        context: list[int] = list(new_ids)
        for turn_index in range(cfg.max_turns):
            remaining = min(cfg.max_total_tokens - traj.num_response_tokens(), cfg.max_context_tokens - len(context))
            if remaining <= 0:
                return TrajectoryStatus.FINISHED, (
                    "max_tokens" if traj.num_response_tokens() >= cfg.max_total_tokens else "max_context"
                )
            if self.turn_barrier is not None:
                await self.turn_barrier.wait()
            request = GenerationRequest(
                prompt_ids=list(context),
                max_tokens=min(cfg.max_tokens_per_turn, remaining),
                sampling=cfg.sampling,
                trajectory_id=traj.id,
                tag=self.tag,
            )
            t_gen = loop.time()
            result = await self._generate(request)
            text = self.prompts.decode(result.token_ids)
            turn = Turn(
                prompt_ids=new_ids,
                response_ids=list(result.token_ids),
                response_logprobs=list(result.logprobs),
                response_weight_versions=list(result.weight_versions),
                weight_version=result.weight_versions[0] if result.weight_versions else -1,
                finish_reason=result.finish_reason,
                response_text=text,
                t_generate_start=t_gen,
                t_generate_end=loop.time(),
            )
            traj.turns.append(turn)
            context.extend(turn.response_ids)
            if result.finish_reason == "abort":
                return TrajectoryStatus.ABORTED, "llm_abort"
            if self.turn_barrier is not None:
                await self.turn_barrier.wait()
            step = await self._env_call(lambda text=text: env.step(text), cfg.step_policy, "step", retry_on_timeout=False)
            turn.observation = step.observation
            turn.env_reward = float(step.reward)
            turn.t_step_end = loop.time()
            traj.env_return += turn.env_reward
            traj.info.update(step.info)
            if step.terminated or step.truncated:
                traj.success = bool(step.info.get("success", step.terminated and step.reward > 0))
                return TrajectoryStatus.FINISHED, "terminated" if step.terminated else "truncated"
            if turn_index + 1 < cfg.max_turns:
                new_ids = list(self.prompts.continuation_ids(turn.response_ids, step.observation))
                context.extend(new_ids)
        return TrajectoryStatus.FINISHED, "max_turns"

    def _end(self, traj: Trajectory, status: TrajectoryStatus, reason: str) -> None:
        # VAL: VAL_STATE_TRANSITION(traj.status, status, ALLOWED_TRANSITIONS, exc=EnvError)
        check.transition("traj.status", traj.status, status, ALLOWED_TRANSITIONS, exc=EnvError)  # generated #04b9d10484
        traj.status = status
        traj.reason = reason
        traj.t_end = asyncio.get_running_loop().time()
        setattr(self.counters, status.value, getattr(self.counters, status.value) + 1)
        self._current, self._task, self._cancel_reason = None, None, None
        try:
            self.sink.put_nowait(traj)
        except Exception:
            self.counters.sink_errors += 1
            log.exception("sink rejected trajectory %s", traj.id)

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        def on_retry(_err: BaseException) -> None:
            self.counters.llm_retries += 1

        try:
            result = await call_with_retries(
                lambda: self.llm.generate(request), self.config.llm_policy, self._rng, on_retry, retry_on_timeout=True
            )
        except asyncio.CancelledError as exc:
            if cancelled_from_outside():
                raise
            raise LLMCallError(f"generate raised CancelledError itself: {exc!r}") from exc
        except Exception as exc:
            raise LLMCallError(f"generate failed: {exc!r}") from exc
        # VAL: VAL_ONE_OF(result.finish_reason, choices=FINISH_REASONS, exc=LLMCallError)
        check.one_of("result.finish_reason", result.finish_reason, FINISH_REASONS, exc=LLMCallError)  # generated #ae2c855cf2
        # AST: AST_POSTCONDITION(len(result.logprobs) == len(result.token_ids), got=(len(result.token_ids), len(result.logprobs)), msg="one log-prob per generated token", exc=LLMCallError)
        check.postcondition(len(result.logprobs) == len(result.token_ids), "one log-prob per generated token", got_lazy=lambda: (len(result.token_ids), len(result.logprobs)), exc=LLMCallError)  # generated #7c4a4c7fd2
        # AST: AST_POSTCONDITION(len(result.weight_versions) in (0, len(result.token_ids)), got=len(result.weight_versions), msg="one weight version per generated token", exc=LLMCallError)
        check.postcondition(len(result.weight_versions) in (0, len(result.token_ids)), "one weight version per generated token", got_lazy=lambda: len(result.weight_versions), exc=LLMCallError)  # generated #1e77539eb0
        return result

    def _attach_fault(self, traj: Trajectory) -> None:
        """The env exception that ended `traj`, in `traj.info["env_error"]` (the scheduler counts it by kind)."""
        if self._fault is not None:
            traj.info["env_error"] = self._fault.as_info()

    def _report(self, call: str, exc: BaseException) -> None:
        self._fault = self.errors.report(call, self.name, exc)

    async def _env_call(
        self, fn: Callable[[], Awaitable[T]], policy: RetryPolicy, kind: str, retry_on_timeout: bool
    ) -> T:
        def on_retry(err: BaseException) -> None:
            self._report(kind, err)  # a retried exception is an exception too: logged once, counted
            if kind == "reset":
                self.counters.reset_retries += 1
            else:
                self.counters.step_retries += 1

        try:
            return await call_with_retries(fn, policy, self._rng, on_retry, retry_on_timeout=retry_on_timeout)
        except asyncio.CancelledError as exc:
            if cancelled_from_outside():
                raise
            self.counters.env_crashes += 1  # the env raised it: an env fault, not a shutdown
            self._env_needs_restart = True
            self._report(kind, exc)
            raise EnvCrashedError(f"{kind} raised CancelledError itself: {exc!r}") from exc
        except EnvTimeoutError as exc:
            self.counters.env_timeouts += 1
            self._env_needs_restart = True
            self._report(kind, exc)
            raise
        except Exception as exc:
            self.counters.env_crashes += 1
            self._env_needs_restart = True
            self._report(kind, exc)
            raise EnvCrashedError(f"{kind} failed: {exc!r}") from exc

    async def _reset_with_restarts(self, seed: int | None):
        restarts = 0
        while True:
            env = await self._ensure_env()
            try:
                reset = await self._env_call(
                    lambda env=env: env.reset(seed=seed), self.config.reset_policy, "reset", retry_on_timeout=True
                )
                return env, reset
            except (EnvCrashedError, EnvTimeoutError):
                if restarts >= self.config.max_restarts:
                    raise
                restarts += 1

    async def _ensure_env(self) -> Env:
        if self._env is not None and not self._env_needs_restart:
            return self._env
        old, self._env = self._env, None
        if old is not None:
            self.counters.env_restarts += 1
            await self._close_env(old)
        try:
            self._env = self.env_factory()
        except asyncio.CancelledError as exc:  # a factory is synchronous: nobody cancelled anything
            self.counters.env_crashes += 1
            self._report("factory", exc)
            raise EnvCrashedError(f"env factory raised CancelledError: {exc!r}") from exc
        except Exception as exc:
            self.counters.env_crashes += 1
            self._report("factory", exc)
            raise EnvCrashedError(f"env factory failed: {exc!r}") from exc
        self._env_needs_restart = False
        return self._env

    async def _close_env(self, env: Env) -> None:
        try:
            await asyncio.wait_for(env.close(), timeout=self.config.close_timeout_s)
        except asyncio.CancelledError:
            if cancelled_from_outside():
                raise
            log.warning("closing env of %s raised CancelledError itself", self.name)
        except Exception:
            log.warning("closing env of %s failed", self.name, exc_info=True)
