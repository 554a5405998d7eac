"""The device-role ledger's public types: roles, transitions and the hook protocol.

Why here and not in the manager: the proxy (which offloads weights and migrates requests while a
shrink is prepared) and the scheduler's time-sharing controller implement ``TransitionHook`` and
read ``Transition``; they need these types without the store or Ray behind them.

A transition is two-phase (design D3): ``planned -> prepared -> committed -> completed``, or
``planned | prepared -> aborting -> aborted``. The store applies the roles and the ``committed`` phase
in one SQL transaction, so a crash leaves the ledger before or after the move, never in between.
``committed`` and ``aborting`` are persisted BEFORE the hooks hear the outcome and left only after
every hook heard it, so a controller killed while hooks are being told is finished by ``recover``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from rollart import checks as check
from rollart.resource.errors import ResourceError

__all__ = [
    "OPEN_PHASES",
    "PHASES",
    "PHASE_MOVES",
    "ROLES",
    "TRANSITION_ROLES",
    "DeviceRecord",
    "Transition",
    "TransitionHook",
    "TransitionVetoed",
    "validate_transition",
]

ROLES: tuple[str, ...] = ("rollout", "train", "reward", "env", "free")
"""Every device has exactly one of these roles at any time."""

TRANSITION_ROLES: tuple[str, ...] = ("rollout", "train", "reward", "env")
"""Roles a shrink/expand moves between; devices enter and leave ``free`` only by allocate/release."""

PHASES: tuple[str, ...] = ("planned", "prepared", "committed", "completed", "aborting", "aborted")
OPEN_PHASES: tuple[str, ...] = ("planned", "prepared", "committed", "aborting")
PHASE_MOVES: Mapping[str, tuple[str, ...]] = {
    "planned": ("prepared", "aborting"),
    "prepared": ("committed", "aborting"),
    "committed": ("completed",),
    "aborting": ("aborted",),
    "completed": (),
    "aborted": (),
}


class TransitionVetoed(RuntimeError):
    """Raised by a hook's prepare to refuse a transition; the manager aborts and re-raises it."""

    def __init__(self, reason: str) -> None:
        """Keep the reason: it is persisted on the aborted transition and shown to the caller."""
        # deps: none
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Transition:
    """One shrink or expand as the hooks and the store see it (immutable; a new phase is a new value).

    Attributes:
        id: unique id of the transition (also its key in the store).
        kind: ``"shrink"`` (devices leave a pool, e.g. rollout -> train) or ``"expand"`` (they return).
        from_role: the role the devices have before the move.
        to_role: the role they have after it.
        devices: the ledger ids of the devices moved, sorted.
        phase: one of ``PHASES``.
    """

    id: str
    kind: Literal["shrink", "expand"]
    from_role: str
    to_role: str
    devices: tuple[int, ...]
    phase: str


@runtime_checkable
class TransitionHook(Protocol):
    """How another package acts inside a transition without this package importing it.

    Registered with `ResourceManager.add_transition_hook`; the manager calls the hooks one after
    another, in registration order (abort in reverse), from `shrink`, `expand` and `recover`. All
    three methods share the transition's deadline (the `timeout=` of that call); a call past it is
    cancelled and counted as missed. They run on the manager's event loop: never block it.
    """

    async def prepare(self, transition: Transition) -> None:
        """Do the work the move needs (offload, migrate); raise TransitionVetoed(reason) to refuse.

        Called once per transition in phase `planned`, before any role changes, with what is left
        of the deadline. Raising `TransitionVetoed`, any other exception, raising `CancelledError`
        or missing the deadline stops the remaining hooks' `prepare` and aborts the transition (the
        caller gets `TransitionVetoed` with the reason); the store's roles stay as they were.
        """
        ...

    async def commit(self, transition: Transition) -> None:
        """The roles have changed; must be idempotent (recovery may call it again).

        Called after the store applied the roles and persisted `committed` (the atomic point), on
        every hook, with the rest of the deadline (at least `NOTIFY_GRACE` seconds). The outcome is
        final: an exception or a missed deadline is recorded as a `hook_failed` event and changes
        nothing, the next hooks still hear it. If the controller stopped before every hook heard
        it, `recover` calls it again, so a second call with the same transition must do no harm.
        """
        ...

    async def abort(self, transition: Transition) -> None:
        """The move is off; undo prepare's work; must be idempotent.

        Called on every hook (in reverse order) once `aborting` is persisted: after a veto, a failed
        or late `prepare` or a cancelled caller, and from `recover` for a transition left `planned`
        or `aborting`. A hook may hear it without its own `prepare` having run (an earlier hook
        refused) or having finished, and more than once. As for `commit`, an exception or a missed
        deadline is recorded as `hook_failed` and does not change the outcome.
        """
        ...


