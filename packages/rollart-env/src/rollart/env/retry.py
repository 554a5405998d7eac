"""Per-call deadlines and retries with exponential backoff and full jitter.

Why full jitter: many EnvManagers hit the same remote environment service; synchronised retries
would arrive in waves. Time comes from the running loop only (`asyncio.sleep`, `wait_for`), so
the same code runs under the virtual clock.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from rollart.env import checks as check
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
    # deps: asyncio.wait_for, backoff_delay
    attempt = 0
    while True:
        attempt += 1
        try:
            return await asyncio.wait_for(fn(), timeout=policy.timeout_s)
        except TimeoutError as exc:
            err: BaseException = EnvTimeoutError(f"call timed out after {policy.timeout_s} s (attempt {attempt})")
            err.__cause__ = exc
            retryable = retry_on_timeout
        except TRANSIENT_ERRORS as exc:
            err = exc
            retryable = True
        if not retryable or attempt >= policy.max_attempts:
            raise err
        if on_retry is not None:
            on_retry(err)
        await asyncio.sleep(backoff_delay(policy, attempt, rng))
