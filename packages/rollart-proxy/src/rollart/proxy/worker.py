"""InferenceWorker: the command-driven event loop around one engine (paper section 5.3).

The loop drains a command queue (ADD, ABORT, EVICT, SUSPEND, RESUME, OFFLOAD, RELOAD,
UPDATE_WEIGHTS) and, when none is pending, advances the engine by one step. A finished request
fires its registered callback at once. Adding or aborting is a command handled between two steps,
so it never stalls the running batch. The same class runs in-process and inside a Ray async actor.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rollart import checks as check
from rollart.proxy.engine import Engine
from rollart.proxy.errors import ProxyError, ProxyTimeoutError, WorkerFailedError
from rollart.proxy.types import (
    FINISH_ABORT,
    FINISH_MIGRATED,
    FINISH_WORKER_FAILED,
    EngineOutput,
    EngineRequest,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

OutputCallback = Callable[[EngineOutput], None]
#: How long an idle loop (a step made no progress) waits for a command before stepping again (D26).
IDLE_WAIT_S = 0.05


class CommandKind(str, enum.Enum):
    """What the proxy can ask a worker's loop to do."""

    ADD = "ADD"
    ABORT = "ABORT"
    EVICT = "EVICT"
    SUSPEND = "SUSPEND"
    RESUME = "RESUME"
    OFFLOAD = "OFFLOAD"
    RELOAD = "RELOAD"
    UPDATE_WEIGHTS = "UPDATE_WEIGHTS"


