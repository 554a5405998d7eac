"""LocalChannel: the embedded default, trainer and inference in one process (tests, the smallest demo)."""

from __future__ import annotations

import asyncio

from rollart import checks as check
from rollart.sync._waiting import wait_for_version
from rollart.sync.bucket import DEFAULT_BUCKET_BYTES, NamedTensors, PackedWeights, pack_buckets, unpack_buckets
from rollart.sync.channel import DEFAULT_TIMEOUT_S, PublishHandle, WeightSnapshot, fetch_verified, finished_handle
from rollart.sync.errors import ChannelClosedError, StaleVersionError, SyncValidationError
from rollart.sync.versioning import LATEST, RetainedVersions, VersionSpec


class LocalChannel:
    """Publish packs the tensors into buckets kept in memory; fetch hands out zero-copy views of them.

    Why pack at all in-process: the snapshot decouples the trainer's live parameters (which the next
    step overwrites) from what inference loads, exactly as the network channels do.
    Receivers must treat fetched tensors as read-only: they share the retained buffers.
    """

    def __init__(self, keep_last: int = 2, bucket_bytes: int = DEFAULT_BUCKET_BYTES, verify: bool = False) -> None:
        # VAL: VAL_POSITIVE(bucket_bytes, exc=SyncValidationError)
        check.positive("bucket_bytes", bucket_bytes, exc=SyncValidationError)  # generated #e365418568
        self._retained = RetainedVersions(keep_last)
        self._bucket_bytes = bucket_bytes
        self._verify = verify
        self._cond: asyncio.Condition | None = None
        self._closed = False
        self._notifiers: set[asyncio.Task[None]] = set()

    @property
    def versions(self) -> tuple[int, ...]:
        """Versions retained now, oldest first."""
        return self._retained.versions

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def publish(self, named_tensors: NamedTensors, version: int) -> PublishHandle:
        """Snapshot `named_tensors` as `version` and make it fetchable; the handle is already done."""
        if self._closed:
            raise ChannelClosedError("LocalChannel is closed")
        latest = self._retained.latest
        # VAL: VAL_VERSION_MONOTONIC(version, latest, exc=StaleVersionError)
        check.version_monotonic("version", version, latest, exc=StaleVersionError)  # generated #0c521e8dfd
        self._retained.add(self._snapshot(named_tensors, version))
        cond = self._condition()

        async def _notify() -> None:
            async with cond:
                cond.notify_all()

        task = asyncio.get_running_loop().create_task(_notify())
        self._notifiers.add(task)  # keep a reference until it ran (the loop holds tasks only weakly)
        task.add_done_callback(self._notifiers.discard)
        return finished_handle(version)

    def _snapshot(self, named_tensors: NamedTensors, version: int) -> PackedWeights:
        """What `publish` keeps of `version`: the tensors packed into buckets (SimChannel keeps none, D45)."""
        return pack_buckets(named_tensors, version, self._bucket_bytes)

    async def fetch(self, version: VersionSpec = LATEST, timeout: float = DEFAULT_TIMEOUT_S) -> WeightSnapshot:
        """The newest (or the given) retained version; waits up to `timeout` s for one to be published."""
        # VAL: VAL_TIMEOUT(timeout, exc=SyncValidationError)
        check.timeout("timeout", timeout, exc=SyncValidationError)  # generated #fcfdcac0bb
        if self._closed:
            raise ChannelClosedError("LocalChannel is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        picked = await wait_for_version(self._condition(), self._retained, version, timeout)
        packed = self._retained.get(picked)
        assert packed is not None
        if self._verify:

            async def _read():
                return packed.manifest, packed.buffers

            return await fetch_verified(_read, 1, deadline)
        return WeightSnapshot(
            version=picked, manifest=packed.manifest, tensors=unpack_buckets(packed.manifest, packed.buffers)
        )

    async def close(self) -> None:
        """Drop every retained version."""
        self._closed = True
        self._retained = RetainedVersions(1)
