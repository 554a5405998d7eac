"""Issue 25: parts composed by hand whose shapes cannot fill a batch fail when they are built, naming the numbers.

Before, a RolloutScheduler whose slots held 3 EnvManagers under group_size 4 ran until get_batch's
deadline (600 s by default) with no output: no group ever completes.
"""

from __future__ import annotations

import pytest

from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.stubs import CountdownStubEnv, ListSink, StubLLMClient
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.errors import ConfigError, SchedulerError
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.scheduler.rollout import RolloutScheduler
from rollart.scheduler.settings import PipelineConfig


class CharPrompts:
    """A PromptBuilder over character codes (enough for managers that are built, not run)."""

    def initial_ids(self, system_prompt: str, observation: str) -> list[int]:
        return [ord(c) % 50 + 1 for c in system_prompt + observation]

    def continuation_ids(self, previous_response_ids: list[int], observation: str) -> list[int]:
        return [ord(c) % 50 + 1 for c in observation]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(96 + t % 26) for t in token_ids)


class Control:
    async def suspend(self) -> None: ...

    async def resume(self) -> None: ...

    async def abort(self, trajectory_id: str, reason: str = "aborted by client") -> int:
        return 0


def managers(n: int) -> list[EnvManager]:
    sink = ListSink()
    return [EnvManager(lambda: CountdownStubEnv(length=2), StubLLMClient(lambda s: [5], ["x"]), CharPrompts(), sink,
                       EnvManagerConfig(max_turns=4), name=f"m{i}") for i in range(n)]


def test_a_slot_of_three_under_group_size_four_fails_at_construction_naming_both_numbers():
    buffer = SampleBuffer(alpha=1, group_size=4)
    with pytest.raises(ConfigError, match=r"each slot holds group_size EnvManagers .*'slot': 1, 'env_managers': 3, 'group_size': 4"):
        RolloutScheduler([managers(4), managers(3)], ["t", "t"], buffer, Control())
    RolloutScheduler([managers(4), managers(4)], ["t", "t"], buffer, Control())  # the right shape builds
    assert issubclass(ConfigError, SchedulerError)  # callers that caught SchedulerError still do


def test_a_balanced_buffer_refuses_slots_that_miss_or_add_a_task():
    buffer = SampleBuffer(alpha=1, group_size=2, tasks=["lake", "math"])
    with pytest.raises(ConfigError, match=r"'slot_tasks': \['lake'\], 'buffer_tasks': \['lake', 'math'\]"):
        RolloutScheduler([managers(2), managers(2)], ["lake", "lake"], buffer, Control())
    with pytest.raises(ConfigError, match=r"'slot_tasks': \['code', 'lake', 'math'\]"):
        RolloutScheduler([managers(2)] * 3, ["lake", "math", "code"], buffer, Control())
    RolloutScheduler([managers(2), managers(2)], ["lake", "math"], buffer, Control())


class _Pipe:
    def __init__(self, mode: str, batch_size: int, group_size: int) -> None:
        self.mode, self.alpha, self.batch_size, self.group_size = mode, 1, batch_size, group_size
        self.get_batch_timeout_s = self.update_timeout_s = 30.0


class _Settings:
    def __init__(self, mode: str = "async", batch_size: int = 8, group_size: int = 4) -> None:
        self.pipeline = _Pipe(mode, batch_size, group_size)
        self.run = type("Run", (), {"name": "shapes", "checkpoint_every": 1})()
        self.trainer = type("Trainer", (), {"normalize_advantage_std": True})()


def _parts(buffer: SampleBuffer, rollout: RolloutScheduler | None) -> PipelineParts:
    trainer = type("Trainer", (), {"version": 0})()  # never stepped: only construction is under test
    return PipelineParts(buffer=buffer, rollout=rollout, trainer=trainer, updater=None,  # type: ignore[arg-type]
                         rollout_devices=[], train_devices=[])


def test_the_pipeline_refuses_shapes_that_can_never_fill_a_batch():
    settings: PipelineConfig = _Settings(batch_size=6, group_size=4)
    buffer = SampleBuffer(alpha=1, group_size=4)
    with pytest.raises(ConfigError, match=r"batch_size is a multiple of group_size .*got \(6, 4\)"):
        Pipeline(settings, _parts(buffer, None))
    other = SampleBuffer(alpha=1, group_size=4)
    rollout = RolloutScheduler([managers(4), managers(4)], ["t", "t"], other, Control())
    with pytest.raises(ConfigError, match=r"the RolloutScheduler fills the pipeline's own SampleBuffer"):
        Pipeline(_Settings(), _parts(buffer, rollout))
    # sync mode launches each slot once per iteration: 1 slot x 4 can never make a batch of 8
    once = RolloutScheduler([managers(4)], ["t"], buffer, Control(), once_per_launch=True)
    with pytest.raises(ConfigError, match=r"slots x group_size >= batch_size.*'slots': 1, 'group_size': 4, 'batch_size': 8"):
        Pipeline(_Settings(mode="sync"), _parts(buffer, once))
    enough = RolloutScheduler([managers(4), managers(4)], ["t", "t"], buffer, Control(), once_per_launch=True)
    Pipeline(_Settings(mode="sync"), _parts(buffer, enough))
