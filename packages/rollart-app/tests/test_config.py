"""Config errors name the field, the offending value and the allowed values (R7)."""

from __future__ import annotations

import pytest

from rollart.app.config import TrainerSection, load_config, parse_config
from rollart.scheduler.errors import ConfigError


def test_bad_mode_names_field_and_choices():
    with pytest.raises(ConfigError) as exc:
        parse_config({"pipeline": {"mode": "fast"}})
    msg = str(exc.value)
    assert "pipeline.mode" in msg and "'fast'" in msg
    for mode in ("sync", "one_off", "async", "time_sharing"):
        assert mode in msg


def test_unknown_key_lists_allowed_fields():
    with pytest.raises(ConfigError) as exc:
        parse_config({"time_sharing": {"polcy": "cost_aware"}})
    msg = str(exc.value)
    assert "time_sharing.polcy" in msg and "'policy'" in msg and "'margin'" in msg


def test_range_and_cross_field_errors():
    with pytest.raises(ConfigError, match=r"pipeline.batch_size.*greater than or equal to 1"):
        parse_config({"pipeline": {"batch_size": 0}})
    with pytest.raises(ConfigError, match="multiple of pipeline.group_size"):
        parse_config({"pipeline": {"batch_size": 10, "group_size": 4}})
    with pytest.raises(ConfigError, match="alpha must be 0 in mode 'sync'"):
        parse_config({"pipeline": {"mode": "sync", "alpha": 2}})
    with pytest.raises(ConfigError, match=r"rollout.pools.0.engine: unknown engine 'trt'.*'torch'"):
        parse_config({"rollout": {"pools": [{"name": "a", "engine": "trt"}]}})
    with pytest.raises(ConfigError, match="data must be of type dict"):
        parse_config(["not", "a", "mapping"])  # type: ignore[arg-type]


def test_load_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("pipeline:\n  mode: time_sharing\n  alpha: 2\n  batch_size: 16\n  group_size: 4\ntasks:\n  - env: math\n")
    cfg = load_config(p)
    assert cfg.pipeline.mode == "time_sharing" and cfg.pipeline.alpha == 2 and cfg.tasks[0].env == "math"
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_the_removed_trainer_algorithm_is_an_error_naming_it(tmp_path):
    # `trainer.algorithm` selected nothing (one algorithm: GRPO advantages, PPO-clip loss); a config
    # that still sets it fails naming the field and saying why, not as a typo
    for value in ("grpo", "ppo"):
        with pytest.raises(ConfigError) as exc:
            parse_config({"trainer": {"algorithm": value, "lr": 0.01}})
        msg = str(exc.value)
        assert "trainer.algorithm: removed" in msg and repr(value) in msg and "no critic" in msg
        assert "Extra inputs" not in msg
    p = tmp_path / "old.yaml"
    p.write_text("trainer: {algorithm: grpo}\n")
    with pytest.raises(ConfigError, match="trainer.algorithm: removed"):
        load_config(p)
    assert "algorithm" not in TrainerSection.model_fields


def test_trainer_restarts_and_local_channel_replicas_are_checked():
    """D75: the rebuild budget defaults to 2 and is bounded; local-channel replicas would have no data-parallel group."""
    assert parse_config({}).trainer.restarts == 2
    assert parse_config({"trainer": {"restarts": 0}}).trainer.restarts == 0
    with pytest.raises(ConfigError, match=r"trainer.restarts.*greater than or equal to 0"):
        parse_config({"trainer": {"restarts": -1}})
    actors = {"cluster": {"ray": "local"}, "trainer": {"placement": "actors", "devices": 2}}
    with pytest.raises(ConfigError, match=r"trainer.devices: 2 replicas need a data-parallel group.*torch_dist"):
        parse_config(actors)
    assert parse_config({**actors, "sync": {"channel": "torch_dist"}}).trainer.devices == 2
