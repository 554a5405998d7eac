"""Bucketing: a model's named tensors as a few size-bounded, dtype-homogeneous flat buffers plus a manifest.

Why buckets: one transfer per bucket (never one per parameter) keeps a weight update to a handful of
large, batched calls; one dtype per bucket lets the receiver rebuild every tensor as a zero-copy view
of the flat buffer and lets NCCL/gloo move typed buffers.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Union

from rollart import checks as check
from rollart.sync.errors import ChecksumMismatchError, SyncValidationError

if TYPE_CHECKING:
    import torch

# torch is imported by the functions that touch tensors, not here: `rollart sim` imports this module
# for its names and must not pay torch's import (D45)
NamedTensors = Union[Mapping[str, "torch.Tensor"], Iterable[tuple[str, "torch.Tensor"]]]
"""What the trainer hands over: a state dict, or an iterable of (name, tensor) pairs."""

DEFAULT_BUCKET_BYTES = 32 * 1024 * 1024
"""32 MiB: large enough to amortise per-call overhead, small enough to fit Mooncake's staging buffer."""


class _TorchDtypes(Mapping[str, "torch.dtype"]):
    """Manifest dtype name -> torch dtype; the names are known without torch, the dtypes looked up on first use (D45)."""

    _NAMES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")

    def __init__(self) -> None:
        self._dtypes: dict[str, torch.dtype] | None = None

    def _resolved(self) -> dict[str, torch.dtype]:
        if self._dtypes is None:
            import torch

            self._dtypes = {name: getattr(torch, name) for name in self._NAMES}
        return self._dtypes

    def __getitem__(self, name: str) -> torch.dtype:
        return self._resolved()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._NAMES

    def __iter__(self) -> Iterator[str]:
        return iter(self._NAMES)

    def __len__(self) -> int:
        return len(self._NAMES)


SUPPORTED_DTYPES: Mapping[str, torch.dtype] = _TorchDtypes()
"""Dtypes a manifest can name (string names keep the manifest plain JSON)."""

MAX_VERSION = 2**62


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest name of a torch dtype (`torch.float32` -> `"float32"`)."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorEntry:
    """Where one named tensor lives inside its bucket: element offset and shape."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class BucketSpec:
    """One flat buffer: its dtype, size, CRC-32 checksum and the tensors packed into it, in order."""

    index: int
    dtype: str
    numel: int
    nbytes: int
    checksum: int
    entries: tuple[TensorEntry, ...]


@dataclass(frozen=True)
class Manifest:
    """Everything a receiver needs to rebuild a version: the buckets and the version number."""

    version: int
    buckets: tuple[BucketSpec, ...]

    @property
    def total_bytes(self) -> int:
        """Bytes of all buckets together (the payload of one update)."""
        return sum(b.nbytes for b in self.buckets)

    @property
    def names(self) -> tuple[str, ...]:
        """Every tensor name, in bucket order."""
        return tuple(e.name for b in self.buckets for e in b.entries)

    def to_bytes(self) -> bytes:
        """Serialise as compact JSON, so any channel can ship it next to the buckets."""
        doc = {
            "version": self.version,
            "buckets": [
                {
                    "index": b.index,
                    "dtype": b.dtype,
                    "numel": b.numel,
                    "nbytes": b.nbytes,
                    "checksum": b.checksum,
                    "entries": [[e.name, list(e.shape), e.offset, e.numel] for e in b.entries],
                }
                for b in self.buckets
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse what `to_bytes` wrote; a malformed manifest raises ChecksumMismatchError (a torn transfer)."""
        try:
            doc = json.loads(bytes(data).decode())
            buckets = tuple(
                BucketSpec(
                    index=int(b["index"]),
                    dtype=str(b["dtype"]),
                    numel=int(b["numel"]),
                    nbytes=int(b["nbytes"]),
                    checksum=int(b["checksum"]),
                    entries=tuple(TensorEntry(str(n), tuple(int(s) for s in shp), int(o), int(k)) for n, shp, o, k in b["entries"]),
                )
                for b in doc["buckets"]
            )
            manifest = cls(version=int(doc["version"]), buckets=buckets)
        except (ValueError, KeyError, TypeError) as exc:
            raise ChecksumMismatchError(f"manifest is not valid JSON of a Manifest ({exc}); torn transfer?") from exc
        unknown = sorted({b.dtype for b in buckets} - set(SUPPORTED_DTYPES))
        if unknown:
            raise ChecksumMismatchError(f"manifest names unknown dtypes {unknown}; allowed {sorted(SUPPORTED_DTYPES)}")
        return manifest


