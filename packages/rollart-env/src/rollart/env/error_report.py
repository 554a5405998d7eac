"""`ErrorReport`: an environment's exceptions reach the log once with their traceback, then rate-limited.

Why (issue 21, item 4): an env whose `step` raised was retried, counted in `EnvCounters` and folded
into a trajectory's `reason`, but the exception itself appeared nowhere: a user saw a run stall and
end with a batch timeout. Why once per kind and then rate-limited: an env that raises on every step
of 64 managers would otherwise write thousands of identical tracebacks. One report is shared by the
managers of a task, so "first occurrence" means the task's first, not each manager's.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollart import checks as check
from rollart.env.errors import EnvError, EnvTimeoutError

log = logging.getLogger("rollart.env.errors")


def _loop_time() -> float:
    """The running loop's clock (monotonic time outside a loop, e.g. a factory called at build time)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


@dataclass
class EnvFault:
    """One env exception as a trajectory carries it in `info["env_error"]`: kind, message, where, traceback."""

    kind: str
    message: str
    env: str
    traceback: str = ""

    def as_info(self) -> dict[str, Any]:
        """The plain dict stored in the trajectory (the traceback's last 4000 characters)."""
        return {"kind": self.kind, "message": self.message, "env": self.env, "traceback": self.traceback[-4000:]}


@dataclass
class ErrorReport:
    """Counts env exceptions by kind and logs each kind's first occurrence in full, later ones at most every `every_s`.

    `label` names the task in every line; `clock` is the event loop's time unless given.
    """

    label: str = "env"
    every_s: float = 60.0
    clock: Callable[[], float] = _loop_time
    counts: dict[str, int] = field(default_factory=dict)
    _last_logged: dict[str, tuple[float, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse a negative interval."""
        # VAL: VAL_NON_NEGATIVE(self.every_s, exc=EnvError)
        check.non_negative("every_s", self.every_s, exc=EnvError)  # generated #98c6d19366

    def report(self, call: str, env: str, exc: BaseException) -> EnvFault:
        """Count `exc` as kind `<call>:<ExceptionClass>` (`<call>:timeout` for a timeout) and log it (first: ERROR with the traceback; then rate-limited)."""
        # VAL: VAL_NON_EMPTY(call, exc=EnvError)
        check.non_empty("call", call, exc=EnvError)  # generated #ec72e3297b
        kind = f"{call}:{'timeout' if isinstance(exc, (TimeoutError, EnvTimeoutError)) else type(exc).__name__}"
        message = str(exc) or repr(exc)
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        fault = EnvFault(kind, message[:1000], env, tb)
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        now = self.clock()
        if n == 1:
            log.error("task %s: env %s: %s raised %s: %s (first occurrence; later ones of this kind are logged at "
                      "most every %.0f s)\n%s", self.label, env, call, kind.split(":", 1)[1], message, self.every_s, tb.rstrip())
            self._last_logged[kind] = (now, n)
            return fault
        t_last, n_last = self._last_logged[kind]
        if now - t_last >= self.every_s:
            log.warning("task %s: env %s: %s raised %s again: %s (%d times since the last line, %d in all)",
                        self.label, env, call, kind.split(":", 1)[1], message, n - n_last, n)
            self._last_logged[kind] = (now, n)
        return fault
