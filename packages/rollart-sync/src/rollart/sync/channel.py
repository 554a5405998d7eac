"""The one interface every weight channel implements, and the pieces they share.

Why one interface: the pipeline picks a channel by deployment (in-process, intra-cluster broadcast,
cross-cluster store) and the trainer and inference workers never know which one they use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rollart import checks as check
from rollart.sync.bucket import Manifest, NamedTensors, unpack_buckets, verify_buckets
from rollart.sync.errors import ChecksumMismatchError, SyncTimeoutError, SyncValidationError
from rollart.sync.versioning import LATEST, VersionSpec

if TYPE_CHECKING:
    import torch  # annotations only: importing this module must not import torch (D45)

DEFAULT_TIMEOUT_S = 60.0
"""Default deadline of a fetch or a publish wait: generous for 1 GB over TCP, finite on purpose."""

MAX_ATTEMPTS = 16


@dataclass
class WeightSnapshot:
    """One verified version as the receiver sees it: tensors are views into the received buffers."""

    version: int
    manifest: Manifest
    tensors: Mapping[str, torch.Tensor]
    attempts: int = 1
    recycle: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        """Hand the received buffers back to the channel for its next fetch; the tensors are dead after this.

        Why: receiving into memory that is already touched is several times faster than into fresh
        pages. Only the owner who knows nobody reads the tensors any more calls it (ModelUpdateGroup
        does once every loader has copied them); an unreleased snapshot's memory is never reused.
        """
        if self.recycle is not None:
            recycle, self.recycle = self.recycle, None
            recycle()


class PublishHandle:
    """A publish in flight. `publish` returns it at once; await `wait` to know the version is fetchable.

    Why a handle: the trainer goes on training while the transfer runs (the paper's asynchronous
    cross-cluster update); whoever needs the guarantee waits on the handle, with a deadline.
    """

    def __init__(self, version: int, task: asyncio.Future[None]) -> None:
        self.version = version
        self._task = task

    def done(self) -> bool:
        """True once the publish finished (successfully or not)."""
        return self._task.done()

    async def wait(self, timeout: float = DEFAULT_TIMEOUT_S) -> int:
        """Wait until the version is fetchable; return it. Raises the publish's error or SyncTimeoutError."""
        # VAL: VAL_TIMEOUT(timeout, exc=SyncValidationError)
        check.timeout("timeout", timeout, exc=SyncValidationError)  # generated #fcfdcac0bb
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError as exc:
            raise SyncTimeoutError(f"publish of version {self.version} not finished after {timeout} s") from exc
        return self.version


def finished_handle(version: int) -> PublishHandle:
    """A handle for a publish that completed synchronously (the local channel)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return PublishHandle(version, future)


@runtime_checkable
class WeightChannel(Protocol):
    """Versioned weight publication and fetch; implemented by LocalChannel, TorchDistributedChannel, MooncakeChannel.

    The trainer side publishes (`ModelUpdateGroup.publish`, or the trainer actor's rank 0); each
    inference side fetches. Versions only grow; a fetch never hands on a torn or corrupt transfer.
    """

    def publish(self, named_tensors: NamedTensors, version: int) -> PublishHandle:
        """Snapshot the tensors as `version` (strictly newer than the last) and start the transfer; return at once.

        The copy is taken before it returns, so the trainer may step again right away and change
        the tensors; the transfer goes on in the background. Await `PublishHandle.wait` (with a
        deadline) to know the version is fetchable. A version not above the last published raises
        `StaleVersionError`; a closed channel `ChannelClosedError`. Not a coroutine, but it needs
        the running event loop (the transfer is a task or an executor job of that loop).
        """
        ...

    async def fetch(self, version: VersionSpec = LATEST, timeout: float = DEFAULT_TIMEOUT_S) -> WeightSnapshot:
        """Deliver a verified version ("latest" = newest available), waiting for one until the deadline.

        Every bucket's checksum is verified and a torn transfer is read again, so the snapshot's
        tensors are exactly what was published. An explicit version no longer retained raises
        `VersionNotAvailableError` at once; nothing arriving by `timeout` seconds raises
        `SyncTimeoutError`. The tensors are views into the channel's buffers: copy what you keep,
        then call `WeightSnapshot.release` so the next fetch can reuse them.
        """
        ...

    async def close(self) -> None:
        """Release the channel's resources (threads, process groups, store connections); call once at shutdown.

        Later `publish`/`fetch` calls raise `ChannelClosedError`.
        """
        ...


async def fetch_verified(
    read: Callable[[], Awaitable[tuple[Manifest, Sequence[torch.Tensor]]]], max_attempts: int, deadline: float
) -> WeightSnapshot:
    """Read a version, verify every bucket's checksum, and read again on a mismatch.

    Why shared: every channel must refetch a torn transfer and never hand it on; `deadline` is a
    `loop.time()` instant bounding all attempts together.
    """
    # VAL: VAL_INT_RANGE(max_attempts, min=1, max=MAX_ATTEMPTS, exc=SyncValidationError)
    check.int_range("max_attempts", max_attempts, min=1, max=MAX_ATTEMPTS, exc=SyncValidationError)  # generated #2c4ddc2fe7
    loop = asyncio.get_running_loop()
    last_error: ChecksumMismatchError | None = None
    for attempt in range(1, max_attempts + 1):
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise SyncTimeoutError(f"fetch ran past its deadline after {attempt - 1} attempts (last error: {last_error})")
        try:
            manifest, buffers = await asyncio.wait_for(read(), remaining)
        except TimeoutError as exc:
            raise SyncTimeoutError(f"fetch attempt {attempt} ran past its deadline") from exc
        try:
            verify_buckets(manifest, buffers)
        except ChecksumMismatchError as exc:
            last_error = exc
            continue
        return WeightSnapshot(
            version=manifest.version, manifest=manifest, tensors=unpack_buckets(manifest, buffers), attempts=attempt
        )
    raise ChecksumMismatchError(f"every one of {max_attempts} fetch attempts was corrupt; last: {last_error}")