class WorkerState(str, enum.Enum):
    """The worker's lifecycle; only RUNNING steps the engine."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    OFFLOADED = "offloaded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class Command:
    """One queued command and the future its sender awaits."""

    kind: CommandKind
    payload: Any = None
    reply: asyncio.Future | None = None


@dataclass(frozen=True)
class WorkerStats:
    """A snapshot for routing, scheduling and tests."""

    worker_id: str
    state: str
    version: int
    running: int
    waiting: int
    tokens_in_flight: int
    free_kv_tokens: int
    steps: int
    adds_refused: int
    restarts: int


@dataclass
class _Pending:
    request: EngineRequest
    callback: OutputCallback


class InferenceWorker:
    """One engine, one loop. Build the engine with ``engine_factory`` so a restart gets a fresh one."""

    def __init__(
        self,
        worker_id: str,
        engine_factory: Callable[[], Engine],
        *,
        hardware: str = "default",
        devices: tuple[int, ...] = (),
        command_timeout_s: float = 120.0,
    ) -> None:
        """Create a worker; ``start()`` builds the engine and starts the loop."""
        # VAL: VAL_NON_EMPTY(worker_id, exc=ProxyError)
        check.non_empty("worker_id", worker_id, exc=ProxyError)  # generated #fc45e9d3a7
        # VAL: VAL_TIMEOUT(command_timeout_s, exc=ProxyError)
        check.timeout("command_timeout_s", command_timeout_s, exc=ProxyError)  # generated #9f2ecf020c
        self.worker_id = worker_id
        self.hardware = hardware
        self.devices = tuple(devices)
        self._factory = engine_factory
        self._timeout = command_timeout_s
        self._engine: Engine | None = None
        self._queue: asyncio.Queue[Command] = asyncio.Queue()
        self._pending: dict[str, _Pending] = {}
        self._state = WorkerState.STOPPED
        self._resume_to = WorkerState.RUNNING
        self._task: asyncio.Task | None = None
        self._steps = 0
        self._adds_refused = 0
        self._restarts = 0
        self._failure: BaseException | None = None

    @property
    def state(self) -> WorkerState:
        """The current lifecycle state."""
        return self._state

    @property
    def engine(self) -> Engine | None:
        """The engine now driven (None before start)."""
        return self._engine

    async def start(self) -> None:
        """Build the engine and start the loop."""
        # VAL: VAL_ONE_OF(self._state, choices=(WorkerState.STOPPED, WorkerState.FAILED), exc=ProxyError)
        check.one_of("state", self._state, (WorkerState.STOPPED, WorkerState.FAILED), exc=ProxyError)  # generated #d5e66914ee
        self._engine = self._factory()
        self._queue = asyncio.Queue()
        self._state = WorkerState.RUNNING
        self._failure = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"worker-{self.worker_id}")

    async def stop(self) -> None:
        """Stop the loop; pending requests are handed back as migrated (nothing is lost)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._hand_back_all(FINISH_MIGRATED)
        self._fail_queued(ProxyError(f"worker {self.worker_id} stopped"))
        self._state = WorkerState.STOPPED

    async def restart(self) -> None:
        """Replace a failed engine by a fresh one on the same device (weights at factory version)."""
        await self.stop()
        self._restarts += 1
        await self.start()

    def add_request(self, request: EngineRequest, callback: OutputCallback) -> None:
        """Enqueue ADD: ``callback`` fires once with the request's final or handed-back output."""
        if self._task is None:  # stopped: nobody would ever answer, so hand it back at once
            self._adds_refused += 1
            callback(EngineOutput(request.request_id, request.generated_ids, request.generated_logprobs,
                                  request.generated_versions, FINISH_WORKER_FAILED))
            return
        self._queue.put_nowait(Command(CommandKind.ADD, _Pending(request, callback)))

    def submit(self, request: EngineRequest) -> asyncio.Future[EngineOutput]:
        """Enqueue ADD now and return a future of the output (finished, aborted, migrated or worker_failed).

        Not a coroutine on purpose: the ADD is queued at the moment the proxy routes, so a shrink
        that starts afterwards always finds it (its EVICT is queued behind the ADD).
        """
        future: asyncio.Future[EngineOutput] = asyncio.get_running_loop().create_future()

        def deliver(output: EngineOutput) -> None:
            if not future.done():
                future.set_result(output)

        self.add_request(request, deliver)
        return future

    async def _command(self, kind: CommandKind, payload: Any = None) -> Any:
        if self._state in (WorkerState.STOPPED,) or self._task is None:
            raise WorkerFailedError(f"worker {self.worker_id} is {self._state.value}; cannot run {kind.value}")
        reply: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(Command(kind, payload, reply))
        try:
            return await asyncio.wait_for(reply, self._timeout)
        except TimeoutError as exc:
            raise ProxyTimeoutError(
                f"worker {self.worker_id}: {kind.value} not done within command_timeout_s={self._timeout}"
            ) from exc

    async def abort(self, request_id: str) -> bool:
        """Abort one request (its callback gets finish_reason ``abort``); False if it is not here."""
        return await self._command(CommandKind.ABORT, request_id)

    async def evict(self, request_ids: list[str] | None = None) -> list[str]:
        """Hand requests back as ``migrated`` with their tokens so far (all if ``None``)."""
        return await self._command(CommandKind.EVICT, request_ids)

    async def suspend(self) -> None:
        """Stop stepping; requests stay, and commands are still served."""
        await self._command(CommandKind.SUSPEND)

    async def resume(self) -> None:
        """Step again after ``suspend``."""
        await self._command(CommandKind.RESUME)

    async def offload(self) -> None:
        """Hand back any request still here, then offload the engine's weights."""
        await self._command(CommandKind.OFFLOAD)

    async def reload(self) -> None:
        """Reload the weights after ``offload``."""
        await self._command(CommandKind.RELOAD)

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights by name as ``version``; in-flight requests continue under them."""
        await self._command(CommandKind.UPDATE_WEIGHTS, (weights, version))

    async def probe(self) -> WorkerStats:
        """Answer the proxy's health check: the stats while the loop runs and the engine is not FAILED.

        Raises WorkerFailedError when the loop is gone (stopped or crashed) or the engine failed, so an
        idle dead worker is found without a request having to fail on it.
        """
        if self._task is None or self._task.done() or self._state is WorkerState.FAILED:
            loop = "no loop" if self._task is None else ("loop ended" if self._task.done() else "loop running")
            raise WorkerFailedError(f"worker {self.worker_id} is {self._state.value} ({loop})")
        return self.stats()

    def stats(self) -> WorkerStats:
        """A snapshot of state, version and load."""
        load = self._engine.load() if self._engine is not None else None
        return WorkerStats(
            worker_id=self.worker_id,
            state=self._state.value,
            version=self._engine.version if self._engine is not None else -1,
            running=load.running if load else 0,
            waiting=load.waiting if load else 0,
            tokens_in_flight=load.tokens_in_flight if load else 0,
            free_kv_tokens=load.free_kv_tokens if load else 0,
            steps=self._steps,
            adds_refused=self._adds_refused,
            restarts=self._restarts,
        )

    # ---- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        engine = self._engine
        assert engine is not None
        while True:
            while not self._queue.empty():
                await self._handle(self._queue.get_nowait())
            if self._state is WorkerState.RUNNING and engine.has_work():
                try:
                    outputs = await engine.step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the engine is broken: hand everything back, stop stepping
                    self._on_failure(exc)
                    continue
                self._steps += 1
                for output in outputs:
                    self._deliver(output)
                if not outputs and engine.load().running == 0:
                    await self._idle_wait()  # the step made no progress: wait, do not spin (D26)
                else:
                    await asyncio.sleep(0)  # let other workers and the proxy run between steps
            else:
                await self._handle(await self._queue.get())

    async def _idle_wait(self) -> None:
        """Wait for the next command, at most IDLE_WAIT_S (an engine may progress on its own)."""
        try:
            cmd = await asyncio.wait_for(self._queue.get(), IDLE_WAIT_S)
        except TimeoutError:
            return
        await self._handle(cmd)

    def _deliver(self, output: EngineOutput) -> None:
        pending = self._pending.pop(output.request_id, None)
        if pending is not None:
            pending.callback(output)

    def _hand_back(self, request_id: str, reason: str) -> None:
        pending = self._pending.get(request_id)
        if pending is None:
            return
        output = None
        if self._engine is not None:
            try:
                output = self._engine.abort_request(request_id)
            except Exception:  # a broken engine may not know its requests any more
                output = None
        if output is None:
            req = pending.request
            output = EngineOutput(req.request_id, req.generated_ids, req.generated_logprobs, req.generated_versions, reason)
        self._deliver(EngineOutput(output.request_id, output.token_ids, output.logprobs, output.token_versions, reason))

    def _hand_back_all(self, reason: str) -> None:
        for request_id in list(self._pending):
            self._hand_back(request_id, reason)

    def _fail_queued(self, exc: BaseException) -> None:
        while not self._queue.empty():
            cmd = self._queue.get_nowait()
            if cmd.kind is CommandKind.ADD:
                req = cmd.payload.request
                cmd.payload.callback(
                    EngineOutput(req.request_id, req.generated_ids, req.generated_logprobs, req.generated_versions, FINISH_WORKER_FAILED)
                )
            elif cmd.reply is not None and not cmd.reply.done():
                cmd.reply.set_exception(exc)

    def _on_failure(self, exc: BaseException) -> None:
        log.error("worker %s: engine step failed, handing back %d requests", self.worker_id, len(self._pending),
                  exc_info=exc)
        self._failure = exc
        self._state = WorkerState.FAILED
        self._hand_back_all(FINISH_WORKER_FAILED)

    async def _handle(self, cmd: Command) -> None:
        try:
            result = await self._execute(cmd)
        except Exception as exc:
            if cmd.reply is not None and not cmd.reply.done():
                cmd.reply.set_exception(exc)
            return
        if cmd.reply is not None and not cmd.reply.done():
            cmd.reply.set_result(result)

    async def _execute(self, cmd: Command) -> Any:
        engine = self._engine
        assert engine is not None
        kind = cmd.kind
        if kind is CommandKind.ADD:
            pending: _Pending = cmd.payload
            req = pending.request
            if self._state in (WorkerState.OFFLOADED, WorkerState.FAILED):
                self._adds_refused += 1
                reason = FINISH_WORKER_FAILED if self._state is WorkerState.FAILED else FINISH_MIGRATED
                pending.callback(EngineOutput(req.request_id, req.generated_ids, req.generated_logprobs, req.generated_versions, reason))
                return None
            try:
                engine.add_request(req)
            except Exception as exc:  # bad request: answer it as aborted, never leave it hanging
                pending.callback(
                    EngineOutput(req.request_id, req.generated_ids, req.generated_logprobs, req.generated_versions, FINISH_ABORT)
                )
                raise ProxyError(f"worker {self.worker_id}: engine rejected {req.request_id!r}: {exc}") from exc
            self._pending[req.request_id] = pending
            return None
        if kind is CommandKind.ABORT:
            if cmd.payload not in self._pending:
                return False
            self._hand_back(cmd.payload, FINISH_ABORT)
            return True
        if kind is CommandKind.EVICT:
            ids = list(self._pending) if cmd.payload is None else [i for i in cmd.payload if i in self._pending]
            for request_id in ids:
                self._hand_back(request_id, FINISH_MIGRATED)
            return ids
        if kind is CommandKind.SUSPEND:
            if self._state is WorkerState.RUNNING:
                self._state = WorkerState.SUSPENDED
            self._resume_to = WorkerState.SUSPENDED
            return None
        if kind is CommandKind.RESUME:
            if self._state is WorkerState.SUSPENDED:
                self._state = WorkerState.RUNNING
            self._resume_to = WorkerState.RUNNING
            return None
        if kind is CommandKind.OFFLOAD:
            self._hand_back_all(FINISH_MIGRATED)
            await engine.offload()
            if self._state is not WorkerState.FAILED:
                self._state = WorkerState.OFFLOADED
            return None
        if kind is CommandKind.RELOAD:
            await engine.reload()
            if self._state is WorkerState.OFFLOADED:
                self._state = self._resume_to
            return None
        if kind is CommandKind.UPDATE_WEIGHTS:
            weights, version = cmd.payload
            # VAL: VAL_VERSION_MONOTONIC(version, engine.version, strict=False, exc=ProxyError)
            check.version_monotonic("version", version, engine.version, strict=False, exc=ProxyError)  # generated #08b24b2b5c
            await engine.load_weights(weights, version)
            return None
        raise ProxyError(f"unknown command {kind!r}")


class WorkerHandle(Protocol):
    """How the proxy talks to a worker: an in-process ``InferenceWorker`` or a ``RayWorkerHandle``.

    ``LLMProxy`` owns one handle per rank (``WorkerSlot.handle``) and calls it from its event loop.
    Each async method is a command the worker serves between two engine steps, in the order sent;
    a command the worker cannot serve (it is stopped or gone) raises ``WorkerFailedError``, one not
    served in time ``ProxyTimeoutError``.
    """

    worker_id: str
    """A name unique among the proxy's workers: it is in ``GenerateResponse.worker_ids``, events and
    logs (``RoutingLog`` maps it to a hardware type). A replacement worker has a new one."""

    hardware: str
    """The hardware type name (``H800``, ...) the affinity router matches a request's tag against;
    fixed for the handle's life."""

    devices: tuple[int, ...]
    """The ledger device ids the worker occupies: ``LLMProxy.shrink`` returns them and the
    time-sharing pool maps devices to ranks by them; fixed for the handle's life."""

    def submit(self, request: EngineRequest) -> Awaitable[EngineOutput]:
        """Queue ``request`` now and return an awaitable of its output; called once per routing of a request.

        A plain function on purpose: the ADD must be queued when the proxy routes, so an ``evict``
        sent afterwards (a shrink) finds it. The awaitable resolves exactly once, with the output
        ``stop``/``length`` (done), ``abort``, ``migrated`` (handed back with the tokens so far; the
        proxy continues it elsewhere) or ``worker_failed`` (the worker broke or is stopped; the proxy
        restarts it and continues the request); a remote worker that died may raise
        ``WorkerFailedError`` instead, which the proxy treats as ``worker_failed``. The request may
        carry tokens generated elsewhere (a resumed request). The proxy bounds the wait by the
        request's deadline and then aborts it.
        """
        ...

    async def abort(self, request_id: str) -> bool:
        """Finish one request now as ``abort``; its ``submit`` awaitable resolves with the tokens so far.

        Called by ``LLMProxy.abort`` (a trajectory aborted, e.g. for staleness) and when a request
        misses its deadline. Returns False when the request is not on this worker (already answered
        or handed back), which is not an error. The proxy logs and ignores an exception here.
        """
        ...

    async def evict(self, request_ids: list[str] | None = None) -> list[str]:
        """Hand requests back as ``migrated`` with their tokens so far (all when ``None``); return their ids.

        Called by ``LLMProxy.shrink`` (every request, before ``offload``) and by the rebalance after
        ``expand`` (the youngest requests of an overloaded worker). Ids not on the worker are skipped.
        """
        ...

    async def suspend(self) -> None:
        """Stop stepping the engine; requests stay in place (their awaitables stay pending).

        Called by ``LLMProxy.suspend`` on every worker not removed, before a weight update, and on a
        restarted worker while the proxy is suspended. Commands (ADD, ABORT, ``load_weights``) are
        still served meanwhile; a second call changes nothing. A worker that failed may raise
        ``WorkerFailedError`` (the proxy skips it).
        """
        ...

    async def resume(self) -> None:
        """Step again after ``suspend``; paused requests continue under the weights now loaded.

        Called by ``LLMProxy.resume`` on every worker not removed; a no-op on a running worker, and
        on an offloaded one it takes effect at ``reload``.
        """
        ...

    async def offload(self) -> None:
        """Hand back any request still here as ``migrated``, then free the device memory of weights and KV.

        Called by ``LLMProxy.shrink`` after ``evict``, so the devices can be lent to training; until
        ``reload`` every new request is handed back at once.
        """
        ...

    async def reload(self) -> None:
        """Bring the weights back after ``offload``; the worker steps (or stays suspended) as before.

        Called by ``LLMProxy.expand``, which then sends ``load_weights`` when the worker's version is
        older than the proxy's; only after both is the worker routed to again.
        """
        ...

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``weights`` by name and serve ``version`` from now on; in-flight requests continue under them.

        Called by ``LLMProxy.update_weights`` on every active worker at once (the same mapping for
        all: do not modify it), by ``expand`` for a stale worker and after a restart or a
        replacement. ``version`` is never below the one served; the one served now is accepted
        again only with the same weights, anything else raises ``ProxyError`` (a version names one
        set of weights). Returns when the weights are in use.
        """
        ...

    async def restart(self) -> None:
        """Replace a failed engine by a fresh one on the same devices, handing back requests still here.

        Called by the proxy after a failure (a ``worker_failed`` output or a failed probe) while its
        restart budget allows. The fresh engine serves the factory's weights; the proxy then sends
        the latest weights and its suspension state before routing to it. Raising removes the worker.
        """
        ...

    async def probe(self) -> Any:
        """Health check: return while the worker can serve, raise ``WorkerFailedError`` (or time out) when it cannot.

        Called by ``LLMProxy.check_health`` on every active worker each ``health_check_interval_s``,
        bounded by ``health_check_timeout_s``; a failure is handled like a failed request (restart
        or removal). The return value is not used. Optional: the proxy treats a handle without
        ``probe`` as checked by its requests only.
        """
        ...

    async def stop(self) -> None:
        """Stop the worker for good: requests still here are handed back as ``migrated``, queued commands fail.

        Called when the proxy removes a worker (restart budget spent, a failed restart or
        replacement) and by ``LLMProxy.close``; the proxy logs or ignores an exception here.
        """
        ...
