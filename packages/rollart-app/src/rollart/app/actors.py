"""The Ray actor bodies of a real run: rollout workers and data-parallel trainer replicas (design D17).

Why here and not in rollart.proxy / rollart.train: an actor that trains AND publishes through a
weight channel, or serves AND fetches from one, joins three packages; only the application may import
them all. Each actor is a `rollart.resource.Worker`, placed by `RayRuntime` on one placement-group
bundle `{GPU: n, <hardware>: n}`, so a pool lands on its hardware type.

Weights never pass through the driver: the trainer's rank 0 publishes into a `rollart.sync` channel
(`torch_dist`: bucketed broadcast over a gloo/NCCL group of rank 0 and every rollout actor;
`mooncake`: put into the Mooncake store, each rollout actor gets), every rollout actor receives and
retains the version, and the proxy then tells each active worker to load `ChannelWeights(version)`,
a marker the actor resolves from its own retained copy. Offloaded workers load it on expand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollart.app.engines import EngineSpec
from rollart.app.model_source import ModelSpec
from rollart.proxy.types import EngineOutput, EngineRequest
from rollart.proxy.worker import InferenceWorker
from rollart.resource.runtime import WorkerContext
from rollart.resource.worker import Worker


class ChannelWeights(Mapping[str, Any]):
    """An empty mapping that means "version v, from this worker's own channel copy".

    It goes through `LLMProxy.update_weights` like any weights mapping (so the proxy's bookkeeping
    of versions, offloaded workers and expand is unchanged) but weighs nothing over Ray.
    """

    def __init__(self, version: int) -> None:
        """The version every worker resolves locally."""
        self.version = version

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __reduce__(self):
        return (ChannelWeights, (self.version,))


@dataclass(frozen=True)
class WorldSpec:
    """One torch.distributed world: trainer replicas then rollout actors, and the channel to open."""

    init_method: str
    world_size: int
    trainer_ranks: tuple[int, ...]
    rollout_ranks: tuple[int, ...]
    backend: str = "gloo"
    channel: str = "torch_dist"
    keep_last: int = 2
    bucket_bytes: int = 64 << 20
    mooncake: Any = None  # rollart.sync MooncakeConfig for channel == "mooncake"
    timeout_s: float = 120.0
    megatron: bool = False  # every rank also builds megatron's parallel state (its groups are collectives)
    checksums: bool = False  # torch_dist: CRC-32 per bucket (rollart-sync D42; off for TCP and NCCL)
    store_only: bool = False  # mooncake: a replacement connects to the store without joining the torch world (D81)


def fetch_only(config: Any) -> Any:
    """A rollout actor's Mooncake client: it contributes no memory to the store (D81).

    Why: the store places a version's replicas on the segments its clients mounted; a rollout actor
    that died took its segment with it, and every later put that the master placed there failed
    (code -800) until the master's lease dropped it. Only the publisher's segment holds versions now.
    """
    return dataclasses.replace(config, global_segment_bytes=0)


def free_address() -> str:
    """A tcp:// rendezvous on this node: its address as Ray sees it (127.0.0.1 locally) and a free port."""
    try:
        import ray

        host = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray, loopback
        host = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    return f"tcp://{host}:{port}"


