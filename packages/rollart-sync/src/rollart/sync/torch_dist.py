"""TorchDistributedChannel: bucketed broadcast from the trainer's rank over a torch.distributed group.

The intra-cluster path (the paper's `model_update_group`): gloo on CPU here, NCCL on GPUs. The
process group is created by the caller (the pipeline or the resource layer); this channel only
issues collectives on it.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from rollart import checks as check
from rollart.sync._waiting import pick_version
from rollart.sync.bucket import (
    DEFAULT_BUCKET_BYTES,
    Manifest,
    NamedTensors,
    PackedWeights,
    as_named_list,
    buffers_for,
    fill_bucket,
    plan_manifest,
    unpack_buckets,
    verify_buckets,
    with_checksums,
)
from rollart.sync.channel import DEFAULT_TIMEOUT_S, MAX_ATTEMPTS, PublishHandle, WeightSnapshot
from rollart.sync.errors import (
    ChannelClosedError,
    ChecksumMismatchError,
    StaleVersionError,
    SyncTimeoutError,
    SyncValidationError,
    VersionNotAvailableError,
)
from rollart.sync.versioning import LATEST, RetainedVersions, VersionLedger, VersionSpec

_OK, _CORRUPT = 0, 1

WIRE_CHUNK_BYTES = 8 << 20
"""8 MiB: the unit a bucket crosses the wire in, so each end checksums one chunk while the next moves (D34)."""


def wire_chunks(buffers: Sequence[torch.Tensor]) -> list[tuple[int, torch.Tensor]]:
    """(bucket index, byte slice) of every bucket, in order, each at most WIRE_CHUNK_BYTES (empty buckets: none)."""
    out = []
    for index, buffer in enumerate(buffers):
        flat = buffer.view(torch.uint8)
        out.extend((index, flat[start : start + WIRE_CHUNK_BYTES]) for start in range(0, flat.numel(), WIRE_CHUNK_BYTES))
    return out


def _crc(chunk: torch.Tensor, running: int) -> int:
    """CRC-32 continued over one chunk: chained over a bucket's chunks it equals `bucket_checksum` of the bucket."""
    return zlib.crc32((chunk if chunk.device.type == "cpu" else chunk.cpu()).numpy(), running)


