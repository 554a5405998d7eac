"""A killable process pool for symbolic grading (design D27).

Why processes, not the thread `math_equivalent` used to run in: sympy is pure Python and holds the
GIL while it multiplies a billion-digit integer, so a thread cannot be interrupted and starves the
event loop beside it (the service stopped answering /health for 82 s and ignored SIGTERM). A worker
process can be killed at the deadline; the event loop only waits on its pipe (`add_reader`, no
thread). Why not `concurrent.futures.ProcessPoolExecutor`: it cannot kill one stuck worker, only
break the whole pool and every other item in flight with it.

Workers come from the `forkserver` context with sympy and math-verify preloaded, so a replacement
for a killed worker starts in milliseconds instead of re-importing sympy, and no worker is forked
from a uvicorn process with live threads. The grading clock starts when a ready worker gets the job:
a cold start does not count against the item.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import weakref
from dataclasses import dataclass
from typing import Any

from rollart import checks as check
from rollart.reward.errors import RewardError

DEFAULT_POOL_SIZE = 2
STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine; only a cold start waits for it


class GradingTimeout(RewardError):
    """The grader did not finish within its deadline; its worker was killed and will be replaced."""


class GradingFailed(RewardError):
    """The worker died while grading (e.g. killed by the OS); the item is not graded."""


def _worker_main(conn: Any) -> None:
    """Grade (prediction, truth) pairs from the pipe until it closes; ignore Ctrl-C (the parent decides)."""
    import logging

    from rollart.reward.rules import grade

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    conn.send("ready")
    while True:
        try:
            prediction, truth = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        conn.send(grade(prediction, truth))


@dataclass
class _Worker:
    proc: Any
    conn: Any


class GradingPool:
    """At most `size` worker processes grading at once; a worker past its deadline is killed."""

    def __init__(self, size: int = DEFAULT_POOL_SIZE) -> None:
        """Workers start lazily, on the first item that finds none idle."""
        # VAL: VAL_INT_RANGE(size, min=1, max=64, exc=RewardError)
        check.int_range("size", size, min=1, max=64, exc=RewardError)  # generated #07b05732d7
        self.size = size
        self._idle: list[_Worker] = []
        self._live: set[int] = set()
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["sympy", "math_verify", "rollart.reward.rules"])

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores[loop] = asyncio.Semaphore(self.size)
        return self._semaphores[loop]

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child,), daemon=True, name="rollart-grader")
        proc.start()
        child.close()
        worker = _Worker(proc, parent)
        self._live.add(proc.pid)
        if not parent.poll(STARTUP_TIMEOUT_S) or parent.recv() != "ready":
            self._kill(worker)
            raise GradingFailed(f"grading worker not ready within {STARTUP_TIMEOUT_S:g} s")
        return worker

    def _kill(self, worker: _Worker) -> None:
        self._live.discard(worker.proc.pid)
        with contextlib.suppress(Exception):
            worker.proc.kill()
        with contextlib.suppress(Exception):
            worker.conn.close()
        with contextlib.suppress(Exception):
            worker.proc.join(5)

    async def _take(self) -> _Worker:
        with contextlib.suppress(IndexError):  # pop, not check-then-pop: loops in other threads share the list
            return self._idle.pop()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self._spawn)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:  # keep a worker that starts anyway for the next item
            future.add_done_callback(lambda f: None if f.cancelled() or f.exception() else self._idle.append(f.result()))
            raise

    async def grade(self, prediction: str, truth: str, timeout_s: float) -> tuple[bool, str | None]:
        """`rules.grade(prediction, truth)` in a worker, bounded by `timeout_s` of grading.

        Raises `GradingTimeout` at the deadline (the worker is killed: sympy cannot be interrupted any
        other way) and `GradingFailed` if the worker died. Cancellation kills the worker too: it
        might be stuck, and a worker is cheap to replace.
        """
        # deps: rules.grade
        # VAL: VAL_TIMEOUT(timeout_s, exc=RewardError)
        check.timeout("timeout_s", timeout_s, exc=RewardError)  # generated #cc70f04010
        async with self._semaphore():
            worker = await self._take()
            loop = asyncio.get_running_loop()
            readable = loop.create_future()
            fd = worker.conn.fileno()
            loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
            keep = False
            try:
                worker.conn.send((prediction, truth))
                await asyncio.wait_for(readable, timeout=timeout_s)
                result = worker.conn.recv()
                keep = True
                return result
            except TimeoutError:
                raise GradingTimeout(f"grading did not finish within {timeout_s:g} s") from None
            except (EOFError, OSError) as exc:
                raise GradingFailed(f"grading worker died: {exc!r}") from None
            finally:
                loop.remove_reader(fd)
                if keep:
                    self._idle.append(worker)
                else:  # killed off the loop: join may wait for the OS to reap it
                    loop.run_in_executor(None, self._kill, worker)

    def close(self) -> None:
        """Kill every idle worker (busy ones are killed by their own grading call or at exit: daemons)."""
        while self._idle:
            self._kill(self._idle.pop())

    def worker_pids(self) -> set[int]:
        """The pids of the live workers (for tests and /metrics)."""
        return set(self._live)


_SHARED: dict[int, GradingPool] = {}


def shared_pool() -> GradingPool:
    """The grading pool of this process (one per pid, so a forked process does not reuse its parent's)."""
    # deps: GradingPool
    pid = os.getpid()
    if pid not in _SHARED:
        _SHARED[pid] = GradingPool()
    return _SHARED[pid]


def close_shared_pool() -> None:
    """Kill this process's idle grading workers (the service's shutdown)."""
    pool = _SHARED.pop(os.getpid(), None)
    if pool is not None:
        pool.close()