@dataclass(frozen=True)
class PackedWeights:
    """A manifest and its flat buffers (1-D, contiguous, one per bucket, typed by the bucket's dtype)."""

    manifest: Manifest
    buffers: tuple[torch.Tensor, ...]


def as_named_list(named_tensors: NamedTensors) -> list[tuple[str, torch.Tensor]]:
    """Accept a mapping or an iterable of pairs; keep the caller's order (it decides bucket order)."""
    if isinstance(named_tensors, Mapping):
        return list(named_tensors.items())
    return list(named_tensors)


def with_checksums(manifest: Manifest, checksums: Sequence[int]) -> Manifest:
    """The manifest with each bucket's checksum set (a channel that checksums during the transfer, D34)."""
    # AST: AST_PRECONDITION(len(checksums) == len(manifest.buckets), got=len(checksums), msg="one checksum per bucket")
    check.precondition(len(checksums) == len(manifest.buckets), "one checksum per bucket", got_lazy=lambda: len(checksums))  # generated #e112820909
    return Manifest(manifest.version, tuple(replace(b, checksum=int(c)) for b, c in zip(manifest.buckets, checksums)))


def bucket_checksum(buffer: torch.Tensor) -> int:
    """CRC-32 of a flat buffer's bytes: ~6 GB/s here, and it catches every single-bit and burst error."""
    import torch

    flat = buffer.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous().reshape(-1)
    if flat.numel() == 0:
        return 0
    return zlib.crc32(flat.view(torch.uint8).numpy())


def plan_buckets(named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[int]]:
    """Group tensor indices into buckets: same dtype, at most `bucket_bytes` (a bigger tensor gets its own).

    Why a plan separate from the copy: the plan is pure arithmetic, cheap to property-test.
    """
    # VAL: VAL_POSITIVE(bucket_bytes, exc=SyncValidationError)
    check.positive("bucket_bytes", bucket_bytes, exc=SyncValidationError)  # generated #e365418568
    open_by_dtype: dict[torch.dtype, int] = {}
    buckets: list[list[int]] = []
    sizes: list[int] = []
    for i, (_name, tensor) in enumerate(named):
        nbytes = tensor.numel() * tensor.element_size()
        slot = open_by_dtype.get(tensor.dtype)
        if slot is None or sizes[slot] + nbytes > bucket_bytes:
            slot = len(buckets)
            buckets.append([])
            sizes.append(0)
            open_by_dtype[tensor.dtype] = slot
        buckets[slot].append(i)
        sizes[slot] += nbytes
    return buckets


def _take_spare(spare: list[torch.Tensor], dtype: torch.dtype, numel: int, device: str = "cpu") -> torch.Tensor | None:
    import torch

    for i, candidate in enumerate(spare):
        if candidate.dtype == dtype and candidate.numel() == numel and str(candidate.device) == str(torch.device(device)):
            return spare.pop(i)
    return None


