"""Build a whole pipeline from a RunConfig: tiny model, rollout workers, proxy, sync, trainer, envs.

Why one builder: `rollart run`, the demo, the tests and the benchmark must run the same wiring;
the examples in `examples/` show the same composition written out by hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path
from typing import Any

from rollart.env.envs.frozen_lake import FrozenLakeEnv
from rollart.env.envs.math_calc import MathCalcEnv
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.protocols import SamplingParams
from rollart.env.retry import RetryPolicy
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.worker import InferenceWorker
from rollart.scheduler.adapters import ProxyElasticPool, ProxyLLMClient, ProxyWeightLoader, RewardingSink
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.checkpoint import Checkpointer
from rollart.scheduler.config import RunConfig, TaskSection
from rollart.scheduler.metrics import MetricsWriter, RoleTimeline
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.scheduler.rollout import RolloutScheduler
from rollart.scheduler.tasks import (
    FROZEN_LAKE_MAP,
    TASK_REWARDS,
    VOCAB,
    FrozenLakePrompts,
    MathToolPrompts,
    build_demo_tokenizer,
)
from rollart.scheduler.timesharing import AlwaysShrinkPolicy, CostAwarePolicy, TimeSharingController
from rollart.sync.local import LocalChannel
from rollart.sync.model_update import ModelUpdateGroup
from rollart.train.losses import LossConfig
from rollart.train.models import build_causal_lm, tiny_llama_config
from rollart.train.torch_trainer import TorchTrainer, TrainerConfig


def model_config(config: RunConfig) -> Any:
    """The tiny Llama over the demo vocabulary."""
    m = config.model
    return tiny_llama_config(vocab_size=len(VOCAB), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                             num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                             num_key_value_heads=m.num_heads, max_position_embeddings=m.max_positions)


def _env_factory(task: TaskSection):
    if task.env == "frozenlake":
        return lambda: FrozenLakeEnv(desc=list(FROZEN_LAKE_MAP), is_slippery=False, max_episode_steps=task.max_turns)
    return lambda: MathCalcEnv(source="generated", max_tool_calls=2)


def _prompts(task: TaskSection, tokenizer: Any) -> Any:
    return FrozenLakePrompts(tokenizer) if task.env == "frozenlake" else MathToolPrompts(tokenizer)


def slot_tasks(config: RunConfig) -> list[TaskSection]:
    """Assign each group slot a task, proportionally to the task weights (largest remainder)."""
    p = config.pipeline
    n_slots = math.ceil(p.batch_size // p.group_size * p.redundancy)
    total = sum(t.weight for t in config.tasks)
    out: list[TaskSection] = []
    for i in range(n_slots):
        # pick the task whose share is most behind
        deficits = [t.weight / total * (i + 1) - sum(1 for x in out if x is t) for t in config.tasks]
        out.append(config.tasks[deficits.index(max(deficits))])
    return out


async def start_local_workers(config: RunConfig, mcfg: Any) -> list[InferenceWorker]:
    """In-process rollout workers, one TorchEngine per logical device."""
    seed = config.run.seed
    slots = config.time_sharing.slots_per_device
    workers = []
    for i in range(config.cluster.rollout_devices):
        w = InferenceWorker(f"rollout-{i}", lambda: TorchEngine(build_causal_lm(mcfg, seed=seed), max_num_seqs=slots),
                            hardware="CPU", devices=(i,))
        await w.start()
        workers.append(w)
    return workers


async def collect_engine_stats(workers: list[Any]) -> dict[str, float]:
    """The rollout engines' cumulative counters (rollart-proxy `TorchEngine.stats`), summed over workers."""
    total: dict[str, float] = {}
    for w in workers:
        if isinstance(w, InferenceWorker):
            stats = getattr(w.engine, "stats", None)
            snap = dataclasses.asdict(stats()) if stats is not None else {}
        else:
            snap = await w.engine_stats() if hasattr(w, "engine_stats") else {}
        for key, value in snap.items():
            total[key] = total.get(key, 0.0) + value
    return total


async def _ray_workers_with_ledger(config: RunConfig, mcfg: Any) -> tuple[Any, list[Any]]:
    """Rollout workers as Ray actors on devices taken from a rollart.resource ledger (Ray must be up)."""
    from rollart.resource.manager import ResourceManager
    from rollart.scheduler.ray_workers import start_ray_workers

    c = config.cluster
    ledger = ResourceManager(pool={c.hardware: range(c.rollout_devices + c.train_devices)})
    devices = list(ledger.allocate("rollout", "rollout", c.rollout_devices, c.hardware).devices)
    workers = await start_ray_workers(mcfg, config.run.seed, devices, c.hardware, config.time_sharing.slots_per_device)
    return ledger, workers


