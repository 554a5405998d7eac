"""The training loop in one of four modes on one config switch (design D5).

Every mode runs the cycle get_batch -> train_step -> suspend -> model_update -> resume (the issue's
get_batch -> suspend -> model_update -> resume -> train_step, with the update moved to right after
the step that produced the weights, design D12):

    sync          rollout paused and the redundant rest aborted while training (colocated, serial)
    one_off       rollout keeps generating with the old weights during training; resume aborts all in flight
    async         rollout keeps generating during training; resume aborts only out-of-bound trajectories
    time_sharing  async, with train_step wrapped in shrink -> train -> expand by the TimeSharingController
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rollart import checks as check
from rollart.env.trajectory import Trajectory
from rollart.scheduler.adapters import trajectories_to_samples
from rollart.scheduler.buffer import ABORTED, SampleBuffer, oldest_version
from rollart.scheduler.checkpoint import Checkpointer, config_identity
from rollart.scheduler.errors import ConfigError, SchedulerError
from rollart.scheduler.metrics import MetricsWriter, RoleTimeline, engine_metrics
from rollart.scheduler.progress import progress_line, status_text
from rollart.scheduler.rollout import RolloutScheduler
from rollart.scheduler.settings import PipelineConfig
from rollart.scheduler.timesharing import SwitchRecord, TimeSharingController
from rollart.train.batch import build_train_batch

if TYPE_CHECKING:
    from rich.console import Console

_log = logging.getLogger(__name__)


def _response_tokens(traj: Any) -> int:
    """A trajectory's response tokens (0 for an object that does not count them)."""
    count = getattr(traj, "num_response_tokens", None)
    return count() if count is not None else 0


class ModelUpdater(Protocol):
    """Moves the trainer's new version to the rollout side (rollart.app.trainers)."""

    async def model_update(self, trainer: Any, version: int, timeout: float) -> dict[str, float]:
        """Publish the weights of `version` from `trainer` and load them on every active rollout worker.

        Called by `Pipeline` once per new version: after the train step that produced it, while the
        rollout is suspended (it resumes right after), and from `Pipeline.restore` with the
        checkpoint's version. When it returns, the workers serve `version`. `trainer` is the
        pipeline's `Trainer`; `timeout` is `pipeline.update_timeout_s`, the bound of the whole
        update. Returns at least `sync_s` (seconds) and `sync_bytes`, recorded in the metrics. An
        exception fails the iteration (it propagates out of `Pipeline.step`).
        """
        ...


class Trainer(Protocol):
    """The trainer as the pipeline drives it: in this process or as data-parallel actors.

    Every method is awaited on the pipeline's event loop, which keeps serving the rollout meanwhile
    (except in `sync` mode), so the work runs in a thread or in remote actors, never on the loop.
    """

    @property
    def version(self) -> int:
        """Optimizer steps taken: the weight version the next update publishes (0 before any step).

        Read before and after every `train_step` and after `load_checkpoint`; it grows by one per
        step. The buffer's staleness bound and the updater's version follow it.
        """
        ...

    async def train_step(self, batch: Any) -> dict[str, float]:
        """One optimizer step on `batch`, a `rollart.train.TrainBatch` with GRPO advantages; returns metrics.

        Called once per iteration by `Pipeline.step` (inside shrink/expand in `time_sharing` mode,
        under `get_batch_timeout_s` there). On return `version` has grown by one. The metrics
        should hold `loss` (the iteration records NaN without it). An exception fails the iteration.
        """
        ...

    async def save_checkpoint(self, path: str) -> None:
        """Write what resuming needs (weights, optimizer state, version) into the directory `path`.

        Called by `Pipeline.save` every `run.checkpoint_every` iterations, between two iterations,
        with `path` inside a fresh temporary checkpoint directory; the checkpoint becomes visible (its
        manifest written, renamed into place) only after this returns, so a crash midway leaves none.
        """
        ...

    async def load_checkpoint(self, path: str) -> None:
        """Restore what `save_checkpoint` wrote into `path`, `version` included.

        Called by `Pipeline.restore` before the first iteration; the pipeline then pushes these
        weights to the rollout side (`ModelUpdater.model_update` with the restored version).
        """
        ...

    async def close(self) -> None:
        """Release what the trainer holds (threads, process groups, actors); nothing is called after it.

        `rollart.app`'s builder registers it in `PipelineParts.closers`, so `Pipeline.close` calls it
        once at the end of a run (and the builder calls it when building fails).
        """
        ...


