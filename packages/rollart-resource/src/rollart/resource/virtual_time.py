"""The virtual-time runtime: an asyncio event loop whose clock jumps instead of sleeping.

Why (design D13): the simulator runs the same pipeline code as a real run, and every RollArt
component takes time only from ``loop.time()`` and ``asyncio.sleep``. A loop whose selector moves the
clock to the next timer instead of blocking turns hours of simulated serving, environment latency
and training into milliseconds of wall time, with no component changed.

Rules that make a run deterministic:
- the clock jumps to exactly the next timer's deadline (no float drift from summing timeouts);
- work handed to a thread (``asyncio.to_thread``, ``run_in_executor``) takes zero virtual time: while
  any such job is pending the selector blocks for real and the clock stands still;
- with nothing scheduled and nothing pending, the loop blocks like a real loop would.
Real network I/O is not virtualised: simulations use in-process parts only.

Example:
    ```python
    run = run_virtual(asyncio.sleep(3600, result="done"), seed=1)
    assert run.result == "done" and run.virtual_s == 3600.0   # in well under a second of wall time
    ```
"""

from __future__ import annotations

import asyncio
import random
import selectors
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rollart import checks as check
from rollart.resource.errors import ResourceError

__all__ = ["VirtualRun", "VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking and asks the loop to jump its clock by what it would have waited."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if self._vloop._executor_jobs > 0 or timeout is None:
            # a thread is working (its result must arrive at this virtual instant), or nothing is
            # scheduled at all: wait for real I/O (the self-pipe) like a real loop, clock still
            return super().select(None)
        self._vloop._jump(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer instead of sleeping (D13)."""

    def __init__(self, *, seed: int = 0) -> None:
        """Start the clock at 0.0 with a seeded `rng` for the run."""
        # deps: none
        self._virtual_now = 0.0
        self._executor_jobs = 0
        super().__init__(selector=_JumpingSelector(self))
        try:
            # VAL: VAL_INT_RANGE(seed, min=0, max=2**63 - 1, exc=ResourceError)
            check.int_range("seed", seed, min=0, max=2**63 - 1, exc=ResourceError)  # generated #567170a557
        except ResourceError:
            self.close()
            raise
        self.seed = seed
        self.rng = random.Random(seed)

    def time(self) -> float:
        """The virtual time in seconds since the loop was created."""
        # deps: none
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by `seconds` (the selector's jump; tests may call it too)."""
        # deps: none
        # VAL: VAL_NON_NEGATIVE(seconds, exc=ResourceError)
        check.non_negative("seconds", seconds, exc=ResourceError)  # generated #b40e919290
        self._virtual_now += seconds

    def _jump(self, timeout: float) -> None:
        scheduled = self._scheduled  # asyncio's timer heap: the earliest deadline is at [0]
        if scheduled and scheduled[0].when() - self._virtual_now <= timeout:
            self._virtual_now = max(self._virtual_now, scheduled[0].when())
        else:  # the loop capped its wait (asyncio waits at most a day at a time)
            self._virtual_now += timeout

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """As asyncio's, but the clock stands still until the job is done (zero virtual time)."""
        # deps: none
        future = super().run_in_executor(executor, func, *args)
        self._executor_jobs += 1

        def _done(_: asyncio.Future[Any]) -> None:
            self._executor_jobs -= 1

        future.add_done_callback(_done)
        return future


@dataclass(frozen=True)
class VirtualRun(Generic[T]):
    """What `run_virtual` returns: the coroutine's result and how long it took, virtually and really."""

    result: T
    virtual_s: float
    wall_s: float


def run_virtual(coro: Coroutine[Any, Any, T], *, seed: int = 0) -> VirtualRun[T]:
    """Run `coro` to completion on a fresh VirtualTimeLoop, close the loop, return result and elapsed times."""
    # deps: VirtualTimeLoop
    loop = VirtualTimeLoop(seed=seed)
    wall0 = time.perf_counter()  # wall time is reported, never used to decide anything
    try:
        result = loop.run_until_complete(coro)
        return VirtualRun(result, loop.time(), time.perf_counter() - wall0)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
