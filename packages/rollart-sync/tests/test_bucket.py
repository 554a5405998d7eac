"""Bucketing: bit-exact round trips, dtype grouping, size bounds, zero-copy rebuild, corruption detection."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollart.sync.bucket import (
    SUPPORTED_DTYPES,
    Manifest,
    allocate_buffers,
    bucket_checksum,
    pack_buckets,
    plan_buckets,
    unpack_buckets,
    verify_buckets,
)
from rollart.sync.errors import ChecksumMismatchError, SyncValidationError

DTYPES = list(SUPPORTED_DTYPES.values())


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bytes reinterpreted as `dtype`: covers NaN payloads and every bit pattern, not just nice values."""
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


named_tensor_lists = st.lists(
    st.tuples(
        st.sampled_from(DTYPES),
        st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple),
        st.integers(0, 2**31 - 1),
    ),
    min_size=1,
    max_size=8,
).map(lambda specs: [(f"p{i}.w", _random_tensor(d, s, seed)) for i, (d, s, seed) in enumerate(specs)])


@given(named=named_tensor_lists, bucket_bytes=st.integers(1, 512), version=st.integers(0, 10**6))
def test_round_trip_is_bit_exact(named, bucket_bytes, version):
    packed = pack_buckets(named, version, bucket_bytes)
    # The receiving side: fresh buffers, filled by "the wire" (a byte copy), verified, rebuilt.
    received = allocate_buffers(Manifest.from_bytes(packed.manifest.to_bytes()))
    for dst, src in zip(received, packed.buffers):
        dst.view(torch.uint8).copy_(src.view(torch.uint8))
    manifest = Manifest.from_bytes(packed.manifest.to_bytes())
    verify_buckets(manifest, received)
    out = unpack_buckets(manifest, received)
    assert manifest.version == version
    assert sorted(out) == sorted(n for n, _ in named)  # bucket order groups by dtype
    for name, tensor in named:
        assert out[name].dtype == tensor.dtype
        assert out[name].shape == tensor.shape
        assert _bits(out[name]) == _bits(tensor)


@given(named=named_tensor_lists, bucket_bytes=st.integers(1, 512))
def test_buckets_are_dtype_homogeneous_and_size_bounded(named, bucket_bytes):
    packed = pack_buckets(named, 0, bucket_bytes)
    by_name = dict(named)
    for spec, buffer in zip(packed.manifest.buckets, packed.buffers):
        assert {by_name[e.name].dtype for e in spec.entries} == {SUPPORTED_DTYPES[spec.dtype]}
        assert buffer.is_contiguous() and buffer.dim() == 1
        # bounded, unless a single tensor is itself larger than the bound
        assert spec.nbytes <= bucket_bytes or len(spec.entries) == 1
    assert sorted(packed.manifest.names) == sorted(by_name)


@given(named=named_tensor_lists)
def test_rebuilt_tensors_are_views_of_the_buffers(named):
    packed = pack_buckets(named, 1, 256)
    out = unpack_buckets(packed.manifest, packed.buffers)
    for spec, buffer in zip(packed.manifest.buckets, packed.buffers):
        start = buffer.data_ptr()
        end = start + buffer.numel() * buffer.element_size()
        for e in spec.entries:
            if e.numel:
                assert start <= out[e.name].data_ptr() < end  # no copy: the view points into the flat buffer


