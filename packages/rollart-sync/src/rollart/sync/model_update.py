"""ModelUpdateGroup: the one object the pipeline calls for `model_update`.

The trainer side publishes; the inference side fetches one verified version and hands it to every
local inference worker through the `WeightLoader` protocol (rollart-proxy's engines implement it;
this package never imports rollart-proxy).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rollart import checks as check
from rollart.sync.bucket import NamedTensors
from rollart.sync.channel import DEFAULT_TIMEOUT_S, PublishHandle, WeightChannel, WeightSnapshot
from rollart.sync.errors import StaleVersionError, SyncError, SyncTimeoutError, SyncValidationError
from rollart.sync.versioning import LATEST, VersionLedger, VersionSpec

if TYPE_CHECKING:
    import torch  # annotations only: importing this module must not import torch (D45)

log = logging.getLogger(__name__)


@runtime_checkable
class WeightLoader(Protocol):
    """What an inference engine or worker offers to receive weights (implemented in rollart-proxy)."""

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load `weights` (read-only views; copy what you keep) and serve `version` from now on.

        Called by `ModelUpdateGroup.update` once per fetched version, on every local worker that
        holds an older one, all at once and bounded by the update's deadline (cancelled past it).
        `weights` are views into the channel's receive buffers, shared by every loader; they stay
        unchanged until the next version is loaded into every worker (the group holds the snapshot
        until then, D44), so a loader may serve straight from them (zero copy) or keep them for a
        worker that comes back later, but must drop them when the next version arrives and never
        modify them. Return only when `version` is served; after an exception
        (or the deadline) the group still counts the worker at its old version (the next update
        loads it again) and the update fails with `SyncError` (`SyncTimeoutError`).
        """
        ...


@dataclass(frozen=True)
class UpdateReport:
    """What one update did: the version, which workers loaded it, which already held it or newer."""

    version: int
    applied: tuple[int, ...]
    skipped: tuple[int, ...]
    attempts: int


class ModelUpdateGroup:
    """Publish from the trainer; fetch once and apply to each local inference worker, versions never backwards.

    Why one fetch for many workers: one batched transfer per update per node, never one per worker or
    per parameter (a peer saw >120 s syncs from per-parameter RPCs for a 0.5 s transfer).
    """

    def __init__(self, channel: WeightChannel, loaders: Sequence[WeightLoader] = (), timeout: float = DEFAULT_TIMEOUT_S) -> None:
        # VAL: VAL_TIMEOUT(timeout, exc=SyncValidationError)
        check.timeout("timeout", timeout, exc=SyncValidationError)  # generated #fcfdcac0bb
        self._channel = channel
        self._loaders = list(loaders)
        self._timeout = timeout
        self._published = VersionLedger()
        self._held = [VersionLedger() for _ in self._loaders]
        self._apply_lock = asyncio.Lock()
        self._held_snapshot: WeightSnapshot | None = None  # the last loaded version: loaders may keep its views (D44)

    @property
    def channel(self) -> WeightChannel:
        """The channel this group moves weights through."""
        return self._channel

    @property
    def published_version(self) -> int | None:
        """The last version this group published (None before the first)."""
        return self._published.current

    def _all_hold(self, version: int) -> bool:
        return all(ledger.current is not None and ledger.current >= version for ledger in self._held)

    def worker_versions(self) -> tuple[int | None, ...]:
        """The version each local worker holds, in loader order."""
        return tuple(ledger.current for ledger in self._held)

    def publish(self, named_tensors: NamedTensors, version: int) -> PublishHandle:
        """Publish `version` (strictly newer than the last) and return at once with the channel's handle."""
        # VAL: VAL_VERSION_MONOTONIC(version, self._published.current, exc=StaleVersionError)
        check.version_monotonic("version", version, self._published.current, exc=StaleVersionError)  # generated #6e0d0cfa45
        handle = self._channel.publish(named_tensors, version)
        self._published.advance(version)
        return handle

    async def update(self, version: VersionSpec = LATEST, timeout: float | None = None) -> UpdateReport:
        """Fetch one verified version and load it into every worker that holds an older one.

        Workers already at that version or newer are skipped, so versions never go backwards even
        when updates race; the deadline bounds the fetch and the loads together.
        """
        limit = self._timeout if timeout is None else timeout
        # VAL: VAL_TIMEOUT(limit, exc=SyncValidationError)
        check.timeout("limit", limit, exc=SyncValidationError)  # generated #fa7df66203
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        snapshot = await self._channel.fetch(version, timeout=limit)
        async with self._apply_lock:
            targets = [i for i, ledger in enumerate(self._held) if ledger.is_newer(snapshot.version)]
            skipped = tuple(i for i in range(len(self._held)) if i not in targets)
            remaining = deadline - loop.time()
            if targets and remaining <= 0:
                raise SyncTimeoutError(f"no time left to load version {snapshot.version} after fetching it")
            results = await asyncio.gather(
                *(asyncio.wait_for(self._loaders[i].load_weights(snapshot.tensors, snapshot.version), remaining) for i in targets),
                return_exceptions=True,
            )
            if all(not isinstance(r, BaseException) for r in results):
                self._supersede(snapshot)
            failures = []
            for i, result in zip(targets, results):
                if isinstance(result, BaseException):
                    failures.append((i, result))
                else:
                    self._held[i].advance(snapshot.version)
            if failures:
                i, error = failures[0]
                if isinstance(error, asyncio.TimeoutError):
                    raise SyncTimeoutError(f"worker {i} did not load version {snapshot.version} within {limit} s") from error
                raise SyncError(
                    f"workers {[i for i, _ in failures]} failed to load version {snapshot.version}: {error!r}"
                ) from error
            # AST: AST_POSTCONDITION(self._all_hold(snapshot.version), got=self.worker_versions(), msg="every worker holds the fetched version or newer")
            check.postcondition(self._all_hold(snapshot.version), "every worker holds the fetched version or newer", got_lazy=lambda: self.worker_versions())  # generated #d7c783353e
        log.info("version %d loaded into workers %s (skipped %s)", snapshot.version, targets, list(skipped))
        return UpdateReport(version=snapshot.version, applied=tuple(targets), skipped=skipped, attempts=snapshot.attempts)

    def _supersede(self, snapshot: WeightSnapshot) -> None:
        """Hold `snapshot` (every loader serves from or keeps its views) and release the one it replaces.

        Why not release at once: a loader such as LLMProxy keeps the mapping for workers that come
        back later, and a channel that receives into released buffers would overwrite those views
        with the next version while they are still tagged with this one.
        """
        # deps: WeightSnapshot.release
        previous, self._held_snapshot = self._held_snapshot, snapshot
        if previous is not None and previous is not snapshot:
            previous.release()

    async def model_update(self, named_tensors: NamedTensors, version: int, timeout: float | None = None) -> UpdateReport:
        """Publish, wait until fetchable, and update the local workers: the synchronous pipeline's one call."""
        limit = self._timeout if timeout is None else timeout
        # VAL: VAL_TIMEOUT(limit, exc=SyncValidationError)
        check.timeout("limit", limit, exc=SyncValidationError)  # generated #fa7df66203
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        await self.publish(named_tensors, version).wait(limit)
        return await self.update(version, timeout=max(deadline - loop.time(), 1e-3))
