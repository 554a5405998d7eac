"""Build a whole pipeline from a RunConfig: model, rollout pools, proxy, trainer, sync, envs, rewards.

Why one builder: `rollart run`, `rollart plan`, the demo, the tests and the benchmarks must run the
same wiring (design D16). The config names each part; this module only composes:

    model       ModelSpec: the tiny demo model or a Hugging Face checkpoint, built by each part itself
    pools       one worker per device, engine per pool; in-process (`cluster.ray: none`) or Ray actors
                placed through rollart.resource on `{GPU: 1, <hardware>: 1}` bundles
    routing     rollart.proxy's router over `routing.affinity` (tag -> hardware), hard or soft by `routing.policy`
    trainer     in this process (`placement: driver`) or data-parallel Ray actors on their own devices
    sync        LocalChannel through the proxy, or torch_dist / Mooncake from trainer rank 0 to every actor
    tasks       env, prompt builder and reward resolved by task_factory (names, plugins, import paths)
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart.app.config import RolloutPool, RunConfig, TaskSection
from rollart.app.engines import EngineSpec
from rollart.app.model_source import ModelSpec
from rollart.app.task_factory import TaskParts, build_task
from rollart.app.trainers import ActorTrainerGroup, ChannelUpdater, LocalTrainer, LocalUpdater, TrainerRebuild
from rollart.env.error_report import ErrorReport
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.protocols import SamplingParams
from rollart.env.retry import RetryPolicy
from rollart.proxy.errors import WorkerFailedError
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.routing import make_router
from rollart.proxy.worker import InferenceWorker
from rollart.scheduler.adapters import ProxyElasticPool, ProxyLLMClient, ProxyWeightLoader, RoutingLog
from rollart.scheduler.buffer import RecordLedger, SampleBuffer
from rollart.scheduler.checkpoint import Checkpointer
from rollart.scheduler.errors import ConfigError, RunFailed
from rollart.scheduler.metrics import MetricsWriter, RoleTimeline
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.scheduler.records import RunRecorder
from rollart.scheduler.rollout import RolloutScheduler
from rollart.scheduler.scoring import ScoringSink
from rollart.scheduler.timesharing import AlwaysShrinkPolicy, CostAwarePolicy, TimeSharingController
from rollart.sync.local import LocalChannel
from rollart.sync.model_update import ModelUpdateGroup

if TYPE_CHECKING:
    from rollart.train.torch_trainer import TrainerConfig

log = logging.getLogger(__name__)


def model_config(config: RunConfig) -> Any:
    """The transformers config of the run's model (tiny Llama, or the checkpoint's)."""
    return ModelSpec.from_config(config).hf_config()


def trainer_config(config: RunConfig) -> TrainerConfig:
    """rollart.train's TrainerConfig from the config's trainer section."""
    from rollart.train.losses import LossConfig  # torch: not on `rollart sim`'s path (D64)
    from rollart.train.torch_trainer import TrainerConfig
    tc = config.trainer
    return TrainerConfig(lr=tc.lr, micro_batch_size=tc.micro_batch_size, max_grad_norm=tc.max_grad_norm,
                         loss=LossConfig(clip_eps_low=tc.clip_eps, clip_eps_high=tc.clip_eps, entropy_coef=tc.entropy_coef))


def task_keys(config: RunConfig) -> list[str]:
    """A unique short name per task (the env's name, suffixed when two tasks share an env)."""
    names = [t.name for t in config.tasks]
    return [n if names.count(n) == 1 else f"{n}{i}" for i, n in enumerate(names)]


def slot_tasks(config: RunConfig) -> list[int]:
    """Each group slot's task index, proportionally to the task weights (largest remainder)."""
    p = config.pipeline
    n_slots = math.ceil(p.batch_size // p.group_size * p.redundancy)
    total = sum(t.weight for t in config.tasks)
    out: list[int] = []
    for i in range(n_slots):
        deficits = [t.weight / total * (i + 1) - out.count(k) for k, t in enumerate(config.tasks)]
        out.append(deficits.index(max(deficits)))
    return out


@dataclass
class Placement:
    """Which ledger devices each pool and the trainer got (what `rollart plan` prints, what runs)."""

    pools: dict[str, list[int]]
    trainer: list[int]
    hardware: dict[int, str] = field(default_factory=dict)


def place(config: RunConfig) -> tuple[Any, Placement]:
    """Allocate every pool's and the trainer's devices in a rollart.resource ledger by hardware type."""
    from rollart.app.config import required_devices
    from rollart.resource.manager import ResourceManager

    need = required_devices(config)
    inventory = dict(config.cluster.devices or need)
    ids: dict[str, range] = {}
    start = 0
    for hw in sorted(inventory):
        ids[hw] = range(start, start + inventory[hw])
        start += inventory[hw]
    ledger = ResourceManager(pool={hw: r for hw, r in ids.items() if len(r)})
    pools = {p.name: list(ledger.allocate(f"pool:{p.name}", "rollout", p.devices, p.hardware).devices)
             for p in config.rollout.pools}
    if config.pipeline.mode == "sync":
        trainer = [d for devs in pools.values() for d in devs][: config.trainer.devices]
    else:
        trainer = list(ledger.allocate("trainer", "train", config.trainer.devices, config.trainer.hardware).devices)
    hardware = {d: hw for hw, r in ids.items() for d in r}
    return ledger, Placement(pools, trainer, hardware)


def check_cluster_capacity(config: RunConfig, resources: dict[str, float]) -> None:
    """Refuse, before anything starts, a config that asks an existing cluster for more than it has."""
    from rollart.app.config import required_devices

    need = required_devices(config)
    gpus = sum(n for hw, n in need.items() if hw != "CPU")
    if gpus > resources.get("GPU", 0):
        raise ConfigError(f"rollout.pools / trainer.devices: the run needs {gpus} GPUs, the Ray cluster has "
                          f"{int(resources.get('GPU', 0))}")
    for hw, n in sorted(need.items()):
        if hw != "CPU" and n > resources.get(hw, 0):
            raise ConfigError(f"rollout.pools / trainer.hardware: the run needs {n} {hw} devices, the Ray cluster "
                              f"advertises {int(resources.get(hw, 0))} (start nodes with --resources '{{\"{hw}\": N}}')")


def pool_engine_spec(pool: RolloutPool, model: ModelSpec) -> EngineSpec:
    """What one engine of `pool` is: the same for a pool's first workers and their replacements (D51, D71)."""
    return EngineSpec(pool.engine, model, pool.hardware, pool.max_num_seqs, dict(pool.engine_args),
                      pool.tensor_parallel_size, pool.gpu_memory_utilization, pool.dtype)


async def start_pools(config: RunConfig, model: ModelSpec, placement: Placement, runtime: Any | None) -> list[Any]:
    """Every pool's workers in config order (rank order of the proxy): Ray actors or in-process workers."""
    from rollart.app.ray_workers import start_rollout_actors, tp_groups

    workers: list[Any] = []
    for pool in config.rollout.pools:
        spec = pool_engine_spec(pool, model)
        devices = placement.pools[pool.name]
        if runtime is not None and pool.engine != "sim":
            workers += await start_rollout_actors(runtime, pool.name, spec, devices,
                                                  devices_per_worker=pool.tensor_parallel_size)
            continue
        for rank, group in enumerate(tp_groups(devices, pool.tensor_parallel_size)):
            w = InferenceWorker(f"{pool.name}-{rank}", spec.build, hardware=pool.hardware, devices=group)
            await w.start()
            workers.append(w)
    return workers


async def start_trainer(config: RunConfig, model: ModelSpec, placement: Placement, runtime: Any | None,
                        run_dir: Path | None = None) -> Any:
    """The trainer in this process, or data-parallel actors (their world is joined by `connect_world`)."""
    from rollart.app.actors import build_trainer
    from rollart.app.ray_workers import start_trainer_actors

    tc = config.trainer
    if tc.backend == "sim":  # a cost model (design D22): n_params from the model shape, peak from the catalogue
        from rollart.app.plan import check_trainer_fits
        from rollart.app.sim.trainer import ElasticSimTrainer
        from rollart.resource.hardware import BUILTIN_HARDWARE

        check_trainer_fits(config)  # an infeasible trainer is refused before anything runs (D61)
        devices = len(placement.trainer) if config.pipeline.mode == "sync" else tc.devices
        spec = model.sim_spec()
        return LocalTrainer(ElasticSimTrainer(spec.n_params, BUILTIN_HARDWARE[tc.hardware], devices, lr=tc.lr,
                                              active_params=spec.n_active_params,
                                              forward_passes=len(tc.forward_passes)))
    if tc.placement == "driver":
        from rollart.app.actors import release_megatron_parallel_state

        return LocalTrainer(build_trainer(model, tc.backend, trainer_config(config)),
                            on_close=release_megatron_parallel_state if tc.backend == "megatron" else None)
    async def spawn() -> list[Any]:
        handles = await start_trainer_actors(runtime, model, tc.backend, trainer_config(config), tc.hardware,
                                             placement.trainer)
        if config.sync.channel == "local":  # no world to join: each replica builds its trainer alone
            await asyncio.gather(*(runtime.call(h, "start_local", (), {}) for h in handles))
        return handles

    hint = f"resume from the last checkpoint with: rollart run CONFIG --run-dir {run_dir}" if run_dir else ""
    rebuild, why_not = None, ""
    if config.sync.channel in ("local", "torch_dist"):  # rebuilt from the last checkpoint within trainer.restarts
        checkpoints = Checkpointer(run_dir / "checkpoints") if run_dir is not None else None  # (D75; torch_dist: D82)
        rebuild = TrainerRebuild(spawn, lambda: checkpoints.latest() if checkpoints is not None else None,
                                 budget=tc.restarts)
    else:
        why_not = (f"sync.channel {config.sync.channel}: the store's versions live in the dead publisher's memory; "
                   "use local or torch_dist for automatic rebuilds")
    return ActorTrainerGroup(runtime, await spawn(), timeout_s=config.pipeline.update_timeout_s * 10, resume_hint=hint,
                             rebuild=rebuild, no_rebuild_reason=why_not)


async def world_backend(trainer: ActorTrainerGroup, rollout: list[Any]) -> str:
    """nccl when every member of the world placed its model on CUDA, gloo when every one is on CPU; a mixed
    world is refused with the ranks on each kind (rollart-resource D36, app D72)."""
    from rollart.resource.accelerators import collective_backend

    kinds = await asyncio.gather(*(trainer.call(r, "device_kind") for r in range(len(trainer.handles))),
                                 *(w.call("device_kind") for w in rollout))
    return collective_backend(list(kinds))


async def start_channel_services(config: RunConfig) -> tuple[Any, list[Any]]:
    """The channel's services (Mooncake's metadata server and master), started once per run; (spec, closers)."""
    if config.sync.channel != "mooncake":
        return None, []
    from rollart.sync.mooncake import mooncake_unavailable_reason
    from rollart.sync.mooncake_services import MooncakeServices

    reason = mooncake_unavailable_reason()
    if reason is not None:
        raise ConfigError(f"sync.channel: 'mooncake' is unavailable here: {reason}")
    services = MooncakeServices()
    mooncake = await services.start()
    return mooncake, [services.stop]


async def join_world(config: RunConfig, trainer: ActorTrainerGroup, rollout: list[Any], mooncake: Any = None) -> None:
    """Join trainer replicas and rollout actors in one torch.distributed world and open the channel.

    Ranks: trainer replicas first (rank 0 publishes), then every rollout actor; groups:
    data-parallel (trainer ranks) and update (rank 0 + rollout). Called again, after every member
    left, to re-form the world around a replaced rollout actor (D81).
    """
    from rollart.app.actors import WorldSpec

    n_train = len(trainer.handles)
    init = await trainer.call(0, "rendezvous")
    backend = await world_backend(trainer, rollout)
    world = WorldSpec(init_method=init, world_size=n_train + len(rollout), trainer_ranks=tuple(range(n_train)),
                      rollout_ranks=tuple(range(n_train, n_train + len(rollout))), backend=backend,
                      channel=config.sync.channel, keep_last=config.sync.keep_last,
                      bucket_bytes=int(config.sync.bucket_mb * (1 << 20)), mooncake=mooncake,
                      timeout_s=config.pipeline.update_timeout_s * 2, megatron=config.trainer.backend == "megatron",
                      checksums=config.sync.checksums)
    await asyncio.gather(*(trainer.call(r, "join", world, r) for r in range(n_train)),
                         *(w.call("join", world, n_train + i) for i, w in enumerate(rollout)))


async def join_store(config: RunConfig, rollout: list[Any], mooncake: Any) -> None:
    """Connect late rollout actors to the Mooncake store (a replacement, D81): no collective to re-form."""
    from rollart.app.actors import WorldSpec

    world = WorldSpec(init_method="", world_size=0, trainer_ranks=(), rollout_ranks=(), channel="mooncake",
                      keep_last=config.sync.keep_last, bucket_bytes=int(config.sync.bucket_mb * (1 << 20)),
                      mooncake=mooncake, timeout_s=config.pipeline.update_timeout_s * 2, store_only=True)
    await asyncio.gather(*(w.call("join", world, -1) for w in rollout))


async def connect_world(config: RunConfig, trainer: ActorTrainerGroup, rollout: list[Any]) -> list[Any]:
    """Start the channel's services and join the world (`join_world`); returns the closers."""
    mooncake, closers = await start_channel_services(config)
    try:
        await join_world(config, trainer, rollout, mooncake)
    except BaseException:
        await _abandon(closers)
        raise
    return closers


class _SystemPrompt:
    """A prompt builder whose first prompt uses the task's system prompt instead of the env's."""

    def __init__(self, inner: Any, system_prompt: str) -> None:
        self.inner, self.system_prompt = inner, system_prompt

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        return self.inner.initial_ids(self.system_prompt, observation)

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        return self.inner.continuation_ids(previous_response_ids, observation)

    def decode(self, token_ids: list[int]) -> str:
        return self.inner.decode(token_ids)


def with_system_prompt(builder: Any, system_prompt: str) -> Any:
    """`builder`, or a wrapper that renders `tasks[i].system_prompt` when the task sets one."""
    return _SystemPrompt(builder, system_prompt) if system_prompt else builder


def build_envs(config: RunConfig, parts: list[TaskParts], proxy: LLMProxy, sinks: list[Any],
               routing_log: RoutingLog | None = None,
               recorder: RunRecorder | None = None) -> tuple[list[list[EnvManager]], list[str]]:
    """Group slots of EnvManagers (one env each), each slot one task, its managers tagged for routing."""
    pcfg = config.pipeline
    keys = task_keys(config)
    slots, names = [], []
    reports: dict[int, ErrorReport] = {}
    for i, index in enumerate(slot_tasks(config)):
        task: TaskSection = config.tasks[index]
        tp = parts[index]
        llm_timeout = task.llm_timeout_s or pcfg.get_batch_timeout_s
        ecfg = EnvManagerConfig(max_turns=task.max_turns, max_tokens_per_turn=task.max_tokens,
                                max_total_tokens=task.max_total_tokens, max_context_tokens=task.max_context_tokens,
                                sampling=SamplingParams(temperature=task.temperature),
                                reset_policy=RetryPolicy(timeout_s=task.env_timeout_s),
                                step_policy=RetryPolicy(timeout_s=task.env_timeout_s),
                                llm_policy=RetryPolicy(timeout_s=llm_timeout), seed=config.run.seed + i)
        wrap = tp.llm_wrapper or (lambda client: client)
        report = reports.setdefault(index, ErrorReport(label=keys[index]))  # one per task (env D29)
        slots.append([EnvManager(tp.env_factory, wrap(ProxyLLMClient(proxy, timeout_s=llm_timeout,
                                                     on_response=routing_log.record if routing_log else None,
                                                     on_served=recorder.served if recorder else None)),
                                 with_system_prompt(tp.prompts_factory(), task.system_prompt), sinks[index], ecfg,
                                 name=f"{keys[index]}-{i}-{j}", tag=task.tag, errors=report)
                      for j in range(pcfg.group_size)])
        names.append(keys[index])
    return slots, names


RECORDED_PROXY_EVENTS = {"worker_failed": "actor_died", "worker_restarted": "actor_replaced",
                         "worker_replaced": "actor_replaced", "worker_removed": "actor_removed",
                         "replacement_failed": "replacement_failed", "health_check_failed": "health_check_failed"}


class RolloutRecovery:
    """Replaces dead rollout workers and watches for a lost pool (design D51).

    The proxy restarts a dead worker in its placement group, then, past its restart budget, calls
    `replace(rank)`: a new worker of the same pool on a free device of the pool's hardware (the dead
    one's device is released first, so it is a candidate). Proxy events become run events; a pool
    whose every worker is gone while a replacement just failed ends the run with one line.
    """

    def __init__(self, config: RunConfig, model: ModelSpec, placement: Placement, ledger: Any, runtime: Any | None,
                 run_dir: Path) -> None:
        """The ranks follow `start_pools`: pools in config order, a worker per tensor-parallel group."""
        self.config, self.model, self.ledger, self.runtime, self.run_dir = config, model, ledger, runtime, run_dir
        self.ranks = [(pool, i) for pool in config.rollout.pools
                      for i in range(len(placement.pools[pool.name]) // pool.tensor_parallel_size)]
        self.proxy: LLMProxy | None = None
        self.recorder: RunRecorder | None = None
        self.routing_log: RoutingLog | None = None
        self.pipeline: Pipeline | None = None
        self._count = 0

    def _devices(self, pool: Any, old: tuple[int, ...]) -> tuple[int, ...]:
        owner = f"pool:{pool.name}"
        try:
            self.ledger.release(owner, list(old))
        except Exception:  # noqa: BLE001 - already released by an earlier attempt
            log.debug("releasing %s of %s failed", old, owner, exc_info=True)
        return tuple(self.ledger.allocate(owner, "rollout", pool.tensor_parallel_size, pool.hardware).devices)

    async def replace(self, rank: int) -> Any:
        """A new worker for `rank` (the proxy's `worker_factory`)."""
        from rollart.app.ray_workers import start_rollout_actor

        pool, index = self.ranks[rank]
        assert self.proxy is not None
        devices = self._devices(pool, tuple(self.proxy.slots[rank].devices))
        self._count += 1
        worker_id = f"{pool.name}-{index}.r{self._count}"
        spec = pool_engine_spec(pool, self.model)
        if self.runtime is not None and pool.engine != "sim":
            worker = await start_rollout_actor(self.runtime, pool.name, spec, index, pool.engines, devices,
                                               worker_id=worker_id)
        else:
            worker = InferenceWorker(worker_id, spec.build, hardware=pool.hardware, devices=devices)
            await worker.start()
        if self.routing_log is not None:
            self.routing_log.hardware_of[worker_id] = pool.hardware
        return worker

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        """The proxy's event hook: failures and replacements go to events.jsonl; a lost pool fails the run."""
        recorded = RECORDED_PROXY_EVENTS.get(kind)
        if recorded is None or self.recorder is None:
            return
        pool = self.ranks[data["rank"]][0].name if "rank" in data and data["rank"] < len(self.ranks) else None
        how = {"worker_restarted": "restarted on its device", "worker_replaced": "new actor"}.get(kind)
        self.recorder.events.record(recorded, iteration=self.recorder.iteration, pool=pool,
                                    **({"how": how} if how else {}), **data)
        if kind == "replacement_failed" and pool is not None and self.proxy is not None:
            ranks = [r for r, (p, _) in enumerate(self.ranks) if p.name == pool]
            if not any(self.proxy.slots[r].state == "active" for r in ranks):
                line = (f"rollout pool {pool!r} ({data.get('hardware')}) lost every worker and could not start one: "
                        f"{data.get('error')}; resume with: rollart run CONFIG --run-dir {self.run_dir}")
                self.recorder.events.record("pool_lost", iteration=self.recorder.iteration, pool=pool,
                                            cause=data.get("error"))
                if self.pipeline is not None:
                    self.pipeline.fail(RunFailed(line))


def serving(proxy: LLMProxy) -> list[Any]:
    """The proxy's live workers now (a replaced worker's new handle, not the dead one's)."""
    return [s.handle for s in proxy.slots if s.state == "active"]


async def collect_engine_stats(workers: list[Any]) -> dict[str, float]:
    """The rollout engines' cumulative counters (rollart-proxy `TorchEngine.stats`), summed over workers.

    Engines without counters (vLLM, SimEngine) add nothing; the metrics then read zero."""
    total: dict[str, float] = {}
    for w in workers:
        if isinstance(w, InferenceWorker):
            stats = getattr(w.engine, "stats", None)
            snap = dataclasses.asdict(stats()) if callable(stats) else {}  # SimEngine's `stats` is a plain dict
        else:
            try:
                snap = await w.engine_stats() if hasattr(w, "engine_stats") else {}
            except WorkerFailedError:  # died since the proxy last looked: its counters start over (D51)
                snap = {}
        for key, value in snap.items():
            total[key] = total.get(key, 0.0) + value
    return total


def reward_stats(parts: list[TaskParts], run_dir: Path) -> Any:
    """The summed stats of the run's reward-service clients (scheduler D53), their outages in events.jsonl; None without one."""
    from rollart.scheduler.records import EventLog

    clients = [tp.reward_client for tp in parts if tp.reward_client is not None]
    if not clients:
        return None
    events = EventLog(run_dir)
    for client in clients:
        client.on_event = lambda kind, detail: events.record(kind, **detail)

    def total() -> dict[str, Any]:
        snaps = [c.stats.snapshot() for c in clients]
        return {"retries": sum(s["retries"] for s in snaps), "outage_s": sum(s["outage_s"] for s in snaps)}
    return total


async def _abandon(closers: list[Any]) -> None:
    """Run every closer of a half-built pipeline, each one whatever the others did."""
    for close in closers:
        try:
            result = close()
            if inspect.isawaitable(result):
                await result
        except Exception:  # noqa: BLE001 - the build's own error is the one to report
            log.warning("closing a half-built pipeline: %r failed", close, exc_info=True)


async def build_pipeline(config: RunConfig, run_dir: Path, workers: list[Any] | None = None,
                         tensorboard: bool | None = None, base_dir: Path | None = None,
                         records: RecordLedger | None = None) -> Pipeline:
    """Wire every part for `config`; `workers` (WorkerHandles) replace the configured pools if given.

    `records` is the buffer's ledger (rollart-scheduler D55): given, each closed trajectory record goes there and
    the buffer forgets it, so a long run's memory follows its backlog (`rollart sim` passes one).

    Nothing is started before every name is resolved (tasks, rewards, engines), so a bad config
    fails with a ConfigError naming the field before any actor exists.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model = ModelSpec.from_config(config)
    tokenizer = model.tokenizer()
    parts = [build_task(t, i, config, tokenizer, base_dir) for i, t in enumerate(config.tasks)]
    closers: list[Any] = []
    for tp in parts:
        closers += tp.closers
    runtime = None
    if config.cluster.uses_ray:
        import ray

        from rollart.resource.runtime import RayRuntime

        check_cluster_capacity(config, ray.cluster_resources())
        runtime = RayRuntime()
    ledger, placement = place(config)
    closers.append(ledger.close)
    trainer = None
    configured_pools = workers is None
    try:
        if workers is None:
            workers = await start_pools(config, model, placement, runtime)
        trainer = await start_trainer(config, model, placement, runtime, run_dir)
    except BaseException:
        for w in workers or []:
            await w.stop()
        raise
    # a replacement takes its weights from the proxy (D51), or, in a channel's world, joins it at an update (D81)
    recovery = RolloutRecovery(config, model, placement, ledger, runtime, run_dir) if configured_pools else None
    in_world = config.sync.channel in ("torch_dist", "mooncake")  # its members are replaced at an update (D81)
    proxy = LLMProxy(workers, router=make_router(config.routing.policy, config.routing.affinity),
                     max_inflight_per_worker=config.time_sharing.slots_per_device,
                     worker_factory=recovery.replace if recovery and not in_world else None,
                     on_event=recovery.on_event if recovery else None,
                     **{**config.rollout.recovery.proxy_kwargs(), **({"max_restarts": 0} if in_world else {})})
    if recovery is not None:
        recovery.proxy = proxy
    try:
        if config.sync.channel == "local":
            updater: Any = LocalUpdater(ModelUpdateGroup(LocalChannel(), [ProxyWeightLoader(proxy)],
                                                         timeout=config.pipeline.update_timeout_s))
        elif config.sync.channel == "sim":  # bytes / the trainer NIC + per-bucket latency (design D22)
            from rollart.resource.hardware import BUILTIN_HARDWARE
            from rollart.sync.sim import SimChannel

            weight_bytes = trainer.inner.weight_bytes
            channel = SimChannel(weight_bytes, BUILTIN_HARDWARE[config.trainer.hardware].network_gbps,
                                 bucket_bytes=int(config.sync.bucket_mb * (1 << 20)), keep_last=config.sync.keep_last)
            updater = LocalUpdater(ModelUpdateGroup(channel, [ProxyWeightLoader(proxy)],
                                                    timeout=config.pipeline.update_timeout_s), nbytes=weight_bytes)
        else:
            mooncake, services = await start_channel_services(config)
            closers += services
            await join_world(config, trainer, workers, mooncake)

            async def rejoin(members: list[Any], new: list[Any]) -> None:  # around a replaced actor (D81)
                if config.sync.channel == "mooncake":  # a store: only the new actors connect
                    await join_store(config, new, mooncake)
                else:
                    await join_world(config, trainer, members, mooncake)

            updater = ChannelUpdater(trainer, workers, proxy, config.sync.channel, rejoin=rejoin,
                                     spawn=recovery.replace if recovery is not None else None,
                                     on_event=recovery.on_event if recovery is not None else None)
            if getattr(trainer, "rebuild", None) is not None and config.sync.channel == "torch_dist":
                trainer.rebuild.rejoin = updater.reform  # a rebuilt group joins a re-formed world (D82)
        pcfg = config.pipeline
        keys = task_keys(config)
        balanced = sorted(set(keys)) if pcfg.balance_tasks and len(set(keys)) > 1 else []
        buffer = SampleBuffer.from_config(config, tasks=balanced, ledger=records)
        # a service reward has its own deadline; the sink's is a little longer so the client's error names it
        sinks = [ScoringSink(buffer, tp.scorer, deadline_s=getattr(t.reward, "deadline_s", 55.0) + 5.0)
                 for t, tp in zip(config.tasks, parts)]
        routing_log = RoutingLog({w.worker_id: w.hardware for w in workers})
        recorder = RunRecorder(run_dir, hardware_of=lambda wid: routing_log.hardware_of.get(wid, "?"))
        if recovery is not None:
            recovery.recorder, recovery.routing_log = recorder, routing_log
        if getattr(trainer, "rebuild", None) is not None:  # trainer_rebuilt in events.jsonl (D75)
            trainer.rebuild.on_event = lambda kind, **detail: recorder.events.record(kind, recorder.iteration, **detail)
        slots, names = build_envs(config, parts, proxy, sinks, routing_log, recorder)
        rollout = RolloutScheduler(slots, names, buffer, proxy, carry_over=pcfg.mode != "one_off", seed=config.run.seed,
                                   lockstep=pcfg.env_interaction == "batch", once_per_launch=pcfg.mode == "sync")
        rollout_devices = [d for w in workers for d in w.devices]
        train_devices = list(placement.trainer)
        loop = asyncio.get_running_loop()
        timeline = RoleTimeline(run_dir / "timeline.jsonl", sorted(set(rollout_devices) | set(train_devices)), clock=loop.time)
        controller = None
        if pcfg.mode == "time_sharing":
            ts = config.time_sharing
            from rollart.app.plan import required_lend

            need = required_lend(config)  # the trainer alone cannot hold the model: every step borrows these (D69)
            policy = (CostAwarePolicy(min_keep=ts.min_keep, margin=ts.margin, prior_switch_cost_s=ts.prior_switch_cost_s,
                                      min_lend=need)
                      if ts.policy == "cost_aware" else AlwaysShrinkPolicy(lend=ts.lend, min_lend=need))
            on_role = timeline.set_role
            elastic = getattr(getattr(trainer, "inner", None), "on_role", None)
            if elastic is not None:  # a simulated trainer trains on the devices lent to it

                def on_role(devices: list[int], role: str) -> None:
                    timeline.set_role(devices, role)
                    elastic(devices, role)
            controller = TimeSharingController(ProxyElasticPool(proxy, ledger=ledger if runtime is not None else None), policy,
                                               train_devices=config.trainer.devices, slots_per_device=ts.slots_per_device,
                                               on_role=on_role)
        use_tb = config.run.tensorboard if tensorboard is None else tensorboard
        pipeline_parts = PipelineParts(buffer=buffer, rollout=rollout, trainer=trainer, updater=updater,
                                       rollout_devices=rollout_devices, train_devices=train_devices, controller=controller,
                                       timeline=timeline, metrics=MetricsWriter(run_dir, tensorboard=use_tb),
                                       checkpointer=Checkpointer(run_dir / "checkpoints"),
                                       pad_token_id=model.pad_token_id(tokenizer),
                                       closers=[*(s.aclose for s in sinks), proxy.close, trainer.close, *closers],
                                       proxy=proxy, workers=list(workers), placement=placement, routing_log=routing_log,
                                       engine_stats=lambda: collect_engine_stats(serving(proxy)), recorder=recorder,
                                       reward_stats=reward_stats(parts, run_dir))
    except BaseException:
        # nothing lost on failure: a part that fails to build (a user env that breaks its protocol, a world
        # that cannot form) must not leave actors, placement groups or services behind for the next run
        await _abandon([proxy.close, trainer.close, *closers])
        raise
    pipeline = Pipeline(config, pipeline_parts)
    if recovery is not None:
        recovery.pipeline = pipeline
    return pipeline