@given(named=named_tensor_lists, where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_bit_is_detected(named, where, bit):
    packed = pack_buckets(named, 3, 128)
    nonempty = [i for i, b in enumerate(packed.buffers) if b.numel() > 0]
    if not nonempty:
        return
    i = nonempty[int(where * len(nonempty))]
    raw = packed.buffers[i].view(torch.uint8)
    pos = int(where * raw.numel())
    raw[pos] ^= 1 << bit
    with pytest.raises(ChecksumMismatchError, match=f"bucket {i}: checksum"):
        verify_buckets(packed.manifest, packed.buffers)


def test_truncated_buffer_and_garbled_manifest_are_detected():
    packed = pack_buckets({"a": torch.arange(10.0)}, 1)
    with pytest.raises(ChecksumMismatchError, match="bytes"):
        verify_buckets(packed.manifest, [packed.buffers[0][:5]])
    with pytest.raises(ChecksumMismatchError, match="manifest"):
        Manifest.from_bytes(packed.manifest.to_bytes()[:-3])


def test_plan_groups_by_dtype_in_caller_order():
    named = [("a", torch.zeros(4)), ("b", torch.zeros(4, dtype=torch.int64)), ("c", torch.zeros(4)), ("d", torch.zeros(100))]
    assert plan_buckets(named, 32) == [[0, 2], [1], [3]]


def test_non_contiguous_and_checksum_of_empty():
    t = torch.arange(12.0).reshape(3, 4).t()
    packed = pack_buckets([("t", t)], 0)
    assert torch.equal(unpack_buckets(packed.manifest, packed.buffers)["t"], t)
    assert bucket_checksum(torch.empty(0)) == 0


def test_validation_names_field_value_and_allowed():
    with pytest.raises(SyncValidationError, match="bucket_bytes must be > 0, got 0"):
        pack_buckets({"a": torch.zeros(1)}, 0, bucket_bytes=0)
    with pytest.raises(SyncValidationError, match="names must have unique elements"):
        pack_buckets([("a", torch.zeros(1)), ("a", torch.zeros(1))], 0)
    with pytest.raises(SyncValidationError, match="names must not be empty"):
        pack_buckets({}, 0)
    with pytest.raises(SyncValidationError, match="version must be an integer"):
        pack_buckets({"a": torch.zeros(1)}, -1)
    with pytest.raises(SyncValidationError, match="not allowed: \\['complex64'\\]"):
        pack_buckets({"a": torch.zeros(1, dtype=torch.complex64)}, 0)


def test_spare_buffers_are_reused_and_fully_overwritten():
    first = pack_buckets({"a": torch.full((100,), 1.0), "b": torch.full((7,), 2, dtype=torch.int64)}, 1, bucket_bytes=64)
    spare = list(first.buffers)
    ptrs = {b.data_ptr() for b in spare}
    named = {"a": torch.arange(100.0), "b": torch.arange(7, dtype=torch.int64)}
    second = pack_buckets(named, 2, bucket_bytes=64, spare=spare)
    assert ptrs & {b.data_ptr() for b in second.buffers}  # same-shaped buckets landed in the spare memory
    verify_buckets(second.manifest, second.buffers)
    out = unpack_buckets(second.manifest, second.buffers)
    assert torch.equal(out["a"], named["a"]) and torch.equal(out["b"], named["b"])


def test_chained_chunk_checksums_equal_the_bucket_checksum():
    """D34: the broadcast's chunk-by-chunk CRC is the bucket's CRC, and the manifest carries it."""
    import zlib

    from rollart.sync.bucket import with_checksums
    from rollart.sync.torch_dist import WIRE_CHUNK_BYTES, wire_chunks

    g = torch.Generator().manual_seed(0)
    named = {"big": torch.randn(WIRE_CHUNK_BYTES // 4 * 2 + 123, generator=g),  # 3 chunks, the last short
             "small": torch.randint(0, 100, (7,), dtype=torch.int64, generator=g)}
    packed = pack_buckets(named, version=3, bucket_bytes=1 << 30, checksums=False)
    assert all(b.checksum == 0 for b in packed.manifest.buckets)
    chunks = wire_chunks(packed.buffers)
    assert [i for i, _ in chunks] == [0, 0, 0, 1]
    assert max(c.numel() for _, c in chunks) <= WIRE_CHUNK_BYTES
    sums = [0] * len(packed.buffers)
    for index, chunk in chunks:
        sums[index] = zlib.crc32(chunk.numpy(), sums[index])
    assert sums == [bucket_checksum(b) for b in packed.buffers]
    verified = with_checksums(packed.manifest, sums)
    verify_buckets(verified, packed.buffers)
    assert verified.buckets == pack_buckets(named, version=3, bucket_bytes=1 << 30).manifest.buckets
    packed.buffers[0][5] += 1.0  # a torn byte fails the chained checksum
    with pytest.raises(ChecksumMismatchError):
        verify_buckets(verified, packed.buffers)


@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from([torch.float32, torch.bfloat16, torch.int64])),
                min_size=1, max_size=12), st.integers(1, 256))
def test_the_manifest_planned_before_the_copy_is_the_packed_one(shapes, bucket_bytes):
    """D41: the channel sends plan_manifest's manifest before packing; it must describe what pack_buckets packs."""
    from rollart.sync.bucket import buffers_for, fill_bucket, plan_manifest

    named = [(f"t{i}", torch.arange(n).to(dtype)) for i, (n, dtype) in enumerate(shapes)]
    packed = pack_buckets(named, 3, bucket_bytes, checksums=False)
    planned = plan_manifest(named, 3, bucket_bytes)
    assert planned == packed.manifest
    spare = [b.clone().fill_(0) for b in packed.buffers]
    ptrs = {b.data_ptr() for b in spare}
    buffers = buffers_for(planned, spare)
    assert {b.data_ptr() for b in buffers} == ptrs and spare == []  # every bucket packed into reused memory
    for spec, buffer in zip(planned.buckets, buffers):
        fill_bucket(buffer, spec, dict(named))
    assert all(torch.equal(a, b) for a, b in zip(buffers, packed.buffers))