class SyncEndpoint:
    """One process's place in the world: its groups and its weight channel."""

    def __init__(self) -> None:
        """Nothing joined yet."""
        self.rank: int | None = None
        self.dp_group: Any = None
        self.channel: Any = None

    async def join(self, world: WorldSpec, rank: int) -> None:
        """Join the world, build the data-parallel and update groups, open the channel."""
        import torch.distributed as dist

        if world.init_method.startswith("tcp://127.0.0.1"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        timeout = datetime.timedelta(seconds=world.timeout_s)
        if world.store_only:  # a store needs no collective: a late member only connects (D81)
            from rollart.sync.mooncake import MooncakeChannel

            self.rank = rank
            self.channel = await MooncakeChannel.connect(fetch_only(world.mooncake), keep_last=world.keep_last,
                                                         bucket_bytes=world.bucket_bytes, timeout=world.timeout_s)
            return

        def _init() -> tuple[Any, Any]:
            dist.init_process_group(world.backend, init_method=world.init_method, rank=rank,
                                    world_size=world.world_size, timeout=timeout)
            dp = dist.new_group(list(world.trainer_ranks), timeout=timeout)
            update = dist.new_group([world.trainer_ranks[0], *world.rollout_ranks], timeout=timeout)
            if world.megatron:
                init_megatron_parallel_state()
            return dp, update

        dp_group, update_group = await asyncio.wait_for(asyncio.to_thread(_init), world.timeout_s + 10)
        self.rank = rank
        self.dp_group = dp_group if rank in world.trainer_ranks else None
        in_update = rank == world.trainer_ranks[0] or rank in world.rollout_ranks
        if not in_update:
            return
        if world.channel == "torch_dist":
            from rollart.sync.torch_dist import TorchDistributedChannel

            # under NCCL every member is on CUDA (D72): buffers live on the actor's device (sync D43)
            device = "cuda:0" if world.backend == "nccl" else "cpu"
            self.channel = TorchDistributedChannel(group=update_group, src_rank=world.trainer_ranks[0],
                                                   keep_last=world.keep_last, bucket_bytes=world.bucket_bytes,
                                                   device=device, checksums=world.checksums)
        elif world.channel == "mooncake":
            from rollart.sync.mooncake import MooncakeChannel

            store = world.mooncake if rank == world.trainer_ranks[0] else fetch_only(world.mooncake)
            self.channel = await MooncakeChannel.connect(store, keep_last=world.keep_last,
                                                         bucket_bytes=world.bucket_bytes, timeout=world.timeout_s)
        else:
            raise ValueError(f"channel must be one of ['torch_dist', 'mooncake'], got {world.channel!r}")

    async def close(self) -> None:
        """Close the channel and leave the world."""
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - leaving must not fail a shutdown
            pass


class RolloutActor(Worker):
    """A Ray actor body: one InferenceWorker over the pool's engine, plus its weight-channel endpoint."""

    def __init__(self, context: WorkerContext, engine: EngineSpec) -> None:
        """Build (lazily, in `start`) the pool's engine on this actor's device."""
        super().__init__(context)
        import torch

        from rollart.resource.accelerators import assigned_placement

        torch.set_num_threads(1)
        self._placement = assigned_placement(f"{context.owner}/{context.rank}")  # D70
        if engine.kind == "torch":
            engine = dataclasses.replace(engine, device=self._placement.device)
        self._worker = InferenceWorker(f"{context.owner}-{context.rank}", engine.build,
                                       hardware=context.hw, devices=context.devices)
        self._sync = SyncEndpoint()
        self._snapshots: dict[int, Any] = {}
        self._loaded_version: int | None = None

    async def start(self) -> None:
        """Start the worker loop inside the actor's event loop."""
        await self._worker.start()

    def device_kind(self) -> str:
        """`cuda` or `cpu`: where this actor's engine runs (the world's backend follows, D72)."""
        return self._placement.kind

    async def join(self, world: WorldSpec, rank: int) -> None:
        """Join the weight-sync world as `rank`."""
        await self._sync.join(world, rank)

    async def leave(self) -> None:
        """Leave the world so a re-formed one can be joined (app D81); the engine keeps serving what it loaded."""
        for snap in self._snapshots.values():
            snap.release()
        self._snapshots.clear()
        await self._sync.close()

    async def receive(self, version: int, timeout: float) -> dict[str, float]:
        """Take part in publishing `version` (collective or get) and retain it; returns its bytes and seconds."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        snapshot = await self._sync.channel.fetch(version, timeout=timeout)
        self._snapshots[version] = snapshot
        for old in sorted(self._snapshots)[:-2]:
            self._snapshots.pop(old).release()
        return {"bytes": float(snapshot.manifest.total_bytes), "receive_s": loop.time() - t0}

    async def checksums(self) -> dict[str, Any]:
        """What this worker serves: engine version, SHA-256 per tensor of the engine's own model where it
        exposes one (torch), and of the weights it last loaded from the channel (every engine)."""
        from rollart.app.checksum import tensor_checksums

        engine = self._worker._engine
        model = getattr(engine, "model", None)
        snapshot = self._snapshots.get(self._loaded_version) if self._loaded_version is not None else None
        return {"version": getattr(engine, "version", None), "loaded_version": self._loaded_version,
                "engine": tensor_checksums(model.state_dict()) if model is not None else None,
                "loaded": tensor_checksums(snapshot.tensors) if snapshot is not None else None}

    async def submit(self, request: EngineRequest) -> EngineOutput:
        """Forwarded to InferenceWorker.submit."""
        return await self._worker.submit(request)

    async def engine_stats(self) -> dict[str, float]:
        """The engine's cumulative counters (TorchEngine.stats) as a plain dict; {} for engines without."""
        engine = self._worker.engine
        stats = getattr(engine, "stats", None) if engine is not None else None
        return dataclasses.asdict(stats()) if callable(stats) else {}

    async def probe(self) -> Any:
        """The worker's health answer (its stats), or WorkerFailedError when its loop or engine is gone."""
        return await self._worker.probe()

    async def abort(self, request_id: str) -> bool:
        """Forwarded to InferenceWorker.abort."""
        return await self._worker.abort(request_id)

    async def evict(self, request_ids: list[str] | None = None) -> list[str]:
        """Forwarded to InferenceWorker.evict."""
        return await self._worker.evict(request_ids)

    async def suspend(self) -> None:
        """Forwarded to InferenceWorker.suspend."""
        await self._worker.suspend()

    async def resume(self) -> None:
        """Forwarded to InferenceWorker.resume."""
        await self._worker.resume()

    async def offload(self) -> None:
        """Forwarded to InferenceWorker.offload."""
        await self._worker.offload()

    async def reload(self) -> None:
        """Forwarded to InferenceWorker.reload."""
        await self._worker.reload()

    async def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """Load tensors, or resolve `ChannelWeights` from the copy this actor received."""
        if isinstance(weights, ChannelWeights):
            snapshot = self._snapshots.get(weights.version)
            if snapshot is None:
                raise RuntimeError(f"version {weights.version} was not received on {self.context.owner}-{self.context.rank}; "
                                   f"held: {sorted(self._snapshots)}")
            weights = snapshot.tensors
        await self._worker.load_weights(dict(weights), version)
        self._loaded_version = version

    async def restart(self) -> None:
        """Forwarded to InferenceWorker.restart."""
        await self._worker.restart()

    async def stop(self) -> None:
        """Stop the worker and leave the sync world."""
        await self._worker.stop()
        for snap in self._snapshots.values():
            snap.release()
        self._snapshots.clear()
        await self._sync.close()


class TrainerActor(Worker):
    """A Ray actor body: one data-parallel replica of the trainer; rank 0 also publishes weights."""

    def __init__(self, context: WorkerContext, model: ModelSpec, backend: str, trainer_config: Any) -> None:
        """Build the same model as every other replica and every engine (same checkpoint or seed)."""
        super().__init__(context)
        import torch

        from rollart.resource.accelerators import assigned_placement

        torch.set_num_threads(1)
        self._placement = assigned_placement(f"{context.owner}/{context.rank}")  # D70
        self._model = model
        self._backend = backend
        self._trainer_config = trainer_config
        self._trainer: Any = None
        self._sync = SyncEndpoint()
        self._weights_lock = asyncio.Lock()  # a step and a publish's pack never overlap (D40)

    def rendezvous(self) -> str:
        """A tcp:// address on this actor's node for the world's rendezvous (asked of rank 0)."""
        return free_address()

    async def join(self, world: WorldSpec, rank: int) -> None:
        """Join the world, then build the trainer over the data-parallel group.

        Joining a re-formed world (a rollout member was replaced, app D81) keeps the trainer and its
        optimizer state and hands it the new data-parallel group; megatron's parallel state is
        global to the process and is not re-formed.
        """
        if self._trainer is not None and self._backend == "megatron" and len(world.trainer_ranks) > 1:
            raise RuntimeError("a megatron trainer with data-parallel replicas cannot re-form its world; "
                               "resume the run to start a new one")
        await self._sync.join(world, rank)
        group = self._sync.dp_group if len(world.trainer_ranks) > 1 else None
        if self._trainer is None:
            self._trainer = build_trainer(self._model, self._backend, self._trainer_config, process_group=group,
                                          device=self._placement.device)
        else:
            self._trainer.process_group = group

    async def leave(self) -> None:
        """Leave the world before a re-formed one is joined (app D81); the trainer stays."""
        async with self._weights_lock:
            await self._sync.close()

    def start_local(self) -> None:
        """Build the trainer without a world (one replica, local channel)."""
        self._trainer = build_trainer(self._model, self._backend, self._trainer_config, device=self._placement.device)

    def device_kind(self) -> str:
        """`cuda` or `cpu`: where this replica's model lives (the world's backend follows, D72)."""
        return self._placement.kind

    async def train_step(self, shard: Any) -> dict[str, float]:
        """One optimizer step over this replica's shard (gradients summed over the group)."""
        async with self._weights_lock:
            return await asyncio.to_thread(self._trainer.train_step, shard)

    def version(self) -> int:
        """The trainer's version."""
        return self._trainer.version

    async def publish(self, version: int, timeout: float) -> dict[str, float]:
        """Rank 0: publish the current weights as `version` through the channel; returns bytes and phase seconds."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # Views of the live weights, no clone: the channel's pack below is the snapshot (one copy, into
        # reused buffers), taken before `channel.publish` returns, under the lock a train step holds (D40).
        async with self._weights_lock:
            named = self._trainer.named_tensors(copy=False)
            t1 = loop.time()
            handle = self._sync.channel.publish(named, version)
            t2 = loop.time()
        await handle.wait(timeout=timeout)
        t3 = loop.time()
        return {"bytes": float(sum(t.numel() * t.element_size() for t in named.values())),
                "snapshot_s": t1 - t0, "pack_s": t2 - t1, "wire_s": t3 - t2}

    def named_tensors(self) -> dict[str, Any]:
        """The weights (local-channel runs and checks only; real runs publish)."""
        return self._trainer.named_tensors()

    async def checksums(self) -> dict[str, str]:
        """SHA-256 per tensor of the trainer's weights, under the names engines load by."""
        from rollart.app.checksum import tensor_checksums

        return tensor_checksums(self._trainer.named_tensors())

    async def save_checkpoint(self, path: str) -> None:
        """Write the checkpoint (rank 0 on a shared filesystem)."""
        await asyncio.to_thread(self._trainer.save_checkpoint, path)

    async def load_checkpoint(self, path: str) -> None:
        """Restore from a checkpoint."""
        await asyncio.to_thread(self._trainer.load_checkpoint, path)

    def continue_at(self, version: int) -> None:
        """Keep the run's version after a rebuild from an older checkpoint (D75, rollart-train D22)."""
        self._trainer.continue_at(version)

    async def stop(self) -> None:
        """Leave the sync world."""
        await self._sync.close()


def init_megatron_parallel_state() -> None:
    """Megatron's TP=1/PP=1 parallel state over the default world, creating a one-rank gloo world first
    when this process has none (a trainer in the driver, or a lone replica without a sync world).

    Megatron derives its groups from the default world and every rank of that world must take part in
    creating them, so in a joined world every rank calls this (`WorldSpec.megatron`); with TP = PP = 1
    nothing in the CPU step uses those groups: gradients are averaged over the trainer's own
    data-parallel group (TorchTrainer D12)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=free_address(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def release_megatron_parallel_state() -> None:
    """Undo `init_megatron_parallel_state` in a process that leaves no other world behind (the driver)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def build_trainer(model: ModelSpec, backend: str, trainer_config: Any, process_group: Any = None,
                  device: str | None = None) -> Any:
    """A TorchTrainer (or MegatronTrainer) over the model built from the spec, starting from the same
    weights as every engine (version 0 needs no transfer), on `device` (the actor's assignment, D70)."""
    if backend == "megatron":
        from rollart.train.megatron_trainer import MegatronTrainer

        init_megatron_parallel_state()
        return MegatronTrainer(model.hf_config(), trainer_config, hf_state_dict=model.build_module().state_dict(),
                               seed=model.seed, process_group=process_group, device=device)
    from rollart.train.torch_trainer import TorchTrainer

    return TorchTrainer(model.build_module(), trainer_config, process_group=process_group, device=device)
