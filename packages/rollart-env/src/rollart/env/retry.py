"""Per-call deadlines and retries with exponential backoff and full jitter, on tenacity.

Why full jitter: many EnvManagers hit the same remote environment service; synchronised retries
would arrive in waves. Time comes from the running loop only (`asyncio.sleep`, `asyncio.timeout`), so
the same code runs under the virtual clock. The loop itself is tenacity's, as in the other
packages (`rollart.resource.retry`, which rollart-env may not import: it imports no other
rollart package); the policy, the pause formula and the seeded rng are the same kind.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from rollart import checks as check
from rollart.env.errors import EnvError, EnvTimeoutError, TransientEnvError

T = TypeVar("T")

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (TransientEnvError, ConnectionError)


@dataclass(frozen=True)
class RetryPolicy:
    """How one kind of call is bounded and retried."""

    timeout_s: float = 30.0
    max_attempts: int = 3
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def __post_init__(self) -> None:
        # VAL: VAL_TIMEOUT(self.timeout_s, exc=EnvError)
        check.timeout("timeout_s", self.timeout_s, exc=EnvError)  # generated #b23b8c2c22
        # VAL: VAL_INT_RANGE(self.max_attempts, min=1, max=100, exc=EnvError)
        check.int_range("max_attempts", self.max_attempts, min=1, max=100, exc=EnvError)  # generated #3775eeaaaa
        # VAL: VAL_NON_NEGATIVE(self.base_delay_s, exc=EnvError)
        check.non_negative("base_delay_s", self.base_delay_s, exc=EnvError)  # generated #986483e0fa
        # VAL: VAL_NON_NEGATIVE(self.max_delay_s, exc=EnvError)
        check.non_negative("max_delay_s", self.max_delay_s, exc=EnvError)  # generated #82095c78c0
        pass


def backoff_delay(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Delay before retry number `attempt` (1-based): uniform in [0, min(max, base * 2**(attempt-1))]."""
    # VAL: VAL_INT_RANGE(attempt, min=1, max=policy.max_attempts, exc=EnvError)
    check.int_range("attempt", attempt, min=1, max=policy.max_attempts, exc=EnvError)  # generated #a8496973ec
    cap = min(policy.max_delay_s, policy.base_delay_s * (2 ** (attempt - 1)))
    return rng.uniform(0.0, cap)


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    rng: random.Random,
    on_retry: Callable[[BaseException], None] | None = None,
    retry_on_timeout: bool = True,
) -> T:
    """Run `fn` with a per-attempt deadline, retrying transient errors (and timeouts if allowed).

    A timeout becomes `EnvTimeoutError`; other exceptions propagate at once (a crash is not
    retried here: the caller restarts the environment). The last transient error propagates.
    """
    # deps: asyncio.timeout, backoff_delay, tenacity.AsyncRetrying
    retry_on = (*TRANSIENT_ERRORS, _AttemptTimedOut) if retry_on_timeout else TRANSIENT_ERRORS
    # The first attempt runs outside tenacity: nearly every call succeeds at once, and building a
    # retrying loop per call cost more than the call itself in 3,000-GPU simulations. Same semantics:
    # attempt 1, then (if it failed transiently) the same pause and on_retry, then attempts 2..max.
    try:
        return await _within(fn, policy.timeout_s)
    except TimeoutError as exc:
        first: BaseException = _AttemptTimedOut(f"call timed out after {policy.timeout_s} s (attempt 1)")
        if not retry_on_timeout or policy.max_attempts == 1:
            raise first from exc
        first.__cause__ = exc
    except TRANSIENT_ERRORS as exc:
        if policy.max_attempts == 1:
            raise
        first = exc
    if on_retry is not None:
        on_retry(first)
    await asyncio.sleep(backoff_delay(policy, 1, rng))

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            on_retry(state.outcome.exception())

    attempts = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(policy.max_attempts - 1),
        wait=lambda state: backoff_delay(policy, state.attempt_number + 1, rng),
        retry=tenacity.retry_if_exception_type(retry_on),
        before_sleep=before_sleep,
        reraise=True,  # the last error itself, not tenacity's RetryError
        sleep=asyncio.sleep,
    )
    async for attempt in attempts:
        with attempt:
            try:
                return await _within(fn, policy.timeout_s)
            except TimeoutError as exc:
                number = attempt.retry_state.attempt_number + 1
                raise _AttemptTimedOut(f"call timed out after {policy.timeout_s} s (attempt {number})") from exc
    raise AssertionError("unreachable: the retry loop returns or raises")


async def _within(fn: Callable[[], Awaitable[T]], timeout_s: float | None) -> T:
    """One attempt under its deadline, in the calling task (`wait_for` made a task and a future per call)."""
    async with asyncio.timeout(timeout_s):
        return await fn()


class _AttemptTimedOut(EnvTimeoutError):
    """This attempt ran past the policy's per-call deadline (an EnvTimeoutError `fn` raises itself is not retried)."""
