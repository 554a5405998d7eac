"""The resource manager: the device-role ledger in a metadata store, and safe moves between roles.

Why the store is the state (design D2): every read goes to the store, so a restarted manager on the
same file is, by construction, in the exact state the crashed one committed. ``shrink``/``expand``
are two-phase (design D3): plan (persisted) -> hooks prepare -> roles and phase committed in one SQL
transaction -> hooks commit. ``recover`` resolves a transition a crash left open: ``planned`` rolls
back, ``prepared`` and ``committed`` roll forward, ``aborting`` finishes the abort. The outcome is
persisted before any hook hears it, so a crash while hooks are being told is finished by ``recover``
(every hook hears it again: hooks are idempotent). A cancelled shrink/expand aborts (during prepare) or
completes (after the commit) in a shielded task before the ``CancelledError`` reaches the caller.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart import checks as check
from rollart.resource.errors import ResourceError, UnknownHardwareError
from rollart.resource.hardware import HardwareCatalogue
from rollart.resource.hooks import call_hook
from rollart.resource.lease import controller_identity
from rollart.resource.ledger import (
    TRANSITION_ROLES,
    DeviceRecord,
    Transition,
    TransitionHook,
    TransitionVetoed,
    validate_transition,
)
from rollart.resource.store import Event, EventDraft, MetadataStore, ServiceRecord, SqliteMetadataStore, WorkerRecord

__all__ = ["Allocation", "ResourceManager", "validate_pool_spec"]

logger = logging.getLogger(__name__)

NOTIFY_GRACE = 1.0
"""Seconds a hook always gets to hear commit/abort, even when the transition's deadline has passed."""


def validate_pool_spec(pool: Mapping[str, Iterable[int]], catalogue: HardwareCatalogue) -> dict[str, tuple[int, ...]]:
    """All pool checks in one function (R2): known types, non-negative int ids, unique, disjoint, non-empty.

    Returns:
        ``{hw type: sorted device ids}``.

    Raises:
        UnknownHardwareError: a type the catalogue does not know.
        ResourceError: bad ids; the message starts with ``pool[<type>]``.
    """
    # deps: HardwareCatalogue.get
    # VAL: VAL_NON_EMPTY(pool, exc=ResourceError)
    check.non_empty("pool", pool, exc=ResourceError)  # generated #ad3b60a10a
    # VAL: VAL_SUBSET(pool, of=catalogue, exc=UnknownHardwareError)
    check.subset("pool", pool, of=catalogue, exc=UnknownHardwareError)  # generated #5895aa8a4e
    seen: list[int] = []
    result: dict[str, tuple[int, ...]] = {}
    for hw, raw in pool.items():
        ids = list(raw)
        try:
            # VAL: VAL_NON_EMPTY(ids, exc=ResourceError)
            check.non_empty("ids", ids, exc=ResourceError)  # generated #8b570db4b8
            # VAL: VAL_INT_RANGE(ids, min=0, max=2**31 - 1, each=True, exc=ResourceError)
            check.int_range_each("ids", ids, min=0, max=2**31 - 1, exc=ResourceError)  # generated #cb46d04703
            # VAL: VAL_UNIQUE(ids, exc=ResourceError)
            check.unique("ids", ids, exc=ResourceError)  # generated #15bef9b228
            # VAL: VAL_DISJOINT(ids, other=seen, exc=ResourceError)
            check.disjoint("ids", ids, "seen", seen, exc=ResourceError)  # generated #94d80aad9a
            pass
        except ResourceError as exc:
            raise ResourceError(f"pool[{hw!r}]: {exc}") from None
        seen += ids
        result[hw] = tuple(sorted(ids))
    return result


@dataclass(frozen=True)
class Allocation:
    """What allocate bound: the owner, the role and the devices (all of one hardware type).

    Attributes:
        owner: who holds the devices (a cluster name).
        role: the role they were given.
        hw: their hardware type.
        devices: their ledger ids, sorted.
    """

    owner: str
    role: str
    hw: str
    devices: tuple[int, ...]