async def build_pipeline(config: RunConfig, run_dir: Path, workers: list[Any] | None = None,
                         tensorboard: bool | None = None) -> Pipeline:
    """Wire every part for `config`; `workers` (WorkerHandles, e.g. Ray actors) default to in-process ones."""
    mcfg = model_config(config)
    tok = build_demo_tokenizer()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seed = config.run.seed
    ledger = None
    closers: list[Any] = []
    if workers is None and config.cluster.use_ray:
        ledger, workers = await _ray_workers_with_ledger(config, mcfg)
        closers.append(ledger.close)
    elif workers is None:
        workers = await start_local_workers(config, mcfg)
    proxy = LLMProxy(workers, max_inflight_per_worker=config.time_sharing.slots_per_device)
    tc = config.trainer
    trainer = TorchTrainer(build_causal_lm(mcfg, seed=seed), TrainerConfig(
        lr=tc.lr, micro_batch_size=tc.micro_batch_size, max_grad_norm=tc.max_grad_norm,
        loss=LossConfig(clip_eps_low=tc.clip_eps, clip_eps_high=tc.clip_eps, entropy_coef=tc.entropy_coef)))
    updater = ModelUpdateGroup(LocalChannel(), [ProxyWeightLoader(proxy)], timeout=config.pipeline.update_timeout_s)
    pcfg = config.pipeline
    tasks = slot_tasks(config)
    balanced = sorted({t.env for t in tasks}) if pcfg.balance_tasks else []
    buffer = SampleBuffer(alpha=pcfg.alpha, group_size=pcfg.group_size, tasks=balanced)
    pipeline_ref: list[Pipeline] = []

    def on_put(traj: Any) -> None:
        if pipeline_ref:
            pipeline_ref[0].on_trajectory(traj)

    slots = []
    for i, task in enumerate(tasks):
        sink = RewardingSink(buffer, TASK_REWARDS[task.env], on_put=on_put)
        ecfg = EnvManagerConfig(max_turns=task.max_turns, max_tokens_per_turn=task.max_tokens,
                                sampling=SamplingParams(temperature=task.temperature),
                                llm_policy=RetryPolicy(timeout_s=pcfg.get_batch_timeout_s), seed=seed + i)
        slots.append([EnvManager(_env_factory(task), ProxyLLMClient(proxy, timeout_s=pcfg.get_batch_timeout_s),
                                 _prompts(task, tok), sink, ecfg, name=f"{task.env}-{i}-{j}", tag="default")
                      for j in range(pcfg.group_size)])
    rollout = RolloutScheduler(slots, [t.env for t in tasks], buffer, proxy, carry_over=pcfg.mode != "one_off", seed=seed)
    rollout_devices = [d for w in workers for d in w.devices]
    colocated = pcfg.mode == "sync"
    first_train = max(rollout_devices) + 1
    train_devices = list(range(first_train, first_train + config.cluster.train_devices))
    if ledger is not None:
        train_devices = list(ledger.allocate("trainer", "train", config.cluster.train_devices, config.cluster.hardware).devices)
    if colocated:
        train_devices = list(rollout_devices)
    loop = asyncio.get_running_loop()
    timeline = RoleTimeline(run_dir / "timeline.jsonl", sorted(set(rollout_devices) | set(train_devices)), clock=loop.time)
    controller = None
    if pcfg.mode == "time_sharing":
        ts = config.time_sharing
        policy = (CostAwarePolicy(min_keep=ts.min_keep, margin=ts.margin, prior_switch_cost_s=ts.prior_switch_cost_s)
                  if ts.policy == "cost_aware" else AlwaysShrinkPolicy(lend=ts.lend))
        controller = TimeSharingController(ProxyElasticPool(proxy, ledger=ledger), policy, train_devices=config.cluster.train_devices,
                                           slots_per_device=ts.slots_per_device, on_role=timeline.set_role)
    use_tb = config.run.tensorboard if tensorboard is None else tensorboard
    parts = PipelineParts(buffer=buffer, rollout=rollout, trainer=trainer, updater=updater,
                          rollout_devices=rollout_devices, train_devices=train_devices, controller=controller,
                          timeline=timeline, metrics=MetricsWriter(run_dir, tensorboard=use_tb),
                          checkpointer=Checkpointer(run_dir / "checkpoints"), pad_token_id=0,
                          closers=[proxy.close, *closers], engine_stats=lambda: collect_engine_stats(workers))
    pipeline = Pipeline(config, parts)
    pipeline_ref.append(pipeline)
    return pipeline
