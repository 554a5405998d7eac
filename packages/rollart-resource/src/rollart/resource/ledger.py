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
    """How another package acts inside a transition without this package importing it."""

    async def prepare(self, transition: Transition) -> None:
        """Do the work the move needs (offload, migrate); raise TransitionVetoed(reason) to refuse."""
        ...

    async def commit(self, transition: Transition) -> None:
        """The roles have changed; must be idempotent (recovery may call it again)."""
        ...

    async def abort(self, transition: Transition) -> None:
        """The move is off; undo prepare's work; must be idempotent."""
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
    # >>> generated VAL_ONE_OF #5d40d279cd (edit the annotation, not this block)
    if kind not in ('shrink', 'expand'):
        raise ResourceError(f"kind must be one of {sorted(('shrink', 'expand'), key=repr)!r}, got {kind!r}")
    # <<< generated
    # VAL: VAL_ONE_OF(from_role, choices=TRANSITION_ROLES, exc=ResourceError)
    # >>> generated VAL_ONE_OF #0173521034 (edit the annotation, not this block)
    if from_role not in TRANSITION_ROLES:
        raise ResourceError(f"from_role must be one of {sorted(TRANSITION_ROLES, key=repr)!r}, got {from_role!r}")
    # <<< generated
    # VAL: VAL_ONE_OF(to_role, choices=TRANSITION_ROLES, exc=ResourceError)
    # >>> generated VAL_ONE_OF #7c9f43e51b (edit the annotation, not this block)
    if to_role not in TRANSITION_ROLES:
        raise ResourceError(f"to_role must be one of {sorted(TRANSITION_ROLES, key=repr)!r}, got {to_role!r}")
    # <<< generated
    # AST: AST_PRECONDITION(from_role != to_role, got=to_role, msg="to_role differs from from_role", exc=ResourceError)
    # >>> generated AST_PRECONDITION #9cdc8e38f7 (edit the annotation, not this block)
    if not (from_role != to_role):
        raise ResourceError(f"Pre-condition: to_role differs from from_role, got {to_role!r}")
    # <<< generated
    devices = list(devices)
    # VAL: VAL_NON_EMPTY(devices, exc=ResourceError)
    # >>> generated VAL_NON_EMPTY #5d875ad592 (edit the annotation, not this block)
    if len(devices) == 0:
        raise ResourceError(f"devices must not be empty, got {devices!r}")
    # <<< generated
    # VAL: VAL_UNIQUE(devices, exc=ResourceError)
    # >>> generated VAL_UNIQUE #255f333461 (edit the annotation, not this block)
    _val_seen: set = set()
    _val_dups = [_val_item for _val_item in devices if _val_item in _val_seen or _val_seen.add(_val_item)]
    if _val_dups:
        raise ResourceError(f"devices must have unique elements, duplicates {_val_dups!r} in {devices!r}")
    # <<< generated
    # VAL: VAL_SUBSET(devices, of=ledger, exc=ResourceError)
    # >>> generated VAL_SUBSET #f6e7d12088 (edit the annotation, not this block)
    _val_extra = [_val_item for _val_item in devices if _val_item not in ledger]
    if _val_extra:
        raise ResourceError(f"devices must be a subset of {sorted(ledger, key=repr)!r}; not allowed: {_val_extra!r}")
    # <<< generated
    owned = sorted(d for d, rec in ledger.items() if rec.role == from_role)
    try:
        # VAL: VAL_SUBSET(devices, of=owned, exc=ResourceError)
        # >>> generated VAL_SUBSET #b6f4c771f3 (edit the annotation, not this block)
        _val_extra = [_val_item for _val_item in devices if _val_item not in owned]
        if _val_extra:
            raise ResourceError(f"devices must be a subset of {sorted(owned, key=repr)!r}; not allowed: {_val_extra!r}")
        # <<< generated
    except ResourceError as exc:
        raise ResourceError(f"{exc} (those devices are not held by from_role={from_role!r})") from None
    # AST: AST_PRECONDITION(kind != "shrink" or len(owned) > len(devices), got=owned, msg="a shrink leaves its source role at least one device", exc=ResourceError)
    # >>> generated AST_PRECONDITION #4abe4df08a (edit the annotation, not this block)
    if not (kind != 'shrink' or len(owned) > len(devices)):
        raise ResourceError(f"Pre-condition: a shrink leaves its source role at least one device, got {owned!r}")
    # <<< generated
    return tuple(sorted(devices))
