"""Step 46 (D45): the scheduling library composes by hand, without the application.

Its settings are Protocols, so plain dataclasses drive `Pipeline` and `SampleBuffer.from_config`;
importing the library loads no YAML parser, CLI framework, application module, reward service or
weight channel.
"""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rollart.env.trajectory import Trajectory, TrajectoryStatus, Turn
from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.resource.virtual_time import run_virtual
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.errors import ConfigError
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.train.sim_trainer import SimTrainer, train_step_cost


@dataclass(frozen=True)
class PipelineS:
    mode: str = "async"
    alpha: int = 1
    batch_size: int = 8
    group_size: int = 4
    get_batch_timeout_s: float = 30.0
    update_timeout_s: float = 30.0


@dataclass(frozen=True)
class RunS:
    name: str = "by-hand"
    checkpoint_every: int = 1


@dataclass(frozen=True)
class TrainerS:
    normalize_advantage_std: bool = True


@dataclass(frozen=True)
class Settings:
    pipeline: PipelineS = field(default_factory=PipelineS)
    run: RunS = field(default_factory=RunS)
    trainer: TrainerS = field(default_factory=TrainerS)


class AwaitedSimTrainer:
    """The pipeline's Trainer protocol over rollart.train's SimTrainer (its step waits on the loop's clock)."""

    def __init__(self, inner: SimTrainer) -> None:
        self.inner = inner

    @property
    def version(self) -> int:
        return self.inner.version

    async def train_step(self, batch):
        return await self.inner.train_step_async(batch)

    async def save_checkpoint(self, path: str) -> None:
        self.inner.save_checkpoint(path)

    async def load_checkpoint(self, path: str) -> None:
        self.inner.load_checkpoint(path)

    async def close(self) -> None:
        return None


def _finished(n: int, prompt: int, response: int) -> list[Trajectory]:
    out = []
    for i in range(n):
        turn = Turn(prompt_ids=list(range(1, prompt + 1)), response_ids=list(range(1, response + 1)),
                    response_logprobs=[-0.5] * response, weight_version=0)
        out.append(Trajectory(id=f"t{i}", group_id=f"g{i // 4}", turns=[turn], status=TrajectoryStatus.FINISHED,
                              reward=float(i % 2)))
    return out


def test_a_hand_built_pipeline_runs_on_plain_dataclass_settings():
    settings = Settings()
    sim = SimTrainer(8.2e9, BUILTIN_HARDWARE["H800"], 64)
    buffer = SampleBuffer.from_config(settings)
    assert (buffer.alpha, buffer.group_size) == (1, 4)
    parts = PipelineParts(buffer=buffer, rollout=None, trainer=AwaitedSimTrainer(sim),  # type: ignore[arg-type]
                          updater=None, rollout_devices=[], train_devices=[])  # type: ignore[arg-type]
    pipe = Pipeline(settings, parts)

    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        metrics = await pipe._train(_finished(8, 300, 200))
        return metrics, loop.time() - t0

    metrics, waited = run_virtual(go()).result
    expected = train_step_cost(8.2e9, 8 * 500, 64, BUILTIN_HARDWARE["H800"]).step_s
    assert waited == pytest.approx(expected) and metrics["sequences"] == 8 and sim.version == 1


def test_plain_settings_that_disagree_with_the_buffer_are_refused():
    parts = PipelineParts(buffer=SampleBuffer(alpha=3, group_size=4), rollout=None, trainer=None,  # type: ignore[arg-type]
                          updater=None, rollout_devices=[], train_devices=[])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"SampleBuffer alpha equals config.pipeline.alpha"):
        Pipeline(Settings(), parts)


LIBRARY = ["buffer", "rollout", "timesharing", "pipeline", "scoring", "adapters", "metrics", "timeline",
           "checkpoint", "progress", "settings", "errors"]


def test_importing_the_library_loads_no_application_schema_cli_reward_service_or_channel():
    code = ("import sys\n" + "".join(f"import rollart.scheduler.{m}\n" for m in LIBRARY)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'typer' "
              "or m.startswith(('rollart.app', 'rollart.reward', 'rollart.sync')))\nprint(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    # a third-party dependency may load yaml or pydantic; the library's own modules import neither
    src = Path(__file__).resolve().parents[1] / "src" / "rollart" / "scheduler"
    own = set()
    for path in src.glob("*.py"):
        tree = ast.parse(path.read_text())
        own |= {n.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for n in node.names}
        own |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not own & {"yaml", "typer", "pydantic", "click"}, own