@dataclass(frozen=True)
class DeviceRecord:
    """One device's row in the ledger.

    Attributes:
        id: the ledger id (the manager's name for one capacity unit, e.g. one GPU).
        hw: the hardware type name.
        role: one of ``ROLES``.
        owner: the owner (a cluster name) holding the device, ``None`` when free.
    """

    id: int
    hw: str
    role: str
    owner: str | None


def validate_transition(kind: str, from_role: str, to_role: str, devices: Sequence[int], ledger: Mapping[int, DeviceRecord]) -> tuple[int, ...]:
    """All the checks of a shrink/expand in one place, so the store revalidates with the same code.

    Returns:
        The devices as a sorted tuple.

    Raises:
        ResourceError: naming the offending field and value, and what is allowed.
    """
    # deps: none
    # VAL: VAL_ONE_OF(kind, choices=("shrink", "expand"), exc=ResourceError)
    check.one_of("kind", kind, ("shrink", "expand"), exc=ResourceError)  # generated #ce6ad99c41
    # VAL: VAL_ONE_OF(from_role, choices=TRANSITION_ROLES, exc=ResourceError)
    check.one_of("from_role", from_role, TRANSITION_ROLES, exc=ResourceError)  # generated #c92ff01ad2
    # VAL: VAL_ONE_OF(to_role, choices=TRANSITION_ROLES, exc=ResourceError)
    check.one_of("to_role", to_role, TRANSITION_ROLES, exc=ResourceError)  # generated #b2b3a75a68
    # AST: AST_PRECONDITION(from_role != to_role, got=to_role, msg="to_role differs from from_role", exc=ResourceError)
    check.precondition(from_role != to_role, "to_role differs from from_role", got=to_role, exc=ResourceError)  # generated #3c2c01a305
    devices = list(devices)
    # VAL: VAL_NON_EMPTY(devices, exc=ResourceError)
    check.non_empty("devices", devices, exc=ResourceError)  # generated #dee40652f9
    # VAL: VAL_UNIQUE(devices, exc=ResourceError)
    check.unique("devices", devices, exc=ResourceError)  # generated #f8e273233a
    # VAL: VAL_SUBSET(devices, of=ledger, exc=ResourceError)
    check.subset("devices", devices, of=ledger, exc=ResourceError)  # generated #a14586f71b
    owned = sorted(d for d, rec in ledger.items() if rec.role == from_role)
    try:
        # VAL: VAL_SUBSET(devices, of=owned, exc=ResourceError)
        check.subset("devices", devices, of=owned, exc=ResourceError)  # generated #e72e19808a
    except ResourceError as exc:
        raise ResourceError(f"{exc} (those devices are not held by from_role={from_role!r})") from None
    # AST: AST_PRECONDITION(kind != "shrink" or len(owned) > len(devices), got=owned, msg="a shrink leaves its source role at least one device", exc=ResourceError)
    check.precondition(kind != "shrink" or len(owned) > len(devices), "a shrink leaves its source role at least one device", got=owned, exc=ResourceError)  # generated #45dea3bb68
    return tuple(sorted(devices))
