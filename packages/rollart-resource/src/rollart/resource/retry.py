"""One retry policy for every package above rollart-env: exponential backoff with jitter, on tenacity.

Why tenacity: the retry loop (attempt, decide, pause, give up) is written once there and is well
kept; what RollArt adds is only its policy: the pause (exponential, capped, jittered from a seeded
`random.Random`, so a run replays), time from the running loop (tenacity's async sleep is
`asyncio.sleep`; no stop here reads the wall clock, so the same code runs under virtual time) and
how a caller gives up (its own error naming its limit).

Jitter: `full` draws the pause from [0, cap] (clients that failed together spread the most);
`equal` draws it from [cap/2, cap] (still spread, but each pause keeps growing, so a client does
not retry at once against a server that is still down). cap = min(max_s, base_s * 2**(k-1))
after failed attempt k.

rollart-env imports no other rollart package, so `rollart.env.retry` uses tenacity the same way
for its per-call policy; every other package uses this module.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import tenacity

from rollart import checks as check
from rollart.resource.errors import ResourceError

JITTERS = ("full", "equal")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: the pause after failed attempt k (1-based)."""

    base_s: float = 0.1
    max_s: float = 2.0
    jitter: Literal["full", "equal"] = "equal"

    def __post_init__(self) -> None:
        # VAL: VAL_NON_NEGATIVE(self.base_s, exc=ResourceError)
        check.non_negative("base_s", self.base_s, exc=ResourceError)  # generated #f8c3893cfa
        # VAL: VAL_NON_NEGATIVE(self.max_s, exc=ResourceError)
        check.non_negative("max_s", self.max_s, exc=ResourceError)  # generated #19c5456111
        # VAL: VAL_ONE_OF(self.jitter, choices=JITTERS, exc=ResourceError)
        check.one_of("jitter", self.jitter, JITTERS, exc=ResourceError)  # generated #6526a49fc6
        pass

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The pause after failed attempt `attempt`: in [0, cap] (full) or [cap/2, cap] (equal)."""
        # VAL: VAL_INT_RANGE(attempt, min=1, max=1 << 62, exc=ResourceError)
        check.int_range("attempt", attempt, min=1, max=1 << 62, exc=ResourceError)  # generated #2662b62468
        cap = min(self.max_s, self.base_s * 2 ** min(attempt - 1, 60))
        low = 0.0 if self.jitter == "full" else cap / 2
        return rng.uniform(low, cap)


def retrying(backoff: Backoff, rng: random.Random, *, retry_on: tuple[type[BaseException], ...],
             max_attempts: int | None = None, deadline: float | None = None,
             min_pause: Callable[[BaseException], float] | None = None,
             on_retry: Callable[[int, BaseException], None] | None = None,
             give_up: Callable[[int, BaseException], BaseException] | None = None) -> tenacity.AsyncRetrying:
    """An `async for attempt in retrying(...): with attempt: ...` loop over the policy.

    Retries the exceptions in `retry_on` (anything else propagates at once); pauses
    `backoff.delay` (at least `min_pause(error)`, e.g. a 429's Retry-After; never past `deadline`,
    a loop time); stops after `max_attempts` (None: no cap). The caller bounds its attempts by the
    deadline itself (an attempt that starts at or after it raises the caller's timeout). When it
    gives up, `give_up(attempts, last_error)` is raised (default: the last error itself).
    """
    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        pause = backoff.delay(state.attempt_number, rng)
        if min_pause is not None and error is not None:
            pause = max(pause, min_pause(error))
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - asyncio.get_running_loop().time()))
        return pause

    def stop(state: tenacity.RetryCallState) -> bool:
        return max_attempts is not None and state.attempt_number >= max_attempts

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            on_retry(state.attempt_number, state.outcome.exception())

    def on_give_up(state: tenacity.RetryCallState) -> Any:
        error = state.outcome.exception()
        raise (give_up(state.attempt_number, error) if give_up is not None else error)

    return tenacity.AsyncRetrying(stop=stop, wait=wait, retry=tenacity.retry_if_exception_type(retry_on),
                                  before_sleep=before_sleep, retry_error_callback=on_give_up, sleep=asyncio.sleep)
