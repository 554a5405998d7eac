"""Test helpers for rollart.resource and the packages that plug into it (no pytest dependency).

Why shipped in the package: the proxy and the scheduler test their ``TransitionHook``s and their
crash recovery against the real manager; they need the same recording hook and crash injection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollart.resource.ledger import Transition, TransitionVetoed
from rollart.resource.store import Event, EventDraft, MetadataStore, ServiceRecord, StoreSnapshot, WorkerRecord

__all__ = ["CrashingStore", "RecordingHook", "SimulatedCrash"]


class SimulatedCrash(BaseException):  # noqa: N818 - it models a process death, not an error
    """The controller process "dies": a BaseException so no ``except Exception`` in the code handles it."""


class RecordingHook:
    """A TransitionHook that records every call, and can veto or crash in a chosen phase.

    Args:
        veto: a reason to veto every prepare with (None: agree).
        crash_in: ``"prepare"`` or ``"commit"`` to raise SimulatedCrash there (once).
    """

    def __init__(self, veto: str | None = None, crash_in: str | None = None) -> None:
        self.calls: list[tuple[str, str, str]] = []  # (method, transition id, phase seen)
        self.veto = veto
        self.crash_in = crash_in

    async def prepare(self, transition: Transition) -> None:
        self.calls.append(("prepare", transition.id, transition.phase))
        if self.crash_in == "prepare":
            self.crash_in = None
            raise SimulatedCrash("crash in prepare")
        if self.veto is not None:
            raise TransitionVetoed(self.veto)

    async def commit(self, transition: Transition) -> None:
        self.calls.append(("commit", transition.id, transition.phase))
        if self.crash_in == "commit":
            self.crash_in = None
            raise SimulatedCrash("crash in commit")

    async def abort(self, transition: Transition) -> None:
        self.calls.append(("abort", transition.id, transition.phase))

    def methods(self) -> list[str]:
        """The methods called, in order."""
        return [c[0] for c in self.calls]


_MUTATING = frozenset({"init_devices", "claim", "release", "begin_transition", "set_phase", "commit_transition",
                       "put_worker", "put_service", "append_event"})


class CrashingStore:
    """A MetadataStore wrapper that "crashes the controller" just before its N-th mutating call.

    Each mutating call of the wrapped store is one SQLite transaction, so crashing between them
    visits every state a real crash can leave on disk.
    """

    def __init__(self, inner: MetadataStore, crash_before: int | None = None) -> None:
        self.inner = inner
        self.crash_before = crash_before
        self.mutations = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in _MUTATING:
            return attr

        def mutating(*args: Any, **kwargs: Any) -> Any:
            self.mutations += 1
            if self.crash_before is not None and self.mutations >= self.crash_before:
                raise SimulatedCrash(f"crash before mutation #{self.mutations} ({name})")
            return attr(*args, **kwargs)

        return mutating

    # explicit protocol members (so isinstance(..., MetadataStore) holds); they route through __getattr__
    def schema_version(self) -> int:
        return self.inner.schema_version()

    def devices(self) -> dict:
        return self.inner.devices()

    def open_transition(self) -> Transition | None:
        return self.inner.open_transition()

    def transitions(self) -> list[Transition]:
        return self.inner.transitions()

    def workers(self, owner: str | None = None) -> list[WorkerRecord]:
        return self.inner.workers(owner)

    def services(self) -> list[ServiceRecord]:
        return self.inner.services()

    def events(self, since: int = 0) -> list[Event]:
        return self.inner.events(since)

    def snapshot(self) -> StoreSnapshot:
        return self.inner.snapshot()

    def close(self) -> None:
        self.inner.close()

    def last_event_seq(self) -> int:
        return self.inner.last_event_seq()

    def init_devices(self, devices: Sequence, *, event: EventDraft | None = None) -> None:
        return self.__getattr__("init_devices")(devices, event=event)

    def claim(self, owner: str, role: str, devices: Sequence[int], *, event: EventDraft | None = None) -> None:
        return self.__getattr__("claim")(owner, role, devices, event=event)

    def release(self, owner: str, devices: Sequence[int] | None = None, *,
                event: EventDraft | None = None) -> tuple[int, ...]:
        return self.__getattr__("release")(owner, devices, event=event)

    def begin_transition(self, transition: Transition, *, event: EventDraft | None = None) -> None:
        return self.__getattr__("begin_transition")(transition, event=event)

    def set_phase(self, transition_id: str, phase: str, reason: str | None = None, *,
                  event: EventDraft | None = None) -> Transition:
        return self.__getattr__("set_phase")(transition_id, phase, reason, event=event)

    def commit_transition(self, transition_id: str, *, event: EventDraft | None = None) -> Transition:
        return self.__getattr__("commit_transition")(transition_id, event=event)

    def put_worker(self, record: WorkerRecord, *, event: EventDraft | None = None) -> None:
        return self.__getattr__("put_worker")(record, event=event)

    def put_service(self, record: ServiceRecord, *, event: EventDraft | None = None) -> None:
        return self.__getattr__("put_service")(record, event=event)

    def append_event(self, kind: str, payload: Mapping[str, Any], at: float) -> Event:
        return self.__getattr__("append_event")(kind, payload, at)
