"""The Cluster: a controller-side proxy for a group of workers (paper §5.2, Listing 2).

Why a proxy object: the single-controller pipeline script calls ``trainers.compute_gradients(batch)``
and the cluster decides who runs it (all workers, rank 0, a data-parallel split, or the workers of
the preferred hardware for the call's tag). The cluster creates its workers through the
ResourceManager (devices from the ledger, placement from the runtime), reports them in the store,
installs serverless clients, and repairs failures: a dead worker is restarted once on the same
devices; if it dies again it is removed and its devices go back to the free pool (R9).
Proxies are async (design D7): ``await trainers.compute_gradients(batch)``.

Every call has a deadline (R11, design D20): the cluster's ``call_timeout``, a method's own
``register(timeout=)``/``hw_mapping(timeout=)``, or one call's ``rollart_timeout=`` keyword. A worker
method that never returns ends with ``CallTimeout`` naming the method, the worker and the deadline;
the worker is not declared dead for it (it may only be slow), the event ``worker_call_timeout`` is
recorded and ``check_health`` reports it ``unresponsive``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollart import checks as check
from rollart.resource.decorators import ROUTE_MODE, DispatchSpec, dispatch_spec_of
from rollart.resource.errors import (
    CallTimeout,
    ResourceError,
    ServerlessError,
    UnknownHardwareError,
    WorkerDiedError,
    WorkerFailedError,
)
from rollart.resource.manager import ResourceManager
from rollart.resource.runtime import LocalRuntime, WorkerContext, WorkerRuntime
from rollart.resource.serverless import ServerlessClient, redact_url
from rollart.resource.store import WorkerRecord
from rollart.resource.worker import Worker

log = logging.getLogger(__name__)

__all__ = ["CALL_TIMEOUT_KEYWORD", "Cluster"]

CALL_TIMEOUT_KEYWORD = "rollart_timeout"
"""The keyword a caller adds to one cluster call to set that call's deadline (it is not passed to the worker)."""


