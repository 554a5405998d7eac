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
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rollart import checks as check
from rollart.env.trajectory import Trajectory
from rollart.scheduler.adapters import trajectories_to_samples
from rollart.scheduler.buffer import SampleBuffer, oldest_version
from rollart.scheduler.checkpoint import Checkpointer, config_identity
from rollart.scheduler.errors import ConfigError, SchedulerError
from rollart.scheduler.failures import FailureWatch, reward_metrics
from rollart.scheduler.metrics import MetricsWriter, RoleTimeline, engine_metrics
from rollart.scheduler.progress import progress_line, status_text
from rollart.scheduler.records import OPEN_TRAJECTORIES, RunRecorder, truncate_after
from rollart.scheduler.rollout import RolloutScheduler
from rollart.scheduler.settings import PipelineConfig
from rollart.scheduler.timesharing import SwitchRecord, TimeSharingController
from rollart.train.batch import build_train_batch

if TYPE_CHECKING:
    from rich.console import Console

_log = logging.getLogger(__name__)


class _Stopped(Exception):
    """A stop request ended the wait for a batch (internal: `run` returns)."""


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


@runtime_checkable
class BuildsBatch(Protocol):
    """A trainer that builds its own batch from the step's samples (D57), instead of the padded tensors
    of `rollart.train.build_train_batch`."""

    def build_batch(self, samples: list[Any], pad_token_id: int, normalize_advantage_std: bool) -> Any:
        """The batch `train_step` takes, from `rollart.train.TrainSample`s (one per trajectory, batch order).

        Called by `Pipeline` once per iteration, on the event loop, right before `train_step`: it must
        be cheap and must not block. A simulated trainer, which reads token counts only, returns them
        without padding thousands of sequences into tensors; a real trainer has no reason to offer it.
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
    recorder: RunRecorder | None = None  # events, trajectory ledger, routing and outcomes (D50); made when metrics exist
    reward_stats: Callable[[], dict[str, Any]] | None = None  # reward clients' cumulative stats, summed (D53)


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
        self.stop_reason: str | None = None  # set by request_stop (SIGTERM, SIGINT): run() ends after the step
        self._failure: BaseException | None = None  # set by fail(): the run ends with it at the next wait
        self._interrupt: asyncio.Event | None = None
        self._saved_iteration = -1
        parts.buffer.observe(self.on_trajectory)
        if parts.recorder is None and parts.metrics is not None:
            parts.recorder = RunRecorder(parts.metrics.run_dir)
        self.recorder = parts.recorder
        if self.recorder is not None:
            parts.buffer.observe(self.recorder.put)
            parts.buffer.observe_settled(self.recorder.settled)
        self.failures = FailureWatch(limit=max(16, 2 * config.pipeline.group_size), on_trip=self.fail)  # D52
        parts.buffer.observe(self.failures.observe)
        self._reward_stats: dict[str, Any] = {}

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
        samples = trajectories_to_samples(batch)
        trainer = self.parts.trainer
        normalize = self.config.trainer.normalize_advantage_std
        if isinstance(trainer, BuildsBatch):  # D57: e.g. a simulated trainer, which counts tokens only
            tb = trainer.build_batch(samples, self.parts.pad_token_id, normalize)
        else:
            tb = build_train_batch(samples, pad_token_id=self.parts.pad_token_id, normalize_advantage_std=normalize)
        return await trainer.train_step(tb)

    def _aborted_total(self) -> int:
        return self.parts.buffer.counts().aborted  # O(1), and right with a ledger too (D55)

    # ---------------------------------------------------------------- stop and failure (D51)
    def _wake(self) -> None:
        if self._interrupt is None:
            self._interrupt = asyncio.Event()
        self._interrupt.set()

    def request_stop(self, reason: str) -> None:
        """Stop cleanly (a signal): a step waiting for its batch is abandoned, a step training finishes;
        `run` then checkpoints the last completed iteration and returns."""
        # VAL: VAL_NON_EMPTY(reason, exc=SchedulerError)
        check.non_empty("reason", reason, exc=SchedulerError)  # generated #063038851c
        if self.stop_reason is None:
            _log.warning("stop requested (%s): finishing or abandoning the current step, then checkpointing", reason)
            self.stop_reason = reason
        self._wake()

    def fail(self, error: BaseException) -> None:
        """End the run with `error` (a part it cannot go on without is gone): raised out of `run` at the
        next wait for a batch, at once if the loop is waiting now."""
        if self._failure is None:
            self._failure = error
        self._wake()

    async def _batch(self, n: int, timeout_s: float) -> list[Any] | None:
        """`get_batch`, given up for a stop request (None) or a failure (raised)."""
        if self._failure is not None:
            raise self._failure
        if self.stop_reason is not None:
            return None
        if self._interrupt is None or self._interrupt.is_set():
            self._interrupt = asyncio.Event()
        interrupt = asyncio.ensure_future(self._interrupt.wait())
        batch = asyncio.ensure_future(self.parts.buffer.get_batch(n, timeout_s=timeout_s))
        try:
            await asyncio.wait({batch, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            interrupt.cancel()
            if not batch.done():
                batch.cancel()
                await asyncio.gather(batch, return_exceptions=True)
        if self._failure is not None:
            if batch.done() and not batch.cancelled() and batch.exception() is None:
                _log.warning("a batch of %d was ready when the run failed; it is not trained", n)
            raise self._failure
        if not batch.cancelled() and batch.done():
            return batch.result()
        return None

    # ---------------------------------------------------------------- the loop
    async def step(self) -> dict[str, Any]:
        """One iteration: get_batch -> train_step (+ shrink/expand) -> suspend -> model_update -> resume."""
        p, cfg, mode = self.parts, self.cfg, self.cfg.mode
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tokens0 = self._tokens
        version0 = p.trainer.version
        if self.recorder is not None:
            self.recorder.iteration = self.iteration + 1
        self._roles(p.rollout_devices, "rollout")
        batch = await self._batch(cfg.batch_size, cfg.get_batch_timeout_s)  # a tripped FailureWatch ends it (D52)
        if batch is None:  # stop requested while waiting: nothing trained, the iteration did not happen
            raise _Stopped()
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
        if self.recorder is not None and record.devices:  # time-sharing switches in events.jsonl (D48)
            devices = list(record.devices)
            self.recorder.events.record("timeshare_shrink", iteration=self.iteration + 1, devices=devices,
                                        seconds=record.shrink.total_s, reason=record.reason)
            self.recorder.events.record("timeshare_expand", iteration=self.iteration + 1, devices=devices,
                                        seconds=record.expand.total_s)
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
        rec.update(self.failures.take())  # env_errors, reward_errors by kind (D52)
        if p.reward_stats is not None:  # reward_retries, reward_outage_s (D53)
            now_stats = p.reward_stats()
            rec.update(reward_metrics(self._reward_stats, now_stats))
            self._reward_stats = now_stats
        self._seen_aborted = aborted_total
        if self.recorder is not None:  # routing per tag and hardware, outcomes that add up (D49)
            rec.update(self.recorder.take_iteration())
            self.recorder.iteration = self.iteration + 1  # what settles after the record belongs to the next (D65)
        if p.metrics is not None:
            p.metrics.write(rec)
        if p.checkpointer is not None and self.iteration % self.config.run.checkpoint_every == 0:
            await self.save()
            self._saved_iteration = self.iteration
        self.history.append(rec)
        _log.info("iteration %d: version %d, reward %.3f, %d trajectories, %.0f tok/s, step %.2f s", self.iteration,
                 rec["version"], rec["reward_mean"], rec["trajectories"], rec["tokens_per_s"], step_s)
        return rec

    def status(self, last: dict[str, Any]) -> str:
        """The progress line's status: trajectories trained, tokens/s, reward, version, device roles."""
        consumed = self.parts.buffer.counts().consumed
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
            await self._loop(iterations, out, on_iteration)
        else:
            console = None if progress is True else progress
            async with progress_line(f"{self.config.run.name} [{self.cfg.mode}]", iterations, self.iteration,
                                     self.status, console) as advance:
                await self._loop(iterations, out, on_iteration, advance)
        if self.stop_reason is not None and p.checkpointer is not None and self._saved_iteration != self.iteration \
                and self.iteration > 0:
            await self.save()  # a stop keeps every completed iteration (D51)
            self._saved_iteration = self.iteration
        return out

    async def _loop(self, iterations: int, out: list[dict[str, Any]],
                    *observers: Callable[[dict[str, Any]], None] | None) -> None:
        while self.iteration < iterations and self.stop_reason is None:
            try:
                rec = await self.step()
            except _Stopped:
                return
            out.append(rec)
            for observe in observers:
                if observe is not None:
                    observe(rec)

    # ---------------------------------------------------------------- checkpoints
    async def save(self) -> Path:
        """Checkpoint the trainer (its own safetensors + JSON directory) and the iteration, with a manifest (D30)."""
        ck = self.parts.checkpointer
        assert ck is not None
        tmp = ck.begin(self.iteration)
        await self.parts.trainer.save_checkpoint(str(tmp / "trainer"))
        if self.recorder is not None:  # what a resume from here settles as lost (D65)
            (tmp / OPEN_TRAJECTORIES).write_text(json.dumps(sorted(self.recorder.open_at_record)))
        return ck.commit(tmp, self.iteration, self.parts.trainer.version, config_identity(self.config))

    async def restore(self, allow_config_change: bool = False) -> bool:
        """Resume from the newest complete checkpoint (R9); push its weights to the rollout side.

        Refused with `ConfigChangedError` (naming the changed fields) when the checkpoint was
        written under another config, unless `allow_config_change` (D30).
        """
        ck = self.parts.checkpointer
        info = ck.latest() if ck is not None else None
        if info is None:
            self._truncate_records(0)  # a run killed before its first checkpoint starts over
            return False
        changes = Checkpointer.check_config(info, config_identity(self.config), allow_change=allow_config_change)
        if changes:
            _log.warning("resuming %s under a changed config: %s", info.path, "; ".join(changes))
        await self.parts.trainer.load_checkpoint(str(info.path / "trainer"))
        self.iteration = info.iteration
        self._truncate_records(info.iteration)
        opened = info.path / OPEN_TRAJECTORIES
        if self.recorder is not None and opened.exists():
            lost = self.recorder.settle_lost(info.iteration, json.loads(opened.read_text()))
            if lost:
                _log.info("resume at iteration %d: %d trajectories open at its checkpoint are recorded as lost",
                          info.iteration, lost)
        if self.recorder is not None:
            self.recorder.iteration = info.iteration + 1
        self.parts.buffer.set_version(info.version)
        await self._update(info.version)
        return True

    def _truncate_records(self, iteration: int) -> None:
        """Drop what the iterations after `iteration` wrote: they run again (D48)."""
        if self.parts.metrics is not None:
            dropped = truncate_after(self.parts.metrics.run_dir, iteration)
            if any(dropped.values()):
                _log.info("resume at iteration %d: dropped the later records %s", iteration, dropped)

    async def close(self) -> None:
        """Stop the rollout, close the writers and whatever the builder registered.

        Every trajectory still open after the closers ran gets its ledger line (`buffered`, D48).
        """
        await self.parts.rollout.stop(timeout_s=30.0)
        try:  # no engine step may be running in a thread while the workers stop
            await self.parts.rollout.suspend(10.0)
        except Exception:  # noqa: BLE001 - closing must go on
            pass
        if self.parts.timeline is not None:
            self.parts.timeline.close()
        if self.parts.metrics is not None:
            self.parts.metrics.close()
        try:
            for close in self.parts.closers:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
        finally:
            if self.recorder is not None:
                self.recorder.close()
