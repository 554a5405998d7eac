"""Step 30 (D30): checkpoints are a JSON manifest + the trainer's safetensors directory.

Resume round-trips the trainer, refuses a changed config with the changed fields named (unless
allowed), and never executes a pickle planted in the checkpoint directory.
"""

from __future__ import annotations

import json
import pathlib
import pickle
from collections.abc import Mapping

import pytest
import torch

from rollart.app.config import parse_config
from rollart.app.trainers import LocalTrainer, LocalUpdater
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.checkpoint import Checkpointer, ConfigChangedError, config_hash, config_identity
from rollart.scheduler.errors import SchedulerError
from rollart.scheduler.pipeline import Pipeline, PipelineParts
from rollart.sync import LocalChannel, ModelUpdateGroup
from rollart.train import TorchTrainer, TrainError, build_causal_lm, tiny_llama_config

CONFIG = {
    "run": {"iterations": 2, "tensorboard": False},
    "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4},
    "tasks": [{"env": "math", "max_turns": 3}],
}


class RecordingEngine:
    """A WeightLoader that keeps what it was sent (the rollout side of a resume)."""

    def __init__(self) -> None:
        self.loaded: list[int] = []

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.loaded.append(version)


def _pipeline(tmp_path: pathlib.Path, config: dict, seed: int = 0) -> tuple[Pipeline, TorchTrainer, RecordingEngine]:
    trainer = TorchTrainer(build_causal_lm(tiny_llama_config(vocab_size=64), seed=seed))
    engine = RecordingEngine()
    updater = LocalUpdater(ModelUpdateGroup(LocalChannel(keep_last=2), [engine], timeout=30.0))
    parts = PipelineParts(buffer=SampleBuffer(alpha=1, group_size=4), rollout=None,  # type: ignore[arg-type]
                          trainer=LocalTrainer(trainer), updater=updater, rollout_devices=[], train_devices=[],
                          checkpointer=Checkpointer(tmp_path / "checkpoints"))
    return Pipeline(parse_config(config), parts), trainer, engine


def _one_step(trainer: TorchTrainer) -> None:
    from rollart.train import TrainSample, build_train_batch

    trainer.train_step(build_train_batch([
        TrainSample([1, 2, 3, 10, 11], [0, 0, 0, 1, 1], [0.0, 0.0, 0.0, -1.2, -0.7], reward=1.0, group_id=0),
        TrainSample([1, 2, 3, 20, 21], [0, 0, 0, 1, 1], [0.0, 0.0, 0.0, -2.3, -0.4], reward=0.0, group_id=0),
    ]))


async def test_resume_round_trip_restores_weights_version_and_iteration(tmp_path):
    pipe, trainer, _ = _pipeline(tmp_path, CONFIG)
    _one_step(trainer)
    pipe.iteration = 1
    path = await pipe.save()
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["iteration"] == 1 and manifest["version"] == 1
    assert manifest["config_hash"] == config_hash(config_identity(parse_config(CONFIG)))
    assert not list(path.rglob("*.pt")) and (path / "trainer" / "model.safetensors").is_file()

    again, fresh, engine = _pipeline(tmp_path, CONFIG, seed=1)
    assert await again.restore()
    assert again.iteration == 1 and fresh.version == 1 and engine.loaded == [1]
    for name, tensor in trainer.named_tensors().items():
        assert torch.equal(tensor, fresh.named_tensors()[name]), name


async def test_resume_under_a_changed_config_is_refused_naming_the_fields(tmp_path):
    pipe, trainer, _ = _pipeline(tmp_path, CONFIG)
    _one_step(trainer)
    pipe.iteration = 1
    await pipe.save()
    # a longer run of the same config is not a config change
    longer = {**CONFIG, "run": {**CONFIG["run"], "iterations": 50, "name": "renamed"}}
    same, _, _ = _pipeline(tmp_path, longer)
    assert await same.restore()

    changed = {**CONFIG, "pipeline": {**CONFIG["pipeline"], "batch_size": 16}}
    refused, fresh, engine = _pipeline(tmp_path, changed, seed=1)
    with pytest.raises(ConfigChangedError, match=r"pipeline\.batch_size: 8 -> 16.*--allow-config-change"):
        await refused.restore()
    assert fresh.version == 0 and refused.iteration == 0 and engine.loaded == []  # nothing was loaded

    allowed, fresh, _ = _pipeline(tmp_path, changed, seed=1)
    assert await allowed.restore(allow_config_change=True)
    assert allowed.iteration == 1 and fresh.version == 1


class _Hostile:
    """Unpickling this writes the marker file: what a tampered checkpoint could run."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.write_text, (self.marker, "code ran on resume"))


async def test_a_hostile_pickle_in_a_checkpoint_dir_is_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    root = tmp_path / "checkpoints"
    # a checkpoint as the pre-D30 format laid it out: ckpt-N/state.pt, a pickle loaded with weights_only=False
    legacy = root / "ckpt-00000009"
    legacy.mkdir(parents=True)
    torch.save({"iteration": 9, "version": 9, "state": _Hostile(marker)}, legacy / "state.pt")
    pipe, _, _ = _pipeline(tmp_path, CONFIG)
    assert not await pipe.restore()  # no manifest: not a checkpoint, never opened

    # a current checkpoint whose trainer weights were swapped for a pickle
    pipe.iteration = 10
    path = await pipe.save()
    (path / "trainer" / "model.safetensors").write_bytes(pickle.dumps(_Hostile(marker)))
    again, _, _ = _pipeline(tmp_path, CONFIG)
    with pytest.raises(TrainError, match="model.safetensors"):
        await again.restore()
    assert not marker.exists()


def test_unreadable_manifest_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "ckpt-00000001"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(SchedulerError, match="manifest.json"):
        Checkpointer(tmp_path).latest()


def test_a_checkpoint_that_stored_the_removed_trainer_algorithm_resumes_without_consent(tmp_path):
    """rollart-app D49: `trainer.algorithm` selected nothing; a run checkpointed with it resumes unchanged,
    while a real change of the trainer section is still refused."""
    from rollart.scheduler.checkpoint import CheckpointInfo, config_hash

    now = config_identity(parse_config({"tasks": [{"env": "math"}]}))
    old = {**now, "trainer": {**now["trainer"], "algorithm": "grpo"}}
    info = CheckpointInfo(path=tmp_path, iteration=3, version=3, config_hash=config_hash(old), config=old)
    assert Checkpointer.check_config(info, now) == []
    changed = {**now, "trainer": {**now["trainer"], "lr": now["trainer"]["lr"] * 2}}
    with pytest.raises(ConfigChangedError, match=r"trainer\.lr"):
        Checkpointer.check_config(info, changed)
