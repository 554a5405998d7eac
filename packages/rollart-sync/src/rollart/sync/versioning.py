"""Version bookkeeping: versions only move forward, and a channel keeps only the last K of them."""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal, Union

from rollart import checks as check
from rollart.sync.bucket import PackedWeights
from rollart.sync.errors import StaleVersionError, SyncValidationError

LATEST: Literal["latest"] = "latest"
VersionSpec = Union[int, Literal["latest"]]
"""A version number, or "latest" for the newest one the channel can deliver."""

MAX_KEEP_LAST = 1024


class VersionLedger:
    """The version one party (a publisher, or one inference worker) holds; it only moves forward.

    Why a class of its own: the "never go backwards" invariant lives in exactly one place.
    """

    def __init__(self, current: int | None = None) -> None:
        self._current = current

    @property
    def current(self) -> int | None:
        """The version held now (None before the first one)."""
        return self._current

    def is_newer(self, version: int) -> bool:
        """True when `version` would move this ledger forward (the receiver should apply it)."""
        return self._current is None or version > self._current

    def advance(self, version: int) -> None:
        """Record that `version` is now held; raises StaleVersionError if it is not strictly newer."""
        # VAL: VAL_VERSION_MONOTONIC(version, self._current, exc=StaleVersionError)
        check.version_monotonic("version", version, self._current, exc=StaleVersionError)  # generated #4b26360f45
        self._current = version


class RetainedVersions:
    """The last `keep_last` packed versions, oldest first: what `fetch(version=v)` can still serve."""

    def __init__(self, keep_last: int) -> None:
        # VAL: VAL_INT_RANGE(keep_last, min=1, max=MAX_KEEP_LAST, exc=SyncValidationError)
        check.int_range("keep_last", keep_last, min=1, max=MAX_KEEP_LAST, exc=SyncValidationError)  # generated #e87345e87b
        self._keep_last = keep_last
        self._packed: OrderedDict[int, PackedWeights] = OrderedDict()

    @property
    def versions(self) -> tuple[int, ...]:
        """Retained versions, oldest first."""
        return tuple(self._packed)

    @property
    def latest(self) -> int | None:
        """The newest retained version (None when empty)."""
        return next(reversed(self._packed)) if self._packed else None

    def add(self, packed: PackedWeights) -> list[int]:
        """Keep a new, strictly newer version; return the versions evicted to stay within `keep_last`."""
        # VAL: VAL_VERSION_MONOTONIC(packed.manifest.version, self.latest, exc=StaleVersionError)
        check.version_monotonic("packed.manifest.version", packed.manifest.version, self.latest, exc=StaleVersionError)  # generated #780c31bf3b
        self._packed[packed.manifest.version] = packed
        evicted = []
        while len(self._packed) > self._keep_last:
            old, _ = self._packed.popitem(last=False)
            evicted.append(old)
        return evicted

    def get(self, version: int) -> PackedWeights | None:
        """The packed weights of `version`, or None if never added or already evicted."""
        return self._packed.get(version)
