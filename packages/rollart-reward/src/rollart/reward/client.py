"""`RewardClient`: the async client of the reward service, with deadlines, retries and idempotency keys.

Why per-item keys: a retry after a timeout, a 5xx or a killed server re-sends the same keys; the
service returns stored results for keys it already scored, so a trajectory is never scored twice.
Only unfinished items (transport failure, `timeout`/`busy`) are re-sent. The caller's deadline
bounds everything: each attempt's HTTP timeout and the server-side `timeout_s` are cut to what is
left, and a batch not done by the deadline raises `RewardTimeoutError`.

Why retry until the deadline (design D12): a service restart takes seconds, and connection errors
are instant, so a fixed attempt count spent itself in a few seconds of backoff and gave up long
before the deadline. Attempts are spaced by the shared policy of `rollart.resource.retry`
(exponential backoff with equal jitter, on tenacity), a 429's `Retry-After` is honoured, and
`max_attempts` is only an optional cap.

Why one connection pool per event loop (design D26): an `httpx.AsyncClient`'s connections belong to
the loop that opened them, so a client reused by a second `asyncio.run` failed with "Event loop is
closed" from inside httpx. Each running loop gets its own pool, and the pool's closing is tied to
its loop: a parked async generator that the loop's `shutdown_asyncgens` (run by `asyncio.run` before
it closes the loop) finalizes, closing the pool on that loop while it still runs. A loop closed
without that shutdown leaves its pool to the garbage collector: nothing can be awaited on it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rollart import checks as check
from rollart.env.trajectory import Trajectory
from rollart.resource.retry import Backoff, retrying
from rollart.reward.errors import RewardAttemptsExhaustedError, RewardError, RewardRequestError, RewardTimeoutError
from rollart.reward.protocol import RewardResult

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
log = logging.getLogger(__name__)
EventHook = Callable[[str, dict[str, Any]], None]


@dataclass
class ClientStats:
    """What a client saw, cumulative (D30): final errors by class, retried attempts, outages and their seconds.

    An outage starts at the first attempt that fails on the transport or with a 5xx after a success
    (or at the start) and ends at the next answered attempt; its seconds count when it ends.
    """

    errors: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    outages: int = 0
    outage_s: float = 0.0

    def snapshot(self) -> dict[str, Any]:
        """A copy as plain data (what the pipeline's metrics difference per iteration)."""
        return {"errors": dict(self.errors), "retries": self.retries, "outages": self.outages, "outage_s": self.outage_s}


def idempotency_key(reward: str, trajectory: Trajectory) -> str:
    """One key per (reward, trajectory): the same trajectory scored by the same reward is one result."""
    return f"{reward}:{trajectory.id}"


class RewardClient:
    """Scores batches of trajectories on a reward service."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout_s: float = 30.0,
        max_attempts: int | None = None,
        backoff_base_s: float = 0.1,
        backoff_max_s: float = 2.0,
        seed: int | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        """`timeout_s` bounds one HTTP attempt; the per-call `deadline_s` bounds the whole batch, and
        `max_attempts` (None: no cap) optionally caps the attempts within it. `on_event(kind, detail)`
        hears `reward_outage` and `reward_recovered` (D30)."""
        # AST: AST_PRECONDITION(base_url.startswith(("http://", "https://")), got=base_url, msg="base_url is http(s)", exc=RewardError)
        check.precondition(base_url.startswith(("http://", "https://")), "base_url is http(s)", got=base_url, exc=RewardError)  # generated #8ed6e1e28a
        # VAL: VAL_TIMEOUT(timeout_s, exc=RewardError)
        check.timeout("timeout_s", timeout_s, exc=RewardError)  # generated #cc70f04010
        if max_attempts is not None:
            # VAL: VAL_INT_RANGE(max_attempts, min=1, max=1000000, exc=RewardError)
            check.int_range("max_attempts", max_attempts, min=1, max=1000000, exc=RewardError)  # generated #5fb611d0ca
        # VAL: VAL_NON_NEGATIVE(backoff_base_s, exc=RewardError)
        check.non_negative("backoff_base_s", backoff_base_s, exc=RewardError)  # generated #4f313a0d7a
        # VAL: VAL_NON_NEGATIVE(backoff_max_s, exc=RewardError)
        check.non_negative("backoff_max_s", backoff_max_s, exc=RewardError)  # generated #33ef74722c
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.backoff = Backoff(base_s=backoff_base_s, max_s=backoff_max_s, jitter="equal")
        self._rng = random.Random(seed)
        # loop -> (its pool, the parked generator that closes the pool when the loop shuts down); not a
        # WeakKeyDictionary: the generator holds its loop's finalizer hook, so the loop would never be freed
        self._pools: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, AsyncGenerator[None, None]]] = {}
        self.attempts = 0
        self.stats = ClientStats()
        self.on_event = on_event
        self._outage_since: float | None = None
        self._outage_problem = ""

    def _attempt_failed(self, problem: str) -> None:
        """An attempt that got no answer (transport) or a 5xx: an outage starts unless one is on (D30)."""
        if self._outage_since is not None:
            return
        self._outage_since = asyncio.get_running_loop().time()
        self._outage_problem = problem
        self.stats.outages += 1
        log.warning("reward service %s is not answering (%s); retrying until each call's deadline", self.base_url, problem)
        if self.on_event is not None:
            self.on_event("reward_outage", {"service": self.base_url, "problem": problem})

    def _attempt_answered(self) -> None:
        """An answered attempt ends an outage: one log line, its seconds counted, `reward_recovered` (D30)."""
        if self._outage_since is None:
            return
        seconds = asyncio.get_running_loop().time() - self._outage_since
        self._outage_since = None
        self.stats.outage_s += seconds
        log.warning("reward service %s answers again after %.1f s (%s)", self.base_url, seconds, self._outage_problem)
        if self.on_event is not None:
            self.on_event("reward_recovered", {"service": self.base_url, "outage_s": seconds})

    def _count_error(self, err: RewardError) -> None:
        kind = type(err).__name__
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
        log.warning("reward service %s: scoring failed: %s: %s", self.base_url, kind, err)

    async def _client(self) -> httpx.AsyncClient:
        """The running loop's pool, made on first use in that loop (D26)."""
        loop = asyncio.get_running_loop()
        for owner in [owner for owner in list(self._pools) if owner.is_closed()]:
            self._pools.pop(owner, None)  # a finished asyncio.run: its pool was closed at its shutdown, or is lost
        entry = self._pools.get(loop)
        if entry is None or entry[0].is_closed:
            http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self.token}"})
            closer = _close_with_loop(http)
            await closer.__anext__()  # the loop now finalizes it at shutdown_asyncgens
            self._pools[loop] = (http, closer)
            entry = (http, closer)
        return entry[0]

    async def score_batch(self, reward: str, trajectories: Sequence[Trajectory], deadline_s: float = 60.0) -> list[RewardResult]:
        """Score every trajectory (results in input order), retrying until the deadline.

        Raises `RewardTimeoutError` (deadline), `RewardAttemptsExhaustedError` (`max_attempts`) or
        `RewardRequestError` (a non-retryable status); each names its limit in `limit` and the message,
        is logged and counted in `stats.errors` by class (D30).
        """
        # deps: idempotency_key, RewardClient._post
        # VAL: VAL_TIMEOUT(deadline_s, exc=RewardError)
        check.timeout("deadline_s", deadline_s, exc=RewardError)  # generated #4682918efd
        keys = [idempotency_key(reward, t) for t in trajectories]
        # VAL: VAL_UNIQUE(keys, exc=RewardError)
        check.unique("keys", keys, exc=RewardError)  # generated #7b03952c54
        try:
            return await self._score_batch(reward, trajectories, deadline_s, keys)
        except RewardError as err:
            self._count_error(err)
            raise

    async def _score_batch(self, reward: str, trajectories: Sequence[Trajectory], deadline_s: float,
                           keys: list[str]) -> list[RewardResult]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        pending = dict(zip(keys, trajectories))
        done: dict[str, RewardResult] = {}
        start = loop.time()

        def exhausted(attempts: int, error: BaseException) -> RewardAttemptsExhaustedError:
            left = deadline - loop.time()
            return RewardAttemptsExhaustedError(
                f"max_attempts={self.max_attempts} reached with {left:.1f} s of deadline_s={deadline_s:g} "
                f"left: {len(pending)} of {len(keys)} items unscored; last problem: {error}",
                attempts=attempts, elapsed_s=loop.time() - start, unscored=len(pending), last_problem=str(error))

        last_problem = "no attempt made"
        policy = retrying(self.backoff, self._rng, retry_on=(_Unfinished,), max_attempts=self.max_attempts,
                          deadline=deadline, min_pause=lambda error: getattr(error, "retry_after", 0.0), give_up=exhausted)
        async for attempt in policy:
            with attempt:
                number = attempt.retry_state.attempt_number
                self.stats.retries += int(number > 1)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise RewardTimeoutError(
                        f"deadline_s={deadline_s:g} reached: {len(pending)} of {len(keys)} items unscored after "
                        f"{number - 1} attempt(s) over {loop.time() - start:.1f} s; last problem: {last_problem}",
                        attempts=number - 1, elapsed_s=loop.time() - start, unscored=len(pending),
                        last_problem=last_problem)
                try:
                    results = await self._post(reward, pending, remaining)
                except (TimeoutError, httpx.TransportError, _Retryable) as exc:
                    last_problem = f"{type(exc).__name__}: {exc}"
                    if not (isinstance(exc, _Retryable) and str(exc) == "HTTP 429"):  # busy is an answer, not an outage
                        self._attempt_failed(last_problem)
                    else:
                        self._attempt_answered()
                    raise _Unfinished(last_problem, exc.retry_after if isinstance(exc, _Retryable) else 0.0) from exc
                except RewardRequestError:
                    self._attempt_answered()
                    raise
                self._attempt_answered()
                for item in results:
                    if item["status"] == "ok" and item["key"] in pending:
                        done[item["key"]] = RewardResult(score=item["score"], details=item.get("details") or {})
                        del pending[item["key"]]
                    elif item["key"] in pending:
                        last_problem = f"item {item['key']}: {item['status']} {item.get('error') or ''}".strip()
                if pending:
                    raise _Unfinished(last_problem)
        return [done[k] for k in keys]

    async def score(self, reward: str, trajectory: Trajectory, deadline_s: float = 60.0) -> RewardResult:
        """Score one trajectory."""
        return (await self.score_batch(reward, [trajectory], deadline_s))[0]

    async def _post(self, reward: str, pending: dict[str, Trajectory], remaining: float) -> list[dict[str, Any]]:
        self.attempts += 1
        attempt_timeout = max(0.05, min(self.timeout_s, remaining))
        body = {
            "reward": reward,
            "timeout_s": max(0.01, attempt_timeout - 0.05),  # the server stops a slow item before we give up
            "items": [{"key": k, "trajectory": t.model_dump(mode="json")} for k, t in pending.items()],
        }
        response = await asyncio.wait_for(
            (await self._client()).post(f"{self.base_url}/v1/score", json=body, timeout=attempt_timeout), attempt_timeout + 0.5
        )
        if response.status_code in RETRY_STATUSES:
            raise _Retryable(f"HTTP {response.status_code}", _retry_after(response))
        if response.status_code >= 400:
            try:
                err = response.json()["error"]
                raise RewardRequestError(response.status_code, err["code"], err["message"])
            except (ValueError, KeyError, TypeError):
                raise RewardRequestError(response.status_code, "http_error", response.text[:300]) from None
        return response.json()["results"]

    async def health(self) -> dict[str, Any]:
        """GET /health (no auth)."""
        response = await (await self._client()).get(f"{self.base_url}/health", timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()

    async def metrics(self) -> dict[str, Any]:
        """GET /metrics of whichever worker answers."""
        response = await (await self._client()).get(f"{self.base_url}/metrics", timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()

    async def aclose(self) -> None:
        """Close the calling loop's connection pool; pools of other loops are released to their loops.

        A released pool is closed by its own loop (the generator's finalizer schedules the close there)
        when that loop still runs, and dropped when it is closed; the client stays usable afterwards.
        """
        loop = asyncio.get_running_loop()
        entries = list(self._pools.items())
        self._pools.clear()
        for owner, (_, closer) in entries:
            if owner is loop:
                await closer.aclose()  # runs its finally: the pool is closed here, on its own loop


async def _close_with_loop(http: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    """Parked at `yield` until its loop's `shutdown_asyncgens` (or `aclose`) finalizes it, then closes `http`."""
    try:
        yield
    finally:
        await http.aclose()


class _Retryable(Exception):
    """A 429 or 5xx: the whole attempt is retried after backoff (at least `Retry-After`)."""

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Unfinished(_Retryable):
    """An attempt that left items unscored (its message is the last problem): retried with the rest."""


def _retry_after(response: httpx.Response) -> float:
    """A `Retry-After` header in seconds (0 when absent or not a number; HTTP dates are not used here)."""
    try:
        return max(0.0, min(float(response.headers.get("retry-after", "0")), 60.0))
    except ValueError:
        return 0.0
