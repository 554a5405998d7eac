"""Issue 21 item 4 (scheduler D52, D53): a task whose trajectories keep failing on an env error stops the
run at once, naming the task and the env's error (before: `SchedulerTimeout` after get_batch_timeout_s,
426 s in the issue); env and reward errors are counted by kind per iteration."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rollart.env.error_report import ErrorReport
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.prompts import ChatTemplatePromptBuilder
from rollart.env.protocols import ResetResult
from rollart.env.stubs import StubLLMClient
from rollart.env.tiny_tokenizer import build_tiny_chat_tokenizer
from rollart.env.trajectory import Trajectory, TrajectoryStatus
from rollart.resource.virtual_time import run_virtual
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.failures import FailureWatch, TaskFailingError, reward_metrics
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.scheduler.rollout import RolloutScheduler


class NoProxy:
    """The rollout's control seam with nothing behind it (no generation is in flight to suspend or abort)."""

    async def suspend(self) -> None: ...
    async def resume(self) -> None: ...
    async def abort(self, trajectory_id: str, reason: str = "") -> int:
        return 0


def _settings(timeout_s: float):
    pipeline = SimpleNamespace(mode="async", alpha=1, batch_size=8, group_size=4, get_batch_timeout_s=timeout_s,
                               update_timeout_s=30.0)
    return SimpleNamespace(pipeline=pipeline, run=SimpleNamespace(name="failing", checkpoint_every=1),
                           trainer=SimpleNamespace(normalize_advantage_std=True))


class StepRaises:
    name = "broken"
    system_prompt = "Go."

    async def reset(self, seed=None):
        await asyncio.sleep(0.5)  # a real env takes time (and virtual time advances)
        return ResetResult(observation="start", info={})

    async def step(self, action):
        raise KeyError("no such cell: (9, 9)")

    async def close(self):
        return None


def test_a_task_whose_env_always_raises_stops_the_run_fast_naming_the_error():
    settings = _settings(timeout_s=426.0)
    prompts = ChatTemplatePromptBuilder(build_tiny_chat_tokenizer())
    buffer = SampleBuffer.from_config(settings)
    report = ErrorReport(label="lake")
    slots = [[EnvManager(StepRaises, StubLLMClient(lambda s: [5], ["x"]), prompts, buffer,
                         EnvManagerConfig(max_turns=4), name=f"lake-{i}-{j}", tag="lake", errors=report)
              for j in range(4)] for i in range(2)]
    rollout = RolloutScheduler(slots, ["lake", "lake"], buffer, NoProxy())
    trainer = type("Trainer", (), {"version": 0})()
    parts = PipelineParts(buffer=buffer, rollout=rollout, trainer=trainer, updater=None,  # type: ignore[arg-type]
                          rollout_devices=[], train_devices=[])
    pipe = Pipeline(settings, parts)

    async def go():
        await rollout.start()
        try:  # well under get_batch_timeout_s: the old code waited all 426 s and raised SchedulerTimeout
            await asyncio.wait_for(pipe.step(), timeout=60.0)
        finally:
            await rollout.stop(timeout_s=10)

    with pytest.raises(TaskFailingError) as info:
        run = run_virtual(go())
        run.result  # noqa: B018 - raises the run's exception
    text = str(info.value)
    assert text.startswith("task lake: the last 16 trajectories failed on an env error and none finished")
    assert "step:KeyError: 'no such cell: (9, 9)'" in text
    assert report.counts["step:KeyError"] >= 16


def test_env_and_reward_errors_are_counted_by_kind_per_iteration():
    watch = FailureWatch(limit=100)
    a = Trajectory(id="a", group_id="math-g0", status=TrajectoryStatus.FAILED,
                   info={"env_error": {"kind": "step:timeout", "message": "5 s"}})
    b = Trajectory(id="b", group_id="math-g0", status=TrajectoryStatus.FAILED,
                   info={"reward_error": {"kind": "RewardTimeoutError", "message": "deadline"}})
    for t in (a, a.model_copy(update={"id": "a2"}), b):
        watch.observe(t)
    assert watch.take() == {"env_errors": {"step:timeout": 2}, "reward_errors": {"RewardTimeoutError": 1}}
    assert watch.take() == {"env_errors": {}, "reward_errors": {}}
    assert reward_metrics({"retries": 3, "outage_s": 1.0}, {"retries": 5, "outage_s": 4.5}) == \
        {"reward_retries": 2, "reward_outage_s": 3.5}
    assert reward_metrics({"retries": 9, "outage_s": 9.0}, {"retries": 1, "outage_s": 0.5}) == \
        {"reward_retries": 1, "reward_outage_s": 0.5}


class WatchMachine(RuleBasedStateMachine):
    """The fail-fast rule against a model: per task, a streak of env-error failures since the last finish."""

    LIMIT = 5

    def __init__(self) -> None:
        super().__init__()
        self.watch = FailureWatch(limit=self.LIMIT)
        self.streak: dict[str, int] = {}
        self.tripped_by: str | None = None
        self.n = 0
        self.env_errors = 0

    def _put(self, task: str, status: TrajectoryStatus, info: dict) -> None:
        self.n += 1
        self.watch.observe(Trajectory(id=f"t{self.n}", group_id=f"{task}-g{self.n}", status=status, info=info))

    @rule(task=st.sampled_from(["lake", "math"]))
    def env_failure(self, task):
        self._put(task, TrajectoryStatus.FAILED, {"env_error": {"kind": "step:ValueError", "message": "m", "env": "e"}})
        self.env_errors += 1
        self.streak[task] = self.streak.get(task, 0) + 1
        if self.streak[task] >= self.LIMIT and self.tripped_by is None:
            self.tripped_by = task

    @rule(task=st.sampled_from(["lake", "math"]))
    def finished(self, task):
        self._put(task, TrajectoryStatus.FINISHED, {})
        self.streak[task] = 0

    @rule(task=st.sampled_from(["lake", "math"]))
    def other_failure(self, task):  # an LLM error or an abort is not the env's fault: the streak is kept
        self._put(task, TrajectoryStatus.FAILED, {})

    @invariant()
    def trips_exactly_when_a_streak_reaches_the_limit(self):
        failing = self.watch.failing
        assert (failing is None) == (self.tripped_by is None)
        if failing is not None:
            assert str(failing).startswith(f"task {self.tripped_by}: the last {self.LIMIT} trajectories")

    @invariant()
    def every_env_error_is_counted(self):
        assert sum(self.watch.env_errors.values()) == self.env_errors


TestWatchMachine = WatchMachine.TestCase
TestWatchMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
