"""`sync: sim`: a weight channel that charges transfer time and moves only a version token.

It is a *simulation*, named as such (design D14): a publish waits
``ceil(bytes / bucket) x per-bucket latency + bytes / bandwidth`` on the running loop's clock before
the version becomes fetchable, and a fetch may wait the same over a second link. Versions, LATEST,
waits and errors are those of an inner ``LocalChannel`` that keeps a bucket-less snapshot per version
(the version is all that moves: a fetched snapshot's ``tensors`` is empty, and no torch is imported,
D45), so ``ModelUpdateGroup`` and the pipeline use it exactly like a real channel.

Example:
    ```python
    channel = SimChannel(weight_bytes=16.4e9, link_gbps=BUILTIN_HARDWARE["H800"].network_gbps)
    await channel.publish(trainer.named_tensors(), 1).wait()   # 0.3769 s of (virtual) time
    ```
"""

from __future__ import annotations

import asyncio
import math

from rollart import checks as check
from rollart.sync.bucket import DEFAULT_BUCKET_BYTES, Manifest, NamedTensors, PackedWeights
from rollart.sync.channel import DEFAULT_TIMEOUT_S, PublishHandle, WeightSnapshot
from rollart.sync.errors import ChannelClosedError, StaleVersionError, SyncTimeoutError, SyncValidationError
from rollart.sync.local import LocalChannel
from rollart.sync.versioning import LATEST, VersionSpec


def transfer_seconds(nbytes: float, link_gbps: float, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                     bucket_latency_s: float = 1e-4) -> float:
    """ceil(bytes / bucket) x per-bucket latency + bytes / bandwidth (D14)."""
    # VAL: VAL_NON_NEGATIVE(nbytes, exc=SyncValidationError)
    check.non_negative("nbytes", nbytes, exc=SyncValidationError)  # generated #2044143d8c
    # VAL: VAL_POSITIVE(link_gbps, exc=SyncValidationError)
    check.positive("link_gbps", link_gbps, exc=SyncValidationError)  # generated #337de27333
    # VAL: VAL_POSITIVE(bucket_bytes, exc=SyncValidationError)
    check.positive("bucket_bytes", bucket_bytes, exc=SyncValidationError)  # generated #e365418568
    # VAL: VAL_NON_NEGATIVE(bucket_latency_s, exc=SyncValidationError)
    check.non_negative("bucket_latency_s", bucket_latency_s, exc=SyncValidationError)  # generated #e0b942981f
    return math.ceil(nbytes / bucket_bytes) * bucket_latency_s + nbytes / (link_gbps * 1e9)


class _VersionsOnly(LocalChannel):
    """A LocalChannel that keeps each version as a manifest with no buckets: nothing to copy, nothing of torch (D45)."""

    def _snapshot(self, named_tensors: NamedTensors, version: int) -> PackedWeights:
        return PackedWeights(manifest=Manifest(version=version, buckets=()), buffers=())


class SimChannel:
    """`sync: sim`: versioned publish/fetch that charge bytes / bandwidth + per-bucket latency and move a token (D14)."""

    def __init__(self, weight_bytes: float, link_gbps: float, *, fetch_link_gbps: float | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, bucket_latency_s: float = 1e-4, keep_last: int = 2) -> None:
        """Check the figures once; versions are kept by an inner LocalChannel."""
        # deps: transfer_seconds, LocalChannel
        # VAL: VAL_POSITIVE(weight_bytes, exc=SyncValidationError)
        check.positive("weight_bytes", weight_bytes, exc=SyncValidationError)  # generated #feeca62050
        self.weight_bytes = weight_bytes
        self._publish_s = transfer_seconds(weight_bytes, link_gbps, bucket_bytes, bucket_latency_s)
        self._fetch_s = 0.0 if fetch_link_gbps is None else transfer_seconds(weight_bytes, fetch_link_gbps, bucket_bytes, bucket_latency_s)
        self._inner = _VersionsOnly(keep_last=keep_last)
        self._last: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def publish_seconds(self) -> float:
        """What one publish waits."""
        return self._publish_s

    @property
    def fetch_seconds(self) -> float:
        """What one fetch waits (0 without a fetch link)."""
        return self._fetch_s

    def publish(self, named_tensors: NamedTensors, version: int) -> PublishHandle:
        """Start a publish of `version` (strictly newer); fetchable after `publish_seconds`."""
        # deps: LocalChannel.publish
        if self._closed:
            raise ChannelClosedError("SimChannel is closed")
        # VAL: VAL_VERSION_MONOTONIC(version, self._last, exc=StaleVersionError)
        check.version_monotonic("version", version, self._last, exc=StaleVersionError)  # generated #bac318640f
        self._last = version

        async def _transfer() -> None:
            await asyncio.sleep(self._publish_s)
            self._inner.publish((), version)  # the tensors given are not moved

        task = asyncio.get_running_loop().create_task(_transfer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return PublishHandle(version, task)

    async def fetch(self, version: VersionSpec = LATEST, timeout: float = DEFAULT_TIMEOUT_S) -> WeightSnapshot:
        """Wait for the version as LocalChannel does, then `fetch_seconds`, all within `timeout`."""
        # deps: LocalChannel.fetch
        # VAL: VAL_TIMEOUT(timeout, exc=SyncValidationError)
        check.timeout("timeout", timeout, exc=SyncValidationError)  # generated #fcfdcac0bb
        if self._closed:
            raise ChannelClosedError("SimChannel is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        snapshot = await self._inner.fetch(version, timeout)
        remaining = deadline - loop.time()
        if self._fetch_s > remaining:
            await asyncio.sleep(max(remaining, 0.0))
            raise SyncTimeoutError(f"fetch of version {snapshot.version} needs {self._fetch_s:.3f} s, past its {timeout} s deadline")
        await asyncio.sleep(self._fetch_s)
        return snapshot

    async def close(self) -> None:
        """Cancel publishes in flight and drop every version."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._inner.close()
