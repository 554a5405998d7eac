"""Calling one transition hook with a deadline that holds even when the hook ignores cancellation.

Why a task per call instead of ``asyncio.wait_for``: ``wait_for`` cancels the hook at the deadline and
then WAITS for it to finish, so a hook that swallows ``CancelledError`` keeps the whole transition
(and the write lock of the control plane) for as long as it likes, and its late return is taken as
success. Here the hook runs in its own task; at the deadline the task is cancelled and abandoned (it
is kept referenced until it ends, and its late outcome is only logged), and the caller gets a
timeout at the deadline. A hook that raises ``CancelledError`` itself (an inner task of the hook was
cancelled) is a hook failure like any other, not a cancellation of the controller; only the caller's
own cancellation propagates as ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from rollart.resource.ledger import Transition, TransitionHook

__all__ = ["HookOutcome", "call_hook"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HookOutcome:
    """How one hook call ended.

    Attributes:
        hook: the hook's type name (for events and messages).
        method: ``prepare``, ``commit`` or ``abort``.
        error: what the hook raised (``CancelledError`` included), None when it returned.
        timed_out: the hook did not end before its deadline and was abandoned.
    """

    hook: str
    method: str
    error: BaseException | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """The hook returned before its deadline."""
        return self.error is None and not self.timed_out

    def describe(self) -> str:
        """One line for an event or an error message."""
        if self.timed_out:
            return f"{self.hook}.{self.method} missed its deadline (abandoned)"
        if self.error is None:
            return f"{self.hook}.{self.method} ok"
        return f"{self.hook}.{self.method} failed: {type(self.error).__name__}: {self.error}"


def _forget(task: asyncio.Task, background: set[asyncio.Task]) -> None:
    background.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.warning("abandoned transition hook ended late with %s: %s", type(exc).__name__, exc)


async def call_hook(hook: TransitionHook, method: str, transition: Transition, timeout: float,
                    background: set[asyncio.Task]) -> HookOutcome:
    """Run ``hook.<method>(transition)`` for at most ``timeout`` seconds of loop time.

    Args:
        hook: the hook.
        method: ``prepare``, ``commit`` or ``abort``.
        transition: what the hook is told.
        timeout: seconds (0 allowed: the hook still gets one turn of the loop).
        background: where abandoned hook tasks are kept referenced until they end.

    Returns:
        The outcome; never raises for the hook's own errors.

    Raises:
        asyncio.CancelledError: the CALLER was cancelled (the hook's task is cancelled too).
        BaseException: a non-``Exception`` the hook raised that is not a cancellation (a simulated
            process death in tests, ``SystemExit``): it is not the hook's to swallow.
    """
    name = type(hook).__name__
    task = asyncio.ensure_future(getattr(hook, method)(transition))
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        background.add(task)
        task.add_done_callback(lambda t: _forget(t, background))
        raise
    if not done:
        task.cancel()
        background.add(task)
        task.add_done_callback(lambda t: _forget(t, background))
        return HookOutcome(name, method, timed_out=True)
    if task.cancelled():
        return HookOutcome(name, method, error=asyncio.CancelledError(f"{name}.{method} raised CancelledError"))
    exc = task.exception()
    if exc is not None and not isinstance(exc, Exception):
        raise exc
    return HookOutcome(name, method, error=exc)
