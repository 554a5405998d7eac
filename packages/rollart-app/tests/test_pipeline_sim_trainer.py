"""Step 13 (D21): the pipeline (through LocalTrainer) awaits a simulated trainer's step on the loop's (virtual) clock."""

from __future__ import annotations

import asyncio

import pytest

from rollart.app.config import parse_config
from rollart.app.trainers import LocalTrainer
from rollart.env.trajectory import Trajectory, TrajectoryStatus, Turn
from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.resource.virtual_time import run_virtual
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.errors import ConfigError
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.train.sim_trainer import SimTrainer, train_step_cost

CONFIG = {
    "run": {"iterations": 1, "tensorboard": False},
    "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4},
    "tasks": [{"env": "math", "max_turns": 3}],
}


def trajectories(n: int, prompt: int, response: int) -> list[Trajectory]:
    out = []
    for i in range(n):
        turn = Turn(prompt_ids=list(range(1, prompt + 1)), response_ids=list(range(1, response + 1)),
                    response_logprobs=[-0.5] * response, weight_version=0)
        out.append(Trajectory(id=f"t{i}", group_id=f"g{i // 4}", turns=[turn], status=TrajectoryStatus.FINISHED,
                              reward=float(i % 2)))
    return out


def test_pipeline_awaits_train_step_async_on_the_loop_clock():
    trainer = SimTrainer(8.2e9, BUILTIN_HARDWARE["H800"], 64)
    config = parse_config(CONFIG)
    parts = PipelineParts(buffer=SampleBuffer.from_config(config), rollout=None, trainer=LocalTrainer(trainer),  # type: ignore[arg-type]
                          updater=None, rollout_devices=[], train_devices=[])  # type: ignore[arg-type]
    pipe = Pipeline(config, parts)

    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        metrics = await pipe._train(trajectories(8, 300, 200))
        return metrics, loop.time() - t0

    metrics, waited = run_virtual(go()).result
    expected = train_step_cost(8.2e9, 8 * 500, 64, BUILTIN_HARDWARE["H800"]).step_s
    assert waited == pytest.approx(expected) and metrics["step_s"] == pytest.approx(expected)
    assert trainer.version == 1 and metrics["sequences"] == 8


@pytest.mark.parametrize(("alpha", "group_size", "field"), [(2, 4, "alpha"), (1, 8, "group_size")])
def test_a_buffer_that_disagrees_with_the_config_fails_when_the_pipeline_is_built(alpha, group_size, field):
    config = parse_config(CONFIG)  # alpha 1, group_size 4
    parts = PipelineParts(buffer=SampleBuffer(alpha=alpha, group_size=group_size), rollout=None, trainer=None,  # type: ignore[arg-type]
                          updater=None, rollout_devices=[], train_devices=[])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rf"SampleBuffer {field} equals config.pipeline.{field} .*from_config"):
        Pipeline(config, parts)
    assert SampleBuffer.from_config(config).alpha == 1 and SampleBuffer.from_config(config).group_size == 4
