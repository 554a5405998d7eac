"""An asyncio event loop whose clock jumps instead of sleeping (for simulations and fast tests).

Why: ARCHITECTURE §3 runs the same code under a virtual clock; every component takes time only
from `loop.time()` / `asyncio.sleep`, so a loop whose selector advances the clock by the timeout
it would have blocked for turns hours of simulated environment latency into milliseconds.
Only valid when no real I/O is pending (sockets, subprocesses): use for simulated workloads.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualClockEventLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None):
        if timeout is not None and timeout > 0:
            self._vloop.advance(timeout)
        return super().select(0)


class VirtualClockEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is virtual and advances when the loop would block."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        """The virtual time in seconds since the loop was created."""
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (called by the selector instead of blocking)."""
        self._virtual_now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a fresh virtual-clock loop and close the loop."""
    loop = VirtualClockEventLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
