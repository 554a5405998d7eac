"""The run config: YAML validated into pydantic models (design D11).

Why pydantic with `extra="forbid"` and `Literal`s: a typo in a key or a mode must fail before any
worker starts, and the error must say which field, what was given and what is allowed (R7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollart.scheduler.errors import ConfigError

MODES = ("sync", "one_off", "async", "time_sharing")
POLICIES = ("cost_aware", "always_shrink")
TASKS = ("frozenlake", "math")
ALGORITHMS = ("grpo", "ppo")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunSection(_Strict):
    """Where and how long: run directory, iterations, seed, checkpoint cadence."""

    name: str = "run"
    run_dir: str | None = None
    iterations: int = Field(20, ge=1)
    seed: int = 0
    checkpoint_every: int = Field(1, ge=1)
    tensorboard: bool = True


class PipelineSection(_Strict):
    """The mode switch (D5) and the batch shape."""

    mode: Literal["sync", "one_off", "async", "time_sharing"] = "async"
    alpha: int = Field(1, ge=0)
    batch_size: int = Field(32, ge=1)
    group_size: int = Field(8, ge=1)
    redundancy: float = Field(1.5, ge=1.0, le=8.0)
    balance_tasks: bool = True
    get_batch_timeout_s: float = Field(600.0, gt=0)
    update_timeout_s: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> PipelineSection:
        if self.batch_size % self.group_size:
            raise ValueError(f"pipeline.batch_size must be a multiple of pipeline.group_size={self.group_size}, got {self.batch_size}")
        if self.mode == "sync" and self.alpha != 0:
            raise ValueError(f"pipeline.alpha must be 0 in mode 'sync' (serial, on-policy), got {self.alpha}")
        if self.mode == "one_off" and self.alpha != 1:
            raise ValueError(f"pipeline.alpha must be 1 in mode 'one_off', got {self.alpha}")
        return self


class TimeSharingSection(_Strict):
    """The controller's policy (D6) and its knobs."""

    policy: Literal["cost_aware", "always_shrink"] = "cost_aware"
    margin: float = Field(1.0, ge=0)
    min_keep: int = Field(1, ge=1)
    lend: int = Field(1, ge=1)
    prior_switch_cost_s: float = Field(0.0, ge=0)
    slots_per_device: int = Field(16, ge=1)


class ClusterSection(_Strict):
    """Logical devices: how many serve rollout and how many the trainer owns."""

    rollout_devices: int = Field(2, ge=1)
    train_devices: int = Field(1, ge=1)
    use_ray: bool = False
    hardware: str = "H800"


class ModelSection(_Strict):
    """The tiny locally built model (random init, no downloads)."""

    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(128, ge=8)
    max_positions: int = Field(128, ge=16)


class TrainerSection(_Strict):
    """Optimisation settings handed to rollart.train."""

    algorithm: Literal["grpo", "ppo"] = "grpo"
    lr: float = Field(3e-3, gt=0)
    clip_eps: float = Field(0.2, gt=0)
    entropy_coef: float = Field(0.0, ge=0)
    normalize_advantage_std: bool = True  # False: Dr.GRPO advantages (reward - group mean), design D15
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(64, ge=1)


class TaskSection(_Strict):
    """One environment mix entry."""

    env: Literal["frozenlake", "math"]
    weight: float = Field(1.0, gt=0)
    max_turns: int = Field(8, ge=1)
    max_tokens: int = Field(2, ge=1)
    temperature: float = Field(1.0, gt=0)


class RunConfig(_Strict):
    """The whole run: pipeline mode and sizes, model, trainer, time-sharing and the demo tasks."""

    run: RunSection = Field(default_factory=RunSection)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    time_sharing: TimeSharingSection = Field(default_factory=TimeSharingSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    model: ModelSection = Field(default_factory=ModelSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    tasks: list[TaskSection] = Field(default_factory=lambda: [TaskSection(env="frozenlake")], min_length=1)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: Any = RunConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model


def format_validation_error(err: ValidationError) -> str:
    """One line per problem: dotted field path, message, offending value, allowed values."""
    lines = []
    for e in err.errors():
        loc = tuple(e.get("loc", ()))
        path = ".".join(str(p) for p in loc) or "<config>"
        msg = e.get("msg", "invalid")
        got = e.get("input")
        line = f"{path}: {msg} (got {got!r})"
        if e.get("type") == "extra_forbidden":
            parent = _model_at(loc[:-1])
            if parent is not None:
                line += f"; allowed fields: {sorted(parent.model_fields)}"
        elif e.get("type") == "literal_error":
            line += f"; allowed: {e.get('ctx', {}).get('expected', '')}"
        lines.append(line)
    return "invalid run config:\n  " + "\n  ".join(lines)


def parse_config(data: dict[str, Any]) -> RunConfig:
    """Validate a mapping (from YAML or code) into a RunConfig.

    Raises:
        ConfigError: naming each offending field, its value and the allowed values.
    """
    # deps: format_validation_error
    # VAL: VAL_TYPE(data, dict, exc=ConfigError)
    # >>> generated VAL_TYPE #0d07fce20f (edit the annotation, not this block)
    if not isinstance(data, dict):
        raise ConfigError(f"data must be of type dict, got {type(data).__name__} {data!r}")
    # <<< generated
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def load_config(path: str | Path) -> RunConfig:
    """Read YAML and validate it; errors become ConfigError naming field paths and allowed values."""
    # deps: parse_config, yaml.safe_load
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read run config {str(path)!r}: {err}") from None
    return parse_config(data if data is not None else {})