class ResourceManager:
    """Owns the device-role ledger in a metadata store and moves devices between roles safely.

    Example:
        ```python
        rm = ResourceManager({"H800": range(0, 8), "H20": range(8, 32)}, store="run/meta.db")
        rm.allocate("gen", "rollout", 8, hw="H20")
        await rm.shrink("rollout", "train", [8, 9])
        await rm.expand("train", "rollout", [8, 9])
        ```
    """

    def __init__(self, pool: Mapping[str, Iterable[int]] | None = None, store: str | Path | MetadataStore = ":memory:", *, catalogue: HardwareCatalogue | None = None, clock: Callable[[], float] | None = None, holder: str | None = None) -> None:
        """Open the store and become its one controller (R13); a new store gets the pool (all free), a reopened one
        must match it (or pool=None).

        Args:
            holder: this controller's identity in the lock file and in errors (default: pid, host, a token).

        Raises:
            ControllerLockHeld: another controller holds the store.
        """
        # deps: validate_pool_spec, SqliteMetadataStore, MetadataStore.acquire_controller, MetadataStore.init_devices
        self._catalogue = catalogue if catalogue is not None else HardwareCatalogue()
        owns_store = isinstance(store, (str, Path))
        self._store: MetadataStore = SqliteMetadataStore(store) if isinstance(store, (str, Path)) else store
        self._clock = clock
        self._hooks: list[TransitionHook] = []
        self._subscribers: list[Callable[[Event], None]] = []
        self._background: set[asyncio.Task] = set()  # shielded transition ends and abandoned hook calls
        self.holder = holder if holder is not None else controller_identity()
        try:
            self._store.acquire_controller(self.holder)
            self._published = self._store.last_event_seq()  # subscribers get events recorded from now on
            # AST: AST_PRECONDITION(pool is not None or bool(self._store.devices()), got=pool, msg="a pool spec is given or the store already holds one", exc=ResourceError)
            check.precondition(pool is not None or bool(self._store.devices()), "a pool spec is given or the store already holds one", got=pool, exc=ResourceError)  # generated #97597c3488
            stored_types = sorted({rec.hw for rec in self._store.devices().values()})
            try:
                # VAL: VAL_SUBSET(stored_types, of=self._catalogue, exc=UnknownHardwareError)
                check.subset("stored_types", stored_types, of=self._catalogue, exc=UnknownHardwareError)  # generated #d01ecbd8fe
                pass
            except UnknownHardwareError as exc:
                raise UnknownHardwareError(
                    f"store {getattr(self._store, 'path', self._store)!r}: {exc} (register a user-defined type in the "
                    "catalogue before reopening; otherwise the store is damaged)") from None
            if pool is not None:
                self._adopt_pool(validate_pool_spec(pool, self._catalogue))
        except BaseException:
            if owns_store:
                self._store.close()
            raise

    def _adopt_pool(self, spec: dict[str, tuple[int, ...]]) -> None:
        wanted = {d: hw for hw, ids in spec.items() for d in ids}
        existing = {d: rec.hw for d, rec in self._store.devices().items()}
        if not existing:
            self._store.init_devices([DeviceRecord(d, hw, "free", None) for d, hw in sorted(wanted.items())],
                                     event=self._draft("pool_created", {"pool": {hw: list(ids) for hw, ids in spec.items()}}))
            self._publish()
        elif existing != wanted:
            added = sorted(set(wanted) - set(existing))
            removed = sorted(set(existing) - set(wanted))
            retyped = sorted(d for d in set(wanted) & set(existing) if wanted[d] != existing[d])
            raise ResourceError(f"pool differs from the pool in the store: devices added {added}, removed {removed}, "
                                f"retyped {retyped}; pass pool=None to reopen the stored pool")

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:  # called outside a loop (construction in a sync script)
            return 0.0

    @property
    def store(self) -> MetadataStore:
        """The metadata store (read access for other components and tests)."""
        # deps: none
        return self._store

    @property
    def catalogue(self) -> HardwareCatalogue:
        """The hardware catalogue this manager validates against."""
        # deps: none
        return self._catalogue

    def devices(self) -> dict[int, DeviceRecord]:
        """The ledger as stored now."""
        # deps: MetadataStore.devices
        return self._store.devices()

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, owner: str, role: str, count: int, hw: str | None = None) -> Allocation:
        """Bind count free devices of one hardware type (hw, or the first type with enough free) to owner.

        An owner may allocate again (a cluster spanning types does), for a role it already holds (a rollout
        owner that lent devices to training by a shrink holds both roles and may still grow its rollout pool).
        The store rechecks that the devices are free inside the write transaction that binds them.
        """
        # deps: MetadataStore.claim, ResourceManager.record_event
        ledger = self._store.devices()
        pool_types = list(dict.fromkeys(rec.hw for rec in ledger.values()))
        held_roles = {rec.role for rec in ledger.values() if rec.owner == owner}
        # VAL: VAL_NON_EMPTY(owner, exc=ResourceError)
        check.non_empty("owner", owner, exc=ResourceError)  # generated #a733878f01
        # VAL: VAL_ONE_OF(role, choices=TRANSITION_ROLES, exc=ResourceError)
        check.one_of("role", role, TRANSITION_ROLES, exc=ResourceError)  # generated #7fbd1c5285
        # VAL: VAL_INT_RANGE(count, min=1, max=len(ledger), exc=ResourceError)
        check.int_range("count", count, min=1, max=len(ledger), exc=ResourceError)  # generated #41bb19dc1b
        # AST: AST_PRECONDITION(hw is None or hw in pool_types, got=hw, msg="hw is a type in this pool", exc=UnknownHardwareError)
        check.precondition(hw is None or hw in pool_types, "hw is a type in this pool", got=hw, exc=UnknownHardwareError)  # generated #5376c40fea
        # AST: AST_PRECONDITION(not held_roles or role in held_roles, got=held_roles, msg="an owner allocates for the role it holds", exc=ResourceError)
        check.precondition(not held_roles or role in held_roles, "an owner allocates for the role it holds", got=held_roles, exc=ResourceError)  # generated #6093dde093
        free: dict[str, list[int]] = {t: [] for t in pool_types}
        for rec in ledger.values():
            if rec.role == "free":
                free[rec.hw].append(rec.id)
        for candidate in [hw] if hw is not None else pool_types:
            if len(free[candidate]) >= count:
                chosen = tuple(free[candidate][:count])
                self._store.claim(owner, role, chosen, event=self._draft(
                    "allocated", {"owner": owner, "role": role, "hw": candidate, "devices": list(chosen)}))
                self._publish()
                return Allocation(owner, role, candidate, chosen)
        raise ResourceError(f"count: cannot allocate {count} free devices of hw={hw!r} for owner {owner!r}; "
                            f"free per type: { {t: len(ids) for t, ids in free.items()} }")

    def release(self, owner: str, devices: Sequence[int] | None = None) -> tuple[int, ...]:
        """Return an owner's devices (all or some) to the free pool and record the event."""
        # deps: MetadataStore.release, ResourceManager.record_event
        # VAL: VAL_NON_EMPTY(owner, exc=ResourceError)
        check.non_empty("owner", owner, exc=ResourceError)  # generated #a733878f01
        freed = self._store.release(owner, devices, event=self._draft("released", {"owner": owner}))
        self._publish()
        return freed

    # -- transitions -----------------------------------------------------------------------------
    def add_transition_hook(self, hook: TransitionHook) -> None:
        """Register a hook; hooks are called in registration order (abort in reverse)."""
        # deps: none
        if not isinstance(hook, TransitionHook):
            raise ResourceError(f"hook must implement TransitionHook (async prepare/commit/abort), got {hook!r}")
        self._hooks.append(hook)

    async def shrink(self, from_role: str, to_role: str, devices: Sequence[int], *, timeout: float = 60.0) -> Transition:
        """Take devices out of from_role (e.g. rollout) into to_role (e.g. train), two-phase and persisted.

        Returns:
            The transition in phase ``completed``.

        Raises:
            ResourceError: bad roles or devices (the store is unchanged).
            TransitionInFlight: another transition is open.
            TransitionVetoed: a hook refused, failed or missed the deadline (the transition is aborted).
        """
        # deps: validate_transition, MetadataStore.begin_transition, MetadataStore.set_phase, MetadataStore.commit_transition
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        return await self._run_transition("shrink", from_role, to_role, devices, timeout)

    async def expand(self, from_role: str, to_role: str, devices: Sequence[int], *, timeout: float = 60.0) -> Transition:
        """Give devices back to a pool (e.g. train -> rollout); the same two-phase protocol as shrink.

        Returns:
            The transition in phase ``completed``.
        """
        # deps: validate_transition, MetadataStore.begin_transition, MetadataStore.set_phase, MetadataStore.commit_transition
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        return await self._run_transition("expand", from_role, to_role, devices, timeout)

    async def _run_transition(self, kind: str, from_role: str, to_role: str, devices: Sequence[int],
                              timeout: float) -> Transition:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        checked = validate_transition(kind, from_role, to_role, devices, self._store.devices())
        planned = Transition(uuid.uuid4().hex[:16], kind, from_role, to_role, checked, "planned")  # type: ignore[arg-type]
        # atomic: refuses if another transition is open
        self._store.begin_transition(planned, event=self._draft("transition_planned", self._payload(planned)))
        self._publish()
        try:
            failed = await self._prepare_all(planned, deadline, timeout)
        except asyncio.CancelledError:
            # the caller gave up: the move is off; the abort is persisted first, then told (shielded)
            await self._shielded(self._abort(planned, "cancelled: the caller cancelled the transition during prepare",
                                             deadline))
            raise
        if failed is not None:
            reason, cause = failed
            await self._shielded(self._abort(planned, reason, deadline))
            if isinstance(cause, TransitionVetoed):
                raise cause
            raise TransitionVetoed(reason) from cause
        prepared = self._set_phase(planned, "prepared")
        return await self._shielded(self._commit(prepared, deadline))

    async def _prepare_all(self, planned: Transition, deadline: float,
                           timeout: float) -> tuple[str, BaseException | None] | None:
        """Every hook's prepare in order; the first veto, error, cancellation or missed deadline stops it."""
        loop = asyncio.get_running_loop()
        for hook in self._hooks:
            outcome = await call_hook(hook, "prepare", planned, deadline - loop.time(), self._background)
            if outcome.timed_out:
                reason = f"prepare exceeded timeout={timeout}s ({outcome.hook})"
                return reason, TimeoutError(reason)
            if isinstance(outcome.error, TransitionVetoed):
                return outcome.error.reason, outcome.error
            if outcome.error is not None:
                error = outcome.error
                return f"hook prepare failed: {type(error).__name__}: {error}", error
        return None

    async def _shielded(self, coro: Any) -> Any:
        """Run the rest of a transition so that the caller's cancellation cannot cut it short.

        The outcome is persisted before the hooks hear it (``committed``/``aborting``), so even if the loop
        itself goes away, ``recover`` finishes the work; shielding only makes the common case complete now.
        """
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return await asyncio.shield(task)

    async def _commit(self, prepared: Transition, deadline: float) -> Transition:
        committed = self._store.commit_transition(  # the atomic point
            prepared.id, event=self._draft("transition_committed", self._payload(prepared, "committed")))
        self._publish()
        await self._notify("commit", committed, self._hooks, deadline)
        return self._set_phase(committed, "completed")

    async def _abort(self, transition: Transition, reason: str, deadline: float) -> Transition:
        """Persist ``aborting`` (with the reason), tell every hook, then persist ``aborted``.

        A controller killed in between leaves ``aborting`` open, and ``recover`` tells every hook again.
        """
        aborting = self._set_phase(transition, "aborting", reason) if transition.phase != "aborting" else transition
        await self._notify("abort", aborting, list(reversed(self._hooks)), deadline)
        return self._set_phase(aborting, "aborted")

    async def _notify(self, method: str, transition: Transition, hooks: list[TransitionHook], deadline: float) -> None:
        """Tell every hook the outcome; a failure, a CancelledError or a missed deadline of one hook is recorded
        as a ``hook_failed`` event and neither changes the outcome nor stops the other hooks hearing it."""
        loop = asyncio.get_running_loop()
        for hook in hooks:
            # a hook always gets at least NOTIFY_GRACE seconds to hear the outcome, even past the deadline
            outcome = await call_hook(hook, method, transition, max(deadline - loop.time(), NOTIFY_GRACE),
                                      self._background)
            if outcome.ok:
                continue
            logger.warning("transition hook %s", outcome.describe())
            error = "deadline exceeded" if outcome.timed_out else f"{type(outcome.error).__name__}: {outcome.error}"
            self.record_event("hook_failed", {**self._payload(transition), "method": method,
                                              "hook": outcome.hook, "error": error})

    def _set_phase(self, transition: Transition, phase: str, reason: str | None = None) -> Transition:
        payload = self._payload(transition, phase) | ({"reason": reason} if reason is not None else {})
        moved = self._store.set_phase(transition.id, phase, reason,
                                      event=self._draft(f"transition_{phase}", payload))
        self._publish()
        return moved

    @staticmethod
    def _payload(t: Transition, phase: str | None = None) -> dict[str, Any]:
        return {"id": t.id, "kind": t.kind, "from_role": t.from_role, "to_role": t.to_role,
                "devices": list(t.devices), "phase": phase or t.phase}

    async def recover(self, *, timeout: float = 60.0) -> Transition | None:
        """After a restart, finish or roll back the open transition (D3); returns it in its final phase."""
        # deps: MetadataStore.open_transition, MetadataStore.set_phase, MetadataStore.commit_transition
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        pending = self._store.open_transition()
        if pending is None:
            return None
        deadline = asyncio.get_running_loop().time() + timeout
        self.record_event("transition_recovering", self._payload(pending))
        if pending.phase == "planned":  # some hooks may have prepared: every hook hears the abort
            result = await self._abort(pending, "recovered: rolled back (the controller stopped before prepare ended)",
                                       deadline)
        elif pending.phase == "aborting":  # the controller stopped while hooks heard the abort: all hear it again
            result = await self._abort(pending, "", deadline)
        elif pending.phase == "prepared":
            result = await self._commit(pending, deadline)
        else:  # committed: roles are applied, the hooks may not have heard
            await self._notify("commit", pending, self._hooks, deadline)
            result = self._set_phase(pending, "completed")
        # AST: AST_POSTCONDITION(not self._store.open_transition(), got=self._store.open_transition(), msg="no transition is left open", exc=ResourceError)
        check.postcondition(not self._store.open_transition(), "no transition is left open", got_lazy=lambda: self._store.open_transition(), exc=ResourceError)  # generated #fae0d184b1
        return result

    def pending_transition(self) -> Transition | None:
        """The open transition, if any (a controller checks it at start and calls recover)."""
        # deps: MetadataStore.open_transition
        return self._store.open_transition()

    # -- events ----------------------------------------------------------------------------------
    def record_event(self, kind: str, payload: Mapping[str, Any]) -> Event:
        """Persist an event and deliver it to subscribers (a failing subscriber does not stop the others)."""
        # deps: MetadataStore.append_event
        event = self._store.append_event(kind, payload, self._now())
        self._publish()
        return event

    def _draft(self, kind: str, payload: Mapping[str, Any]) -> EventDraft:
        return EventDraft(kind, payload, self._now())

    def _publish(self) -> None:
        """Deliver the events recorded since the last delivery (read back from the store, in seq order)."""
        if not self._subscribers:
            self._published = self._store.last_event_seq()
            return
        for event in self._store.events(since=self._published):
            self._published = event.seq
            for callback in list(self._subscribers):
                try:
                    callback(event)
                except Exception:
                    logger.exception("event subscriber %r failed on %s", callback, event.kind)

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Get every event recorded from now on; returns the unsubscribe function."""
        # deps: none
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    # -- workers and services --------------------------------------------------------------------
    def report_worker(self, record: WorkerRecord) -> None:
        """Persist a worker's placement/health and record a worker_<health> event."""
        # deps: MetadataStore.put_worker, ResourceManager.record_event
        self._store.put_worker(record, event=self._draft(
            f"worker_{record.health}", {"worker": record.id, "owner": record.owner, "rank": record.rank,
                                        "hw": record.hw, "devices": list(record.devices), "restarts": record.restarts}))
        self._publish()

    def register_service(self, name: str, url: str, owner: str) -> ServiceRecord:
        """Record a serverless endpoint (health unknown until reported)."""
        # deps: MetadataStore.put_service, ResourceManager.record_event
        # VAL: VAL_NON_EMPTY(name, exc=ResourceError)
        check.non_empty("name", name, exc=ResourceError)  # generated #c14ca09b08
        # AST: AST_PRECONDITION(url.startswith(("http://", "https://")), got=url, msg="url is http(s)", exc=ResourceError)
        check.precondition(url.startswith(("http://", "https://")), "url is http(s)", got=url, exc=ResourceError)  # generated #24e60dbe7f
        record = ServiceRecord(name, url, owner, "unknown", None)
        self._store.put_service(record, event=self._draft("service_registered",
                                                          {"name": name, "url": url, "owner": owner}))
        self._publish()
        return record

    def report_service_health(self, name: str, healthy: bool, error: str | None = None) -> ServiceRecord:
        """Update a service's health after a call succeeded or failed."""
        # deps: MetadataStore.put_service
        services = {s.name: s for s in self._store.services()}
        known = list(services)
        # VAL: VAL_ONE_OF(name, choices=known, exc=ResourceError)
        check.one_of("name", name, known, exc=ResourceError)  # generated #5747fa6ba4
        old = services[name]
        record = ServiceRecord(name, old.url, old.owner, "healthy" if healthy else "unhealthy",
                               None if healthy else error)
        changed = old.health != record.health
        self._store.put_service(record, event=self._draft("service_health", {
            "name": name, "health": record.health, "error": error}) if changed else None)
        self._publish()
        return record

    def close(self) -> None:
        """Close the store."""
        # deps: MetadataStore.close
        self._store.close()