@dataclass
class PipelineParts:
    """Everything the loop drives, built by `rollart.app.builder` or by hand in an example."""

    buffer: SampleBuffer
    rollout: RolloutScheduler
    trainer: Trainer
    updater: ModelUpdater
    rollout_devices: list[int]
    train_devices: list[int]
    controller: TimeSharingController | None = None
    timeline: RoleTimeline | None = None
    metrics: MetricsWriter | None = None
    checkpointer: Checkpointer | None = None
    pad_token_id: int = 0
    closers: list[Callable[[], Any]] = field(default_factory=list)
    proxy: Any = None  # the LLMProxy (inspection: routing, versions)
    workers: list[Any] = field(default_factory=list)  # rollout WorkerHandles in proxy rank order
    placement: Any = None  # builder.Placement: ledger devices of each pool and the trainer
    routing_log: Any = None  # adapters.RoutingLog: requests per tag and hardware
    engine_stats: Callable[[], Awaitable[dict[str, float]]] | None = None  # summed engine counters


class Pipeline:
    """The training loop in one of four modes (D5) over protocol-typed parts."""

    def __init__(self, config: PipelineConfig, parts: PipelineParts) -> None:
        """Bind the config's pipeline section to the parts; call `restore()` to resume a run.

        The buffer must enforce the config's bound and group size (build it with
        `SampleBuffer.from_config(config)`); the pipeline observes every trajectory put into it,
        so tokens/s needs no hook from whoever built the parts.
        """
        # AST: AST_PRECONDITION(parts.buffer.alpha == config.pipeline.alpha, got=(parts.buffer.alpha, config.pipeline.alpha), msg="SampleBuffer alpha equals config.pipeline.alpha (build it with SampleBuffer.from_config(config))", exc=ConfigError)
        check.precondition(parts.buffer.alpha == config.pipeline.alpha, "SampleBuffer alpha equals config.pipeline.alpha (build it with SampleBuffer.from_config(config))", got=(parts.buffer.alpha, config.pipeline.alpha), exc=ConfigError)  # generated #043fc0307e
        # AST: AST_PRECONDITION(parts.buffer.group_size == config.pipeline.group_size, got=(parts.buffer.group_size, config.pipeline.group_size), msg="SampleBuffer group_size equals config.pipeline.group_size (build it with SampleBuffer.from_config(config))", exc=ConfigError)
        check.precondition(parts.buffer.group_size == config.pipeline.group_size, "SampleBuffer group_size equals config.pipeline.group_size (build it with SampleBuffer.from_config(config))", got=(parts.buffer.group_size, config.pipeline.group_size), exc=ConfigError)  # generated #9c52c714f6
        # AST: AST_PRECONDITION(config.pipeline.batch_size % config.pipeline.group_size == 0, got=(config.pipeline.batch_size, config.pipeline.group_size), msg="batch_size is a multiple of group_size (a batch holds whole groups)", exc=ConfigError)
        check.precondition(config.pipeline.batch_size % config.pipeline.group_size == 0, "batch_size is a multiple of group_size (a batch holds whole groups)", got=(config.pipeline.batch_size, config.pipeline.group_size), exc=ConfigError)  # generated #dbc32c7adb
        # AST: AST_PRECONDITION(parts.rollout is None or parts.rollout.buffer is parts.buffer, msg="the RolloutScheduler fills the pipeline's own SampleBuffer", exc=ConfigError)
        check.precondition(parts.rollout is None or parts.rollout.buffer is parts.buffer, "the RolloutScheduler fills the pipeline's own SampleBuffer", exc=ConfigError)  # generated #bdffbb1677
        # AST: AST_PRECONDITION(parts.rollout is None or not (parts.rollout.once_per_launch or parts.rollout.lockstep) or len(parts.rollout.slots) * config.pipeline.group_size >= config.pipeline.batch_size, got={"slots": len(parts.rollout.slots), "group_size": config.pipeline.group_size, "batch_size": config.pipeline.batch_size}, msg="a launch of every slot yields a batch (slots x group_size >= batch_size)", exc=ConfigError)
        check.precondition(parts.rollout is None or not (parts.rollout.once_per_launch or parts.rollout.lockstep) or len(parts.rollout.slots) * config.pipeline.group_size >= config.pipeline.batch_size, "a launch of every slot yields a batch (slots x group_size >= batch_size)", got_lazy=lambda: {"slots": len(parts.rollout.slots), "group_size": config.pipeline.group_size, "batch_size": config.pipeline.batch_size}, exc=ConfigError)  # generated #a3aedba732
        self.config = config
        self.cfg = config.pipeline
        self.parts = parts
        self.iteration = 0
        self._published = parts.trainer.version
        self._tokens = 0
        self._seen_aborted = 0
        self.seen_trajectories = 0  # every trajectory the sink handed to the buffer
        self._engine_stats: dict[str, float] = {}
        self.history: list[dict[str, Any]] = []
        parts.buffer.observe(self.on_trajectory)

    # ---------------------------------------------------------------- helpers
    def on_trajectory(self, traj: Trajectory) -> None:
        """Buffer observer: count generated tokens (tokens/s counts every trajectory, kept or not)."""
        self._tokens += _response_tokens(traj)
        self.seen_trajectories += 1

    def _roles(self, devices: list[int], role: str) -> None:
        if self.parts.timeline is not None and devices:
            self.parts.timeline.set_role(devices, role)

    async def _update(self, version: int) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        stats = {"sync_s": 0.0, "sync_bytes": 0.0}
        if version > self._published:
            stats = dict(await self.parts.updater.model_update(self.parts.trainer, version, self.cfg.update_timeout_s))
            self._published = version
        stats["update_s"] = loop.time() - t0
        return stats

    async def _train(self, batch: list[Any]) -> dict[str, float]:
        tb = build_train_batch(trajectories_to_samples(batch), pad_token_id=self.parts.pad_token_id,
                               normalize_advantage_std=self.config.trainer.normalize_advantage_std)
        return await self.parts.trainer.train_step(tb)

    def _aborted_total(self) -> int:
        return sum(1 for r in self.parts.buffer.records().values() if r.state == ABORTED)

    # ---------------------------------------------------------------- the loop
    async def step(self) -> dict[str, Any]:
        """One iteration: get_batch -> train_step (+ shrink/expand) -> suspend -> model_update -> resume."""
        p, cfg, mode = self.parts, self.cfg, self.cfg.mode
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tokens0 = self._tokens
        version0 = p.trainer.version
        self._roles(p.rollout_devices, "rollout")
        batch = await p.buffer.get_batch(cfg.batch_size, timeout_s=cfg.get_batch_timeout_s)
        t_batch = loop.time()
        record = SwitchRecord((), "not time_sharing")
        if mode == "sync":
            p.rollout.pause_launches()
            await p.rollout.abort_inflight("sync: batch full, redundant rollouts aborted")
            self._roles(p.rollout_devices, "train")
        else:
            self._roles(p.train_devices, "train")
        t_train0 = loop.time()
        if mode == "time_sharing" and p.controller is not None:
            train_metrics, record = await p.controller.train_with_lending(lambda: self._train(batch),
                                                                         timeout_s=cfg.get_batch_timeout_s)
        else:
            train_metrics = await self._train(batch)
        train_s = loop.time() - t_train0
        if mode != "sync":
            self._roles(p.train_devices, "idle")
        # model update right after the step: in-flight trajectories continue one version fresher
        self._roles(p.rollout_devices, "transfer")
        await p.rollout.suspend(cfg.update_timeout_s)
        sync = await self._update(p.trainer.version)
        p.buffer.set_version(p.trainer.version)
        await p.rollout.resume(p.trainer.version)
        if mode == "sync":
            p.rollout.resume_launches()
        self._roles(p.rollout_devices, "rollout")
        step_s = loop.time() - t0
        self.iteration += 1
        rewards = [float(t.reward or 0.0) for t in batch]
        aborted_total = self._aborted_total()
        by_task: dict[str, list[float]] = {}
        for t in batch:
            by_task.setdefault(t.group_id.split("-g")[0], []).append(float(t.reward or 0.0))
        rec: dict[str, Any] = {
            "iteration": self.iteration,
            "version": p.trainer.version,
            "mode": mode,
            "reward_mean": sum(rewards) / len(rewards),
            "success_rate": sum(1 for t in batch if t.success) / len(batch),
            "step_time_s": step_s,
            "get_batch_s": t_batch - t0,
            "train_s": train_s,
            "update_s": sync["update_s"],
            "sync_s": sync["sync_s"],
            "sync_bytes": sync["sync_bytes"],
            "tokens_per_s": (self._tokens - tokens0) / step_s if step_s > 0 else 0.0,
            "trained_tokens": sum(_response_tokens(t) for t in batch),  # D58: only what the step trained on
            "trajectories": len(batch),
            "aborted": aborted_total - self._seen_aborted,
            "staleness_max": max(version0 - oldest_version(t) for t in batch),  # trained at version0
            "switch_cost_s": record.switch_cost_s,
            "lent_devices": len(record.devices),
            "loss": train_metrics.get("loss", float("nan")),
            "t_end": loop.time(),
        }
        for task, rs in sorted(by_task.items()):
            rec[f"reward_{task}"] = sum(rs) / len(rs)
        if p.engine_stats is not None:  # prefix-cache hit rate, reused tokens, prefill share (rollart-proxy D29)
            now = await p.engine_stats()
            rec.update(engine_metrics(self._engine_stats, now))
            self._engine_stats = now
        self._seen_aborted = aborted_total
        if p.metrics is not None:
            p.metrics.write(rec)
        if p.checkpointer is not None and self.iteration % self.config.run.checkpoint_every == 0:
            await self.save()
        self.history.append(rec)
        _log.info("iteration %d: version %d, reward %.3f, %d trajectories, %.0f tok/s, step %.2f s", self.iteration,
                 rec["version"], rec["reward_mean"], rec["trajectories"], rec["tokens_per_s"], step_s)
        return rec

    def status(self, last: dict[str, Any]) -> str:
        """The progress line's status: trajectories trained, tokens/s, reward, version, device roles."""
        consumed = sum(1 for r in self.parts.buffer.records().values() if r.state == "consumed")
        roles = self.parts.timeline.roles() if self.parts.timeline is not None else {}
        return status_text(consumed, last, self.parts.trainer.version, roles)

    async def run(self, iterations: int, on_iteration: Callable[[dict[str, Any]], None] | None = None,
                  progress: bool | Console = True) -> list[dict[str, Any]]:
        """Run until `iterations` are done, writing metrics and a checkpoint after each.

        `progress` shows the `rollart run` progress line (on stderr, or on the Console given);
        False shows none. A pipeline whose parts have metrics but no timeline gets one in the
        metrics' run directory, so a hand-built run can be drawn with `rollart timeline`.
        """
        # VAL: VAL_INT_RANGE(iterations, min=1, max=10_000_000, exc=SchedulerError)
        check.int_range("iterations", iterations, min=1, max=10_000_000, exc=SchedulerError)  # generated #73393b3f0b
        p = self.parts
        if p.timeline is None and p.metrics is not None:
            devices = sorted(set(p.rollout_devices) | set(p.train_devices))
            p.timeline = RoleTimeline(p.metrics.run_dir / "timeline.jsonl", devices, clock=asyncio.get_running_loop().time)
        await p.rollout.start()
        out: list[dict[str, Any]] = []
        if progress is False:
            while self.iteration < iterations:
                out.append(rec := await self.step())
                if on_iteration is not None:
                    on_iteration(rec)
            return out
        console = None if progress is True else progress
        async with progress_line(f"{self.config.run.name} [{self.cfg.mode}]", iterations, self.iteration, self.status,
                                 console) as advance:
            while self.iteration < iterations:
                out.append(rec := await self.step())
                advance(rec)
                if on_iteration is not None:
                    on_iteration(rec)
        return out

    # ---------------------------------------------------------------- checkpoints
    async def save(self) -> Path:
        """Checkpoint the trainer (its own safetensors + JSON directory) and the iteration, with a manifest (D30)."""
        ck = self.parts.checkpointer
        assert ck is not None
        tmp = ck.begin(self.iteration)
        await self.parts.trainer.save_checkpoint(str(tmp / "trainer"))
        return ck.commit(tmp, self.iteration, self.parts.trainer.version, config_identity(self.config))

    async def restore(self, allow_config_change: bool = False) -> bool:
        """Resume from the newest complete checkpoint (R9); push its weights to the rollout side.

        Refused with `ConfigChangedError` (naming the changed fields) when the checkpoint was
        written under another config, unless `allow_config_change` (D30).
        """
        ck = self.parts.checkpointer
        info = ck.latest() if ck is not None else None
        if info is None:
            return False
        changes = Checkpointer.check_config(info, config_identity(self.config), allow_change=allow_config_change)
        if changes:
            _log.warning("resuming %s under a changed config: %s", info.path, "; ".join(changes))
        await self.parts.trainer.load_checkpoint(str(info.path / "trainer"))
        self.iteration = info.iteration
        self.parts.buffer.set_version(info.version)
        await self._update(info.version)
        return True

    async def close(self) -> None:
        """Stop the rollout, close the writers and whatever the builder registered."""
        await self.parts.rollout.stop(timeout_s=30.0)
        try:  # no engine step may be running in a thread while the workers stop
            await self.parts.rollout.suspend(10.0)
        except Exception:  # noqa: BLE001 - closing must go on
            pass
        if self.parts.timeline is not None:
            self.parts.timeline.close()
        if self.parts.metrics is not None:
            self.parts.metrics.close()
        for close in self.parts.closers:
            result = close()
            if asyncio.iscoroutine(result):
                await result