@dataclass
class _Member:
    rank: int
    hw: str
    devices: tuple[int, ...]
    handle: Any
    restarts: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Cluster:
    """A controller-side proxy for a group of workers (paper Listing 2): methods of worker_cls appear on it.

    Create it with ``await Cluster.create(...)``; every method of ``worker_cls`` decorated with
    ``register``, ``hw_mapping`` or ``register_serverless`` becomes an async method of the cluster.

    Example:
        ```python
        trainers = await Cluster.create(rm, MyActorTrain, role="train", hw="H800", num_workers=4)
        grads = await trainers.compute_gradients(batch)          # execute_all: one result per worker
        gens = await Cluster.create(rm, HeteroActorGen, role="rollout", num_workers=8)
        out = await gens.generate(ids, tag_name="FrozenLake")   # routed to an H800 worker
        ```
    """

    def __init__(self, manager: ResourceManager, worker_cls: type, name: str, role: str, runtime: WorkerRuntime,
                 timeout: float, call_timeout: float = 300.0) -> None:
        # use Cluster.create: construction alone spawns nothing
        self._manager = manager
        self._worker_cls = worker_cls
        self._name = name
        self._role = role
        self._runtime = runtime
        self._timeout = timeout
        self._call_timeout = call_timeout
        self._method_timeouts: dict[str, float] = {}
        self._members: dict[int, _Member] = {}
        self._world_size = 0
        self._round_robin: dict[str, int] = {}
        self._service_health: dict[str, bool | None] = {}
        self._serverless_methods: dict[str, str] = {}  # method -> service name

    @classmethod
    async def create(cls, manager: ResourceManager, worker_cls: type[Worker], *, role: str, num_workers: int, hw: str | Mapping[str, int] | None = None, devices_per_worker: int = 1, name: str | None = None, runtime: WorkerRuntime | None = None, args: tuple = (), kwargs: Mapping[str, Any] | None = None, timeout: float = 60.0, call_timeout: float = 300.0) -> Cluster:
        """Allocate devices, spawn the workers, bind the decorated methods; all or nothing.

        Args:
            manager: the resource manager whose ledger provides the devices.
            worker_cls: a ``Worker`` subclass; its constructor takes the context, then ``args``/``kwargs``.
            role: the role the devices get (``rollout``, ``train``, ``reward``, ``env``).
            num_workers: how many workers.
            hw: one hardware type for all, ``{type: count}`` (counts sum to num_workers), or None for the
                first type with free devices, worker by worker.
            devices_per_worker: devices bound to each worker (all of one type).
            name: the owner name in the ledger (default ``<class>-<role>``).
            runtime: where workers live (default: in this process).
            args: positional constructor arguments after the context.
            kwargs: keyword constructor arguments.
            timeout: deadline for placing and starting each worker.
            call_timeout: default deadline of every call to a worker method, in seconds (a method's
                ``register(timeout=)`` and a call's ``rollart_timeout=`` override it).

        Returns:
            The started cluster.
        """
        # deps: ResourceManager.allocate, WorkerRuntime.spawn, ResourceManager.report_worker, ResourceManager.register_service
        # VAL: VAL_INT_RANGE(num_workers, min=1, max=100000, exc=ResourceError)
        check.int_range("num_workers", num_workers, min=1, max=100000, exc=ResourceError)  # generated #a1f9f7661c
        # VAL: VAL_INT_RANGE(devices_per_worker, min=1, max=1024, exc=ResourceError)
        check.int_range("devices_per_worker", devices_per_worker, min=1, max=1024, exc=ResourceError)  # generated #f16a69622b
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        # VAL: VAL_TIMEOUT(call_timeout, exc=ResourceError)
        check.timeout("call_timeout", call_timeout, exc=ResourceError)  # generated #dacb92c293
        # AST: AST_PRECONDITION(isinstance(worker_cls, type) and issubclass(worker_cls, Worker), got=worker_cls, msg="worker_cls is a Worker subclass", exc=ResourceError)
        check.precondition(isinstance(worker_cls, type) and issubclass(worker_cls, Worker), "worker_cls is a Worker subclass", got=worker_cls, exc=ResourceError)  # generated #6ea2031b72
        name = name or f"{worker_cls.__name__}-{role}"
        plan = cls._hardware_plan(hw, num_workers)
        specs = cls._dispatch_specs(worker_cls)
        for method, spec in specs.items():
            for tag, wanted in (spec.hw_affinity or {}).items():
                if wanted not in manager.catalogue:
                    raise UnknownHardwareError(f"{worker_cls.__name__}.{method}: hw_affinity[{tag!r}] must be one of "
                                               f"{list(manager.catalogue.names())}, got {wanted!r}")
            if hasattr(Cluster, method):
                raise ResourceError(f"{worker_cls.__name__}.{method}: method name clashes with Cluster.{method}; "
                                    "rename the worker method")
        if any(rec.owner == name for rec in manager.devices().values()):
            raise ResourceError(f"name {name!r} already owns devices in the ledger; choose another cluster name")
        self = cls(manager, worker_cls, name, role, runtime or LocalRuntime(), float(timeout), float(call_timeout))
        self._method_timeouts = {m: spec.call_timeout for m, spec in specs.items() if spec.call_timeout is not None}
        self._world_size = num_workers
        contexts: list[WorkerContext] = []
        try:
            for rank, wanted in enumerate(plan):
                allocation = manager.allocate(name, role, devices_per_worker, hw=wanted)
                contexts.append(WorkerContext(name, rank, num_workers, allocation.hw, allocation.devices))
            spawned = await asyncio.gather(
                *(self._runtime.spawn(worker_cls, ctx, tuple(args), dict(kwargs or {}), timeout=timeout)
                  for ctx in contexts),
                return_exceptions=True)
            failures = [s for s in spawned if isinstance(s, BaseException)]
            if failures:
                for handle in spawned:
                    if not isinstance(handle, BaseException):
                        await self._runtime.remove(handle)
                raise failures[0]
        except BaseException:
            manager.release(name)
            raise
        for ctx, handle in zip(contexts, spawned):
            self._members[ctx.rank] = _Member(ctx.rank, ctx.hw, ctx.devices, handle)
            self._report(self._members[ctx.rank], "alive")
        await self._install_serverless(specs)
        for method, spec in specs.items():
            setattr(self, method, self._proxy(method, spec))
        return self

    @staticmethod
    def _hardware_plan(hw: str | Mapping[str, int] | None, num_workers: int) -> list[str | None]:
        if hw is None or isinstance(hw, str):
            return [hw] * num_workers
        plan = [t for t, count in hw.items() for _ in range(count)]
        if len(plan) != num_workers:
            raise ResourceError(f"hw counts must sum to num_workers={num_workers}, got {dict(hw)!r} "
                                f"(sum {len(plan)})")
        return plan

    @staticmethod
    def _dispatch_specs(worker_cls: type) -> dict[str, DispatchSpec]:
        specs = {}
        for attr in dir(worker_cls):
            spec = dispatch_spec_of(getattr(worker_cls, attr, None))
            if spec is not None:
                specs[attr] = spec
        return specs

    async def _install_serverless(self, specs: Mapping[str, DispatchSpec]) -> None:
        for method, spec in specs.items():
            if spec.serverless is None:
                continue
            s = spec.serverless
            service = f"{self._name}.{method}"
            self._manager.register_service(service, redact_url(s.url), self._name)  # no secrets in the store
            self._service_health[service] = None
            self._serverless_methods[method] = service
            client = ServerlessClient(s.url, timeout=s.timeout, retries=s.retries, backoff=s.backoff, headers=s.headers)
            await asyncio.gather(*(self._call(rank, "rollart_set_attribute", (s.attribute, client), {})
                                   for rank in self.ranks))

    def _proxy(self, method: str, spec: DispatchSpec) -> Any:
        if spec.mode == ROUTE_MODE:
            affinity = dict(spec.hw_affinity or {})

            async def routed(*args: Any, tag_name: str = "default", **kwargs: Any) -> Any:
                return await self.route(method, affinity, *args, tag_name=tag_name, **kwargs)

            proxy: Any = routed
        else:
            proxy = functools.partial({"execute_all": self.execute_all, "execute_rank0": self.execute_rank0,
                                       "dp_split": self.dp_split}[spec.mode], method)
        doc = getattr(getattr(self._worker_cls, method), "__doc__", None)
        if inspect.isfunction(proxy):
            proxy.__name__, proxy.__doc__ = method, doc
        return proxy

    def _report(self, member: _Member, health: str) -> None:
        self._manager.report_worker(WorkerRecord(f"{self._name}/{member.rank}", self._name, member.rank, member.hw,
                                                 member.devices, health, member.restarts))

    # -- introspection ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The owner name of this cluster in the ledger."""
        return self._name

    @property
    def ranks(self) -> tuple[int, ...]:
        """Ranks of the workers still in the cluster (removed ones are gone)."""
        return tuple(sorted(self._members))

    def hw_of(self, rank: int) -> str:
        """The hardware type of a worker."""
        # VAL: VAL_ONE_OF(rank, choices=self._members, exc=ResourceError)
        check.one_of("rank", rank, self._members, exc=ResourceError)  # generated #5a3079490e
        return self._members[rank].hw

    # -- calls -----------------------------------------------------------------------------------
    def _split_deadline(self, method: str, kwargs: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """The deadline of one call (its rollart_timeout=, else the method's, else the cluster's) and the
        keyword arguments for the worker without it."""
        if CALL_TIMEOUT_KEYWORD not in kwargs:
            return self._method_timeouts.get(method, self._call_timeout), kwargs
        kwargs = dict(kwargs)
        rollart_timeout = kwargs.pop(CALL_TIMEOUT_KEYWORD)
        # VAL: VAL_TIMEOUT(rollart_timeout, exc=ResourceError)
        check.timeout("rollart_timeout", rollart_timeout, exc=ResourceError)  # generated #1c935261c8
        return float(rollart_timeout), kwargs

    async def _call(self, rank: int, method: str, args: tuple, kwargs: Mapping[str, Any],
                    timeout: float | None = None) -> Any:
        if timeout is None:
            timeout, kwargs = self._split_deadline(method, dict(kwargs))
        member = self._members.get(rank)
        if member is None:
            raise WorkerFailedError(self._name, rank, "removed")
        handle = member.handle
        try:
            result = await self._runtime.call(handle, method, args, kwargs, timeout=timeout)
        except CallTimeout:
            self._manager.record_event("worker_call_timeout", {"worker": f"{self._name}/{rank}", "method": method,
                                                               "timeout_s": timeout})
            raise
        except WorkerDiedError as exc:
            action = await self._handle_death(member, handle)
            raise WorkerFailedError(self._name, rank, action, exc) from exc
        except ServerlessError as exc:
            self._note_service(method, False, str(exc))
            raise
        self._note_service(method, True, None)
        return result

    def _note_service(self, method: str, healthy: bool, error: str | None) -> None:
        service = self._serverless_methods.get(method)
        if service is not None and self._service_health.get(service) is not healthy:
            self._service_health[service] = healthy
            self._manager.report_service_health(service, healthy, error)

    async def _gather(self, calls: list[Any]) -> list[Any]:
        results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def _live_ranks(self) -> tuple[int, ...]:
        ranks = self.ranks
        if not ranks:
            raise ResourceError(f"cluster {self._name!r} has no workers left")
        return ranks

    async def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Broadcast the call to every worker and gather the results in rank order."""
        # deps: Cluster._call
        timeout, kwargs = self._split_deadline(method, kwargs)
        return await self._gather([self._call(rank, method, args, kwargs, timeout) for rank in self._live_ranks()])

    async def execute_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call only the lowest live rank (the single-controller pattern for e.g. saving)."""
        # deps: Cluster._call
        timeout, kwargs = self._split_deadline(method, kwargs)
        return await self._call(self._live_ranks()[0], method, args, kwargs, timeout)

    async def dp_split(self, method: str, items: Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Split items into contiguous chunks, one per worker, and concatenate the returned lists in order."""
        # deps: Cluster._call
        # VAL: VAL_TYPE(items, (list, tuple), exc=ResourceError)
        check.of_type("items", items, (list, tuple), exc=ResourceError)  # generated #1fd590aa73
        timeout, kwargs = self._split_deadline(method, kwargs)
        ranks = self._live_ranks()
        base, extra = divmod(len(items), len(ranks))
        chunks, start = [], 0
        for i, rank in enumerate(ranks):
            size = base + (1 if i < extra else 0)
            if size:
                chunks.append((rank, list(items[start:start + size])))
            start += size
        parts = await self._gather([self._call(rank, method, (chunk, *args), kwargs, timeout)
                                    for rank, chunk in chunks])
        merged: list[Any] = []
        for (rank, _), part in zip(chunks, parts):
            if not isinstance(part, (list, tuple)):
                raise ResourceError(f"{method} on rank {rank} must return a list for dp_split, "
                                    f"got {type(part).__name__}")
            merged.extend(part)
        return merged

    async def route(self, method: str, hw_affinity: Mapping[str, str], *args: Any, tag_name: str = "default", **kwargs: Any) -> Any:
        """Send one call to a worker of the preferred hardware for tag_name (round robin), else the default's.

        If no live worker has the preferred type, the ``"default"`` entry's type is used, then any worker.
        ``tag_name`` is passed on to the worker method when its signature accepts it.
        """
        # deps: Cluster._call
        timeout, kwargs = self._split_deadline(method, kwargs)
        ranks = self._live_ranks()
        preferred = hw_affinity.get(tag_name, hw_affinity["default"])
        candidates = ([r for r in ranks if self._members[r].hw == preferred]
                      or [r for r in ranks if self._members[r].hw == hw_affinity["default"]] or list(ranks))
        turn = self._round_robin.get(preferred, 0)
        self._round_robin[preferred] = turn + 1
        if self._accepts(method, "tag_name"):
            kwargs = {**kwargs, "tag_name": tag_name}
        return await self._call(candidates[turn % len(candidates)], method, args, kwargs, timeout)

    def _accepts(self, method: str, param: str) -> bool:
        try:
            params = inspect.signature(getattr(self._worker_cls, method)).parameters
        except (TypeError, ValueError):
            return True
        return param in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    # -- health ----------------------------------------------------------------------------------
    async def check_health(self, timeout: float = 10.0) -> dict[int, str]:
        """Ping every worker; repair the dead ones (restart once, then remove); returns {rank: action}.

        A ping not answered within ``timeout`` is ``unresponsive``: reported, not repaired (a worker busy in
        a long sync method cannot answer either; the caller decides).
        """
        # deps: Cluster._handle_death
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        actions: dict[int, str] = {}

        async def probe(rank: int) -> None:
            try:
                await self._call(rank, "rollart_ping", (), {}, float(timeout))
                actions[rank] = "ok"
            except WorkerFailedError as exc:
                actions[rank] = exc.action
            except CallTimeout:
                actions[rank] = "unresponsive"

        await asyncio.gather(*(probe(rank) for rank in self.ranks))
        return dict(sorted(actions.items()))

    async def _handle_death(self, member: _Member, handle_seen: Any) -> str:
        """Restart once on the same devices, else remove and free the devices (one repair per death)."""
        async with member.lock:
            if member.rank not in self._members:
                return "removed"
            if member.handle is not handle_seen:  # another caller already repaired this death
                return "restarted"
            self._report(member, "dead")
            if member.restarts == 0:
                try:
                    member.handle = await self._runtime.restart(handle_seen, timeout=self._timeout)
                    member.restarts += 1
                    self._report(member, "alive")
                    return "restarted"
                except Exception as exc:  # the restart failed: remove instead
                    log.error("worker %s/%d: restart failed, removing it", self._name, member.rank, exc_info=exc)
                    self._manager.record_event("worker_restart_failed", {"worker": f"{self._name}/{member.rank}",
                                                                         "error": f"{type(exc).__name__}: {exc}"})
            try:
                await self._runtime.remove(member.handle)
            except Exception as exc:
                log.error("worker %s/%d: remove failed", self._name, member.rank, exc_info=exc)
                self._manager.record_event("worker_remove_failed", {"worker": f"{self._name}/{member.rank}",
                                                                    "error": f"{type(exc).__name__}: {exc}"})
            del self._members[member.rank]
            try:
                self._manager.release(self._name, member.devices)
            except ResourceError as exc:  # e.g. a device in an open transition: freed at shutdown instead
                self._manager.record_event("release_deferred", {"worker": f"{self._name}/{member.rank}",
                                                                "devices": list(member.devices), "error": str(exc)})
            self._report(member, "removed")
            return "removed"

    async def shutdown(self) -> None:
        """Stop the workers and release the devices."""
        # deps: WorkerRuntime.remove, ResourceManager.release
        members = list(self._members.values())
        self._members.clear()
        await asyncio.gather(*(self._runtime.remove(m.handle) for m in members), return_exceptions=True)
        for member in members:
            self._report(member, "removed")
        self._manager.release(self._name)
