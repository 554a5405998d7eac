"""Device and collective-backend resolution from what Ray assigned (D35, D36): every branch runs on CPU."""

from __future__ import annotations

import pytest
import ray
from hypothesis import given
from hypothesis import strategies as st

from rollart.resource.accelerators import (
    DevicePlacement,
    MixedWorldError,
    assigned_placement,
    collective_backend,
    device_kind_for_hardware,
    resolve_device,
)
from rollart.resource.errors import ResourceError
from rollart.resource.hardware import BUILTIN_HARDWARE


def test_assigned_gpus_with_cuda_place_on_cuda_zero_and_use_nccl() -> None:
    p = resolve_device(["3", "5"], cuda_devices=2)
    assert (p.kind, p.device, p.backend) == ("cuda", "cuda:0", "nccl")
    assert p.accelerator_ids == ("3", "5")


def test_assigned_gpus_without_cuda_fall_back_to_cpu_and_say_why() -> None:
    p = resolve_device(["0"], cuda_devices=0)
    assert (p.kind, p.device, p.backend) == ("cpu", "cpu", "gloo")
    assert "no CUDA device" in p.reason and "['0']" in p.reason


def test_no_assigned_gpu_is_cpu_even_when_cuda_is_present() -> None:
    """A CPU-only actor on a GPU node must not grab a GPU Ray gave to someone else."""
    p = resolve_device([], cuda_devices=8)
    assert p.kind == "cpu" and "no GPU" in p.reason


def test_fewer_visible_devices_than_assigned_still_uses_cuda_zero_and_says_so() -> None:
    p = resolve_device(["0", "1"], cuda_devices=1)
    assert p.device == "cuda:0" and "only 1" in p.reason


def test_bad_inputs_are_refused_naming_the_field() -> None:
    with pytest.raises(ResourceError, match="cuda_devices"):
        resolve_device(["0"], cuda_devices=-1)
    with pytest.raises(ResourceError, match="ids"):
        resolve_device(["0", "0"], cuda_devices=2)


@given(st.lists(st.sampled_from(["cuda", "cpu"]), min_size=1, max_size=16))
def test_backend_is_nccl_only_for_all_cuda_gloo_only_for_all_cpu_else_refused(kinds: list[str]) -> None:
    if set(kinds) == {"cuda"}:
        assert collective_backend(kinds) == "nccl"
    elif set(kinds) == {"cpu"}:
        assert collective_backend(kinds) == "gloo"
    else:
        with pytest.raises(MixedWorldError) as info:
            collective_backend(kinds)
        msg = str(info.value)
        assert str([r for r, k in enumerate(kinds) if k == "cuda"]) in msg
        assert str([r for r, k in enumerate(kinds) if k == "cpu"]) in msg


def test_backend_refuses_unknown_kinds_and_empty_worlds_naming_the_allowed() -> None:
    with pytest.raises(ResourceError, match="kinds.*cuda"):
        collective_backend(["tpu"])
    with pytest.raises(ResourceError, match="kinds"):
        collective_backend([])


def test_hardware_kinds_gpus_are_cuda_and_the_cpu_node_is_cpu() -> None:
    kinds = {name: device_kind_for_hardware(spec.hbm_gb) for name, spec in BUILTIN_HARDWARE.items()}
    assert kinds["CPU"] == "cpu"
    assert kinds["H800"] == kinds["H20"] == "cuda"


def test_the_driver_without_an_assigned_gpu_is_placed_on_cpu() -> None:
    p = assigned_placement("test")
    assert isinstance(p, DevicePlacement) and p.kind == "cpu"


@pytest.mark.ray
def test_a_ray_actor_with_a_logical_gpu_resolves_its_assigned_id(ray_cluster) -> None:  # noqa: ARG001
    """Real Ray: the actor sees the id Ray gave it; without CUDA here it lands on CPU and says so."""

    @ray.remote(num_gpus=1, num_cpus=0)
    class Probe:
        def where(self) -> tuple[str, tuple[str, ...], str]:
            p = assigned_placement("probe")
            return p.device, p.accelerator_ids, p.reason

    probe = Probe.remote()
    try:
        device, ids, reason = ray.get(probe.where.remote(), timeout=60)
    finally:
        ray.kill(probe)
    assert len(ids) == 1 and ids[0].isdigit()
    assert device == "cpu" and "no CUDA device" in reason  # this machine has no GPU