class TorchDistributedChannel:
    """Bucketed broadcast from `src_rank` to every other rank of `group`, receivers voting on integrity.

    One update: header (version, manifest length, manifest CRC) -> manifest (its bucket checksums 0)
    -> every bucket in WIRE_CHUNK_BYTES chunks as `async_op` broadcasts, the source computing each
    bucket's CRC-32 and every receiver checking it chunk by chunk while later chunks move (D34) ->
    the checksums -> `all_reduce(MAX)` of a corrupt flag; on a corrupt vote the buckets and
    checksums go again, up to `max_attempts`. Collectives run on one dedicated thread so every rank
    issues them in the same order and the event loop never blocks; every asyncio wait has a deadline
    and the process group's own timeout bounds the thread.
    """

    def __init__(
        self,
        group: Any = None,
        src_rank: int = 0,
        keep_last: int = 2,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        max_attempts: int = 3,
        device: str = "cpu",
        receive_hook: Callable[[int, Sequence[torch.Tensor]], None] | None = None,
        checksums: bool = True,
    ) -> None:
        """receive_hook(attempt, buffers) sees received buffers before verification (fault-injection seam for tests).

        `device` is where the buffers live on this rank (`cuda:0` under NCCL, D43): packed from the
        trainer's tensors there and received there, never staged through the host. `checksums=False`
        (set on the source; receivers learn it from the header) drops the CRC-32 of every bucket for
        a reliable transport (TCP under gloo, NCCL), D42; a receive_hook still verifies against
        checksums, so a source with a hook-testing receiver keeps them on.
        """
        import torch.distributed as dist

        # VAL: VAL_INT_RANGE(max_attempts, min=1, max=MAX_ATTEMPTS, exc=SyncValidationError)
        check.int_range("max_attempts", max_attempts, min=1, max=MAX_ATTEMPTS, exc=SyncValidationError)  # generated #2c4ddc2fe7
        # AST: AST_PRECONDITION(dist.is_initialized(), got=group, msg="torch.distributed process group initialised before the channel")
        check.precondition(dist.is_initialized(), "torch.distributed process group initialised before the channel", got=group)  # generated #7dfde607c4
        self._dist = dist
        self._group = group
        self._rank = dist.get_rank()
        self._src = src_rank
        self._bucket_bytes = bucket_bytes
        self._max_attempts = max_attempts
        self._device = device
        self._receive_hook = receive_hook
        self._checksums = checksums
        self._retained = RetainedVersions(keep_last)
        self._published = VersionLedger()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollart-sync-collectives")
        self._spare: list[torch.Tensor] = []  # the source's last broadcast buffers, reused by the next pack (D11)
        self._recv_spare: list[torch.Tensor] = []  # a receiver's evicted, fully released buffers (D12)
        self._outstanding: dict[int, int] = {}  # version -> snapshots handed out and not yet released
        self._evicted_in_use: tuple[int, PackedWeights] | None = None  # evicted while snapshots were out
        self._pending: asyncio.Future[tuple[Manifest, list[torch.Tensor], int]] | None = None
        self._closed = False

    @property
    def is_source(self) -> bool:
        """True on the trainer's rank (the one that publishes)."""
        return self._rank == self._src

    @property
    def versions(self) -> tuple[int, ...]:
        """Versions retained on this receiver, oldest first (the source retains none: D11)."""
        return self._retained.versions

    # ---- the collective sequence (runs on the dedicated thread) -------------------------------------

    def _on_device(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer if self._device == "cpu" else buffer.to(self._device)  # the small header and manifest only

    def _vote(self, corrupt: bool) -> bool:
        flag = torch.tensor([_CORRUPT if corrupt else _OK], dtype=torch.int64, device=self._device)
        self._dist.all_reduce(flag, op=self._dist.ReduceOp.MAX, group=self._group)
        return int(flag.item()) == _OK

    def _broadcast_update(self, packed: PackedWeights, ready: Sequence[threading.Event], failed: threading.Event) -> None:
        """Header, manifest, then each bucket as soon as `ready[i]` says the publisher packed it (D41).

        `failed` set means the publisher's copy raised: the buckets still go (every rank follows
        the same sequence) but the source votes corrupt on every attempt, so no receiver applies them.
        """
        raw = packed.manifest.to_bytes()
        header = torch.tensor([packed.manifest.version, len(raw), zlib.crc32(raw), int(self._checksums)],
                              dtype=torch.int64, device=self._device)
        self._dist.broadcast(header, self._src, group=self._group)
        self._dist.broadcast(self._on_device(torch.frombuffer(bytearray(raw), dtype=torch.uint8)), self._src, group=self._group)
        buffers = list(packed.buffers)
        chunks = wire_chunks(buffers)
        checksums: torch.Tensor | None = None
        for attempt in range(1, self._max_attempts + 1):
            works = []
            for index, chunk in chunks:
                ready[index].wait()
                works.append(self._dist.broadcast(chunk, self._src, group=self._group, async_op=True))
            if checksums is None and self._checksums:  # while the chunks move: the CRCs of every bucket (D34)
                sums = [0] * len(buffers)
                for index, chunk in chunks:
                    sums[index] = _crc(chunk, sums[index])
                checksums = torch.tensor(sums, dtype=torch.int64, device=self._device)
            for work in works:
                work.wait()
            if checksums is not None:
                self._dist.broadcast(checksums, self._src, group=self._group)
            if self._vote(corrupt=failed.is_set()):
                return
            if attempt == self._max_attempts:
                raise ChecksumMismatchError(
                    f"version {packed.manifest.version}: receivers reported corrupt buckets on all {attempt} attempts"
                )

    def _receive_update(self, spare: list[torch.Tensor]) -> tuple[Manifest, list[torch.Tensor], int]:
        header = torch.empty(4, dtype=torch.int64, device=self._device)
        self._dist.broadcast(header, self._src, group=self._group)
        version, length, crc, with_sums = (int(x) for x in header.cpu().tolist())
        raw = torch.empty(length, dtype=torch.uint8, device=self._device)
        self._dist.broadcast(raw, self._src, group=self._group)
        raw_bytes = raw.cpu().numpy().tobytes()
        if zlib.crc32(raw_bytes) != crc:
            # The bucket sizes are unknown, so this rank cannot follow the sequence: the group is unusable.
            raise ChecksumMismatchError(f"version {version}: manifest checksum mismatch; the process group must be rebuilt")
        manifest = Manifest.from_bytes(raw_bytes)
        buffers = buffers_for(manifest, spare, self._device)  # received straight into reused memory (D12)
        chunks = wire_chunks(buffers)
        checksums = torch.empty(len(manifest.buckets), dtype=torch.int64, device=self._device)
        inline = self._receive_hook is None and with_sums
        for attempt in range(1, self._max_attempts + 1):
            works = [self._dist.broadcast(c, self._src, group=self._group, async_op=True) for _, c in chunks]
            got = [0] * len(buffers)
            for (index, chunk), work in zip(chunks, works):
                work.wait()
                if inline:  # check this chunk while the next ones arrive
                    got[index] = _crc(chunk, got[index])
            if not with_sums:  # a reliable transport, the source sends none (D42)
                corrupt = False
                if self._receive_hook is not None:
                    self._receive_hook(attempt, buffers)
                if self._vote(corrupt):
                    return manifest, buffers, attempt
                continue
            self._dist.broadcast(checksums, self._src, group=self._group)
            verified = with_checksums(manifest, checksums.cpu().tolist())
            if inline:
                corrupt = got != [b.checksum for b in verified.buckets]
            else:
                self._receive_hook(attempt, buffers)
                try:
                    verify_buckets(verified, buffers)
                    corrupt = False
                except ChecksumMismatchError:
                    corrupt = True
            if self._vote(corrupt):
                return verified, buffers, attempt
        raise ChecksumMismatchError(f"version {version}: buckets corrupt on all {self._max_attempts} attempts; not applied")

    # ---- the channel interface ---------------------------------------------------------------------------

    def publish(self, named_tensors: NamedTensors, version: int) -> PublishHandle:
        """On src_rank: snapshot and broadcast in the background; return at once."""
        if self._closed:
            raise ChannelClosedError("TorchDistributedChannel is closed")
        # AST: AST_PRECONDITION(self.is_source, got=self._rank, msg="only src_rank publishes")
        check.precondition(self.is_source, "only src_rank publishes", got=self._rank)  # generated #dee1f1fe8c
        # VAL: VAL_VERSION_MONOTONIC(version, self._published.current, exc=StaleVersionError)
        check.version_monotonic("version", version, self._published.current, exc=StaleVersionError)  # generated #6e0d0cfa45
        spare, self._spare = self._spare, []
        named = as_named_list(named_tensors)
        manifest = plan_manifest(named, version, self._bucket_bytes)
        packed = PackedWeights(manifest, tuple(buffers_for(manifest, spare, self._device)))
        ready = [threading.Event() for _ in manifest.buckets]
        failed = threading.Event()
        self._published.advance(version)
        # the wire starts with bucket 0 while the later buckets are still being copied (D41); the
        # snapshot is complete when publish returns, the CRCs (if any) run on the collective thread
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._broadcast_update, packed, ready, failed)
        tensors = dict(named)
        try:
            for spec, buffer, event in zip(manifest.buckets, packed.buffers, ready):
                fill_bucket(buffer, spec, tensors)
                event.set()
        except BaseException:
            failed.set()  # the half-copied version is voted corrupt everywhere, never applied
            raise
        finally:  # a failed copy must not leave the collective thread waiting forever
            for event in ready:
                event.set()

        def _recycle(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                self._spare = list(packed.buffers)  # every receiver has them now; nobody else holds them

        future.add_done_callback(_recycle)
        return PublishHandle(version, future)

    async def fetch(self, version: VersionSpec = LATEST, timeout: float = DEFAULT_TIMEOUT_S) -> WeightSnapshot:
        """On a receiver: a retained version, or join the next broadcast(s) until the deadline.

        "latest" means the next broadcast (a receiver learns of a newer version only by joining it).
        A version at or below the newest retained one that is no longer retained (evicted or
        skipped) fails at once with VersionNotAvailableError, as in LocalChannel: no broadcast
        will ever carry it again, so waiting would only time out and leave a receive pending.
        A receive cut short by the deadline stays pending and the next fetch collects it, so no
        broadcast is lost and every rank stays in step.
        """
        # VAL: VAL_TIMEOUT(timeout, exc=SyncValidationError)
        check.timeout("timeout", timeout, exc=SyncValidationError)  # generated #fcfdcac0bb
        if self._closed:
            raise ChannelClosedError("TorchDistributedChannel is closed")
        if version != LATEST and pick_version(self._retained, version) is not None:
            # retained: hand it out; pick_version raised already if it is older than the newest
            # retained one and gone (evicted or skipped), so no receive is started for it
            packed = self._retained.get(version)
            assert packed is not None
            return self._snapshot(packed, 1)
        if self.is_source:
            raise VersionNotAvailableError(f"the source rank {self._rank} publishes and retains nothing to fetch (D11)")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._pending is None:
                spare, self._recv_spare = self._recv_spare, []
                self._pending = loop.run_in_executor(self._executor, self._receive_update, spare)
            remaining = deadline - loop.time()
            try:
                manifest, buffers, attempts = await asyncio.wait_for(asyncio.shield(self._pending), max(remaining, 0))
            except TimeoutError as exc:
                raise SyncTimeoutError(f"no broadcast of version {version!r} arrived within {timeout} s") from exc
            finally:
                if self._pending is not None and self._pending.done():
                    self._pending = None
            received = manifest.version
            packed = PackedWeights(manifest, tuple(buffers))
            if self._retained.latest is None or received > self._retained.latest:
                self._retain(packed)
            if version == LATEST or received == version:
                return self._snapshot(packed, attempts)
            if received > version:
                raise VersionNotAvailableError(f"version {version} was skipped: the next broadcast carried {received}")

    def _retain(self, packed: PackedWeights) -> None:
        """Retain a received version; recycle an evicted one's buffers once no snapshot of it is out (D12)."""
        before = {v: self._retained.get(v) for v in self._retained.versions}
        for old in self._retained.add(packed):
            old_packed = before[old]
            if old_packed is None:
                continue
            if self._outstanding.get(old, 0) == 0:
                self._outstanding.pop(old, None)
                self._recv_spare = list(old_packed.buffers)
            else:
                self._evicted_in_use = (old, old_packed)  # at most one is remembered: bounded memory

    def _snapshot(self, packed: PackedWeights, attempts: int) -> WeightSnapshot:
        version = packed.manifest.version
        self._outstanding[version] = self._outstanding.get(version, 0) + 1

        def recycle() -> None:
            left = self._outstanding.get(version, 1) - 1
            self._outstanding[version] = left
            if left == 0 and self._evicted_in_use is not None and self._evicted_in_use[0] == version:
                self._recv_spare = list(self._evicted_in_use[1].buffers)
                self._evicted_in_use = None
                self._outstanding.pop(version, None)

        snapshot = WeightSnapshot(version, packed.manifest, unpack_buckets(packed.manifest, packed.buffers), attempts)
        snapshot.recycle = recycle
        return snapshot

    async def close(self) -> None:
        """Stop the collective thread (a collective in flight ends with the process group's timeout)."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