def plan_manifest(named: Sequence[tuple[str, torch.Tensor]], version: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Manifest:
    """The manifest of a pack (checksums 0) from names, shapes and dtypes alone, before any byte is copied.

    Why apart from the copy: a channel can send the manifest and start moving the first bucket
    while the later ones are still being packed (D41).
    """
    import torch

    names = [n for n, _ in named]
    dtypes = [dtype_name(t.dtype) for _, t in named]
    # VAL: VAL_INT_RANGE(version, min=0, max=MAX_VERSION, exc=SyncValidationError)
    check.int_range("version", version, min=0, max=MAX_VERSION, exc=SyncValidationError)  # generated #c524180f30
    # VAL: VAL_NON_EMPTY(names, exc=SyncValidationError)
    check.non_empty("names", names, exc=SyncValidationError)  # generated #6afea93ecb
    # VAL: VAL_UNIQUE(names, exc=SyncValidationError)
    check.unique("names", names, exc=SyncValidationError)  # generated #d3eeae21fb
    # VAL: VAL_SUBSET(dtypes, of=SUPPORTED_DTYPES, exc=SyncValidationError)
    check.subset("dtypes", dtypes, of=SUPPORTED_DTYPES, exc=SyncValidationError)  # generated #479d677bf0
    specs: list[BucketSpec] = []
    for index, members in enumerate(plan_buckets(named, bucket_bytes)):
        dtype = named[members[0]][1].dtype
        entries = []
        offset = 0
        for i in members:
            name, tensor = named[i]
            entries.append(TensorEntry(name=name, shape=tuple(tensor.shape), offset=offset, numel=tensor.numel()))
            offset += tensor.numel()
        specs.append(BucketSpec(index=index, dtype=dtype_name(dtype), numel=offset,
                                nbytes=offset * torch.empty((), dtype=dtype).element_size(), checksum=0,
                                entries=tuple(entries)))
    return Manifest(version=version, buckets=tuple(specs))


def fill_bucket(buffer: torch.Tensor, spec: BucketSpec, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy one bucket's tensors into its flat buffer (one memcpy each, on whatever device both live on)."""
    for e in spec.entries:
        buffer[e.offset : e.offset + e.numel].copy_(tensors[e.name].detach().reshape(-1))


def buffers_for(manifest: Manifest, spare: list[torch.Tensor] | None, device: str = "cpu") -> list[torch.Tensor]:
    """One flat buffer per bucket on `device`: a spare of the same dtype, size and device where there is one.

    Why reuse: writing into memory already touched is several times faster than into fresh pages
    (D11, D12). Used spares are removed from the list.
    """
    import torch

    out = []
    for b in manifest.buckets:
        dtype = SUPPORTED_DTYPES[b.dtype]
        reused = _take_spare(spare, dtype, b.numel, device) if spare else None
        out.append(reused if reused is not None else torch.empty(b.numel, dtype=dtype, device=device))
    return out


def pack_buckets(
    named_tensors: NamedTensors,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    spare: list[torch.Tensor] | None = None,
    checksums: bool = True,
) -> PackedWeights:
    """Copy the tensors into flat buckets (one memcpy each) and checksum them: a snapshot the trainer may overwrite.

    `checksums=False` leaves every bucket's checksum 0 for a channel that computes them itself while
    the buckets are on the wire (TorchDistributedChannel, D34), or needs none (D42).

    `spare` holds flat buffers of an earlier, no longer referenced snapshot (a publisher's own, after
    its transfer finished); a bucket of the same dtype and size is packed into one of them instead
    of fresh memory, which saves the page faults that cost more than the copy itself. Used buffers
    are removed from the list.
    """
    named = as_named_list(named_tensors)
    # deps: plan_manifest, buffers_for, fill_bucket
    manifest = plan_manifest(named, version, bucket_bytes)
    buffers = buffers_for(manifest, spare)
    tensors = dict(named)
    for spec, buffer in zip(manifest.buckets, buffers):
        fill_bucket(buffer, spec, tensors)
    if checksums:
        manifest = with_checksums(manifest, [bucket_checksum(b) for b in buffers])
    return PackedWeights(manifest=manifest, buffers=tuple(buffers))


def allocate_buffers(manifest: Manifest, device: str = "cpu") -> list[torch.Tensor]:
    """Empty flat buffers shaped by a manifest: the receiving side transfers straight into these."""
    import torch

    return [torch.empty(b.numel, dtype=SUPPORTED_DTYPES[b.dtype], device=device) for b in manifest.buckets]


def verify_buckets(manifest: Manifest, buffers: Sequence[torch.Tensor]) -> None:
    """Raise ChecksumMismatchError unless every buffer has its bucket's size, dtype and CRC-32.

    Why before unpacking: a torn transfer must be refetched, never applied.
    """
    if len(buffers) != len(manifest.buckets):
        raise ChecksumMismatchError(
            f"version {manifest.version}: got {len(buffers)} buffers, manifest has {len(manifest.buckets)} buckets"
        )
    for spec, buffer in zip(manifest.buckets, buffers):
        got_bytes = buffer.numel() * buffer.element_size()
        if got_bytes != spec.nbytes or dtype_name(buffer.dtype) != spec.dtype:
            raise ChecksumMismatchError(
                f"version {manifest.version} bucket {spec.index}: got {got_bytes} bytes of {dtype_name(buffer.dtype)}, "
                f"manifest says {spec.nbytes} bytes of {spec.dtype}"
            )
        got = bucket_checksum(buffer)
        if got != spec.checksum:
            raise ChecksumMismatchError(
                f"version {manifest.version} bucket {spec.index}: checksum {got:#010x} != manifest {spec.checksum:#010x}"
            )


def unpack_buckets(manifest: Manifest, buffers: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rebuild the named tensors as views into the flat buffers: no copy on the receiving side."""
    # AST: AST_PRECONDITION(len(buffers) == len(manifest.buckets), got=len(buffers), msg="one buffer per bucket")
    check.precondition(len(buffers) == len(manifest.buckets), "one buffer per bucket", got_lazy=lambda: len(buffers))  # generated #a57f015102
    out: dict[str, torch.Tensor] = {}
    for spec, buffer in zip(manifest.buckets, buffers):
        for e in spec.entries:
            out[e.name] = buffer[e.offset : e.offset + e.numel].view(e.shape)
    return out
