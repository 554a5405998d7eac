"""GPU placement as the app sees it (D70-D72): pool config for tensor parallelism, `rollart plan`'s
device kinds, backends and TP groups, the world's backend from its members, and TP bundles on Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollart.app.builder import world_backend
from rollart.app.cli import app
from rollart.app.config import RunConfig
from rollart.app.overrides import load_config_with
from rollart.app.plan import make_plan
from rollart.app.ray_workers import tp_groups
from rollart.resource.accelerators import MixedWorldError
from rollart.scheduler.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
GPU_EXAMPLE = ROOT / "examples/configs/gpu_qwen_8gpu.yaml"


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> str:
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("gpu-ckpt") / "model"))


def _config(**pool) -> RunConfig:
    from rollart.app.config import parse_config

    return parse_config({"rollout": {"pools": [{"name": "p", **pool}]}})


@pytest.mark.parametrize(("pool", "says"), [
    ({"devices": 3, "engine": "sim", "tensor_parallel_size": 2}, "rollout.pools.p.devices must be a multiple of tensor_parallel_size=2"),
    ({"devices": 2, "engine": "torch", "tensor_parallel_size": 2}, "rollout.pools.p.tensor_parallel_size: engine 'torch' runs one device"),
    ({"devices": 1, "engine": "torch", "gpu_memory_utilization": 0.5}, "rollout.pools.p.gpu_memory_utilization applies to engine 'vllm' only"),
    ({"devices": 1, "engine": "torch", "dtype": "bfloat16"}, "rollout.pools.p.dtype applies to engine 'vllm' only"),
    ({"devices": 1, "engine": "sim", "tensor_parallel_size": 0}, "tensor_parallel_size"),
])
def test_pool_tensor_parallel_knobs_are_refused_naming_the_field(pool, says) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        _config(**pool)


def test_a_pool_runs_one_engine_per_tensor_parallel_group() -> None:
    cfg = _config(devices=4, engine="sim", tensor_parallel_size=2)
    assert cfg.rollout.pools[0].engines == 2
    assert tp_groups([10, 11, 12, 13], 2) == [(10, 11), (12, 13)]
    with pytest.raises(AssertionError, match="multiple of its tensor_parallel_size"):
        tp_groups([1, 2, 3], 2)


def test_the_gpu_example_plans_cuda_devices_nccl_and_its_tp_groups(tiny_ckpt) -> None:
    sets = [f"model.path={tiny_ckpt}", "model.dtype=bfloat16"]
    plan = make_plan(load_config_with(GPU_EXAMPLE, sets), base_dir=GPU_EXAMPLE.parent)
    (pool,) = plan.pools
    assert (pool.device_kind, pool.tensor_parallel_size, pool.tp_groups) == ("cuda", 2, ((0, 1), (2, 3)))
    assert (plan.trainer.device_kind, plan.trainer.dp_backend, plan.sync_backend) == ("cuda", "nccl", "nccl")
    res = CliRunner().invoke(app, ["plan", str(GPU_EXAMPLE), *[a for s in sets for a in ("--set", s)]],
                             env={"COLUMNS": "240"})
    assert res.exit_code == 0, res.output
    assert "2 x TP 2: [0,1] [2,3]" in res.output and "backend on a GPU cluster: nccl" in res.output
    assert "cuda" in res.output


def test_tensor_parallel_splits_the_per_device_memory(tiny_ckpt) -> None:
    base = [f"model.path={tiny_ckpt}"]
    one = make_plan(load_config_with(GPU_EXAMPLE, [*base, "rollout.pools.0.tensor_parallel_size=1"]), base_dir=GPU_EXAMPLE.parent)
    two = make_plan(load_config_with(GPU_EXAMPLE, base), base_dir=GPU_EXAMPLE.parent)
    assert two.pools[0].memory.weights == -(-one.pools[0].memory.weights // 2)
    # the KV cache splits by KV heads, so at most num_kv_heads ways (a head is replicated past that; D60)
    kv_ways = min(2, two.model.num_kv_heads)
    assert two.pools[0].memory.kv_cache == -(-one.pools[0].memory.kv_cache // kv_ways)


def test_a_mixed_cuda_cpu_sync_world_is_flagged_by_the_plan() -> None:
    cfg = load_config_with(ROOT / "examples/configs/cpu_demo.yaml",
                           ["rollout.pools.0.hardware=CPU", "trainer.hardware=H800", "pipeline.mode=async",
                            "trainer.placement=actors", "sync.channel=torch_dist", "cluster.devices.CPU=8",
                            "cluster.devices.H800=1"])
    plan = make_plan(cfg, base_dir=ROOT / "examples/configs")
    assert plan.sync_backend.startswith("refused")
    assert any("mixes cuda and cpu" in w for w in plan.warnings)


class _Member:
    """A world member answering `device_kind` as a Ray actor does (the call is what connect_world makes)."""

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.handles = kinds

    async def call(self, *args):
        if len(args) == 2:  # ActorTrainerGroup.call(rank, method)
            return self.kinds[args[0]]
        return self.kinds[0]


@pytest.mark.parametrize(("trainer", "rollout", "expected"), [
    (["cpu", "cpu"], ["cpu"], "gloo"),
    (["cuda", "cuda"], ["cuda", "cuda"], "nccl"),
])
async def test_the_world_backend_follows_every_members_device(trainer, rollout, expected) -> None:
    assert await world_backend(_Member(trainer), [_Member([k]) for k in rollout]) == expected


async def test_a_mixed_world_is_refused_naming_the_ranks() -> None:
    with pytest.raises(MixedWorldError, match=r"ranks \[0, 1\] are on cuda and ranks \[2\] on cpu"):
        await world_backend(_Member(["cuda", "cuda"]), [_Member(["cpu"])])


@pytest.mark.ray
async def test_a_tp_pool_gets_one_bundle_of_its_devices_per_engine(ray_cluster) -> None:  # noqa: ARG001
    """Real Ray: each engine's actor holds a bundle of 2 logical GPUs of the pool's hardware (one node)."""
    from rollart.app.engines import EngineSpec
    from rollart.app.model_source import ModelSpec
    from rollart.app.ray_workers import start_rollout_actors
    from rollart.resource.runtime import RayRuntime

    runtime = RayRuntime()
    spec = EngineSpec("sim", ModelSpec(path=None), "H20", 4, {}, tensor_parallel_size=2)
    handles = await start_rollout_actors(runtime, "tp", spec, [0, 1, 2, 3], timeout_s=120, devices_per_worker=2)
    try:
        assert [h.devices for h in handles] == [(0, 1), (2, 3)]
        assert [h.handle.bundle for h in handles] == [{"GPU": 2.0, "H20": 2.0}] * 2
        assert [await h.call("device_kind") for h in handles] == ["cpu", "cpu"]  # logical GPUs, no CUDA here
    finally:
        for h in handles:
            await h.stop()
