"""The `rollart sim` scenario file: a run config, a workload and the runs to compare (design D23).

Why a strict schema: a scenario is how a cluster is sized before GPU hours are spent, so a typo
(`iteratons`, `step_latecy`) must fail before anything runs and name the field, like the run
config does (R7). The run config inside is the same `RunConfig` `rollart run` takes; the workload
fills the `env_args` of every task whose env is `synthetic` (a simulation, sim_parts.py).

```yaml
name: fig10_modes
paper: "Fig 10: sync vs one_off vs async, 2.05x step time"
seed: 0
iterations: 6             # per run
warmup: 1                 # first iterations left out of the means (pipeline filling)
config: {...}             # a RunConfig: engine sim, trainer.backend sim, sync.channel sim
workload:                 # applied to every synthetic task that has no env_args of its own
  turns: {kind: gaussian, mean: 5, std: 1}
  prompt_tokens: 1024
  observation_tokens: {kind: lognormal, mean: 200, std: 0.5}
  response_tokens: {kind: lognormal, mean: 400, std: 0.6, max: 4096}
  step_latency: {kind: gaussian, mean: 10, std: 5}
  reset_latency: 0
  failure_prob: 0.0
runs:
  - {name: sync, set: {pipeline.mode: sync, pipeline.alpha: 0}}
  - {name: async, set: {pipeline.mode: async, pipeline.alpha: 1}}
```
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollart import checks as check
from rollart.app.config import RunConfig, format_validation_error
from rollart.app.overrides import apply_overrides
from rollart.scheduler.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DistSpec(_Strict):
    """A non-negative quantity: `fixed` (mean), `gaussian` N(mean, std), `lognormal` with this mean and log-sigma std."""

    kind: Literal["fixed", "gaussian", "lognormal"] = "fixed"
    mean: float = Field(0.0, ge=0)
    std: float = Field(0.0, ge=0)
    max: float | None = Field(None, gt=0)


Quantity = float | DistSpec


class Workload(_Strict):
    """What one synthetic environment does (seconds and tokens)."""

    turns: Quantity = 4
    prompt_tokens: Quantity = 512
    observation_tokens: Quantity = 128
    response_tokens: Quantity = 256
    step_latency: Quantity = 0.0
    reset_latency: Quantity = 0.0
    failure_prob: float = Field(0.0, ge=0, le=1)
    failure_kind: Literal["crash", "transient", "hang"] = "crash"

    def env_args(self) -> dict[str, Any]:
        """The `env_args` of env `synthetic`."""
        return self.model_dump(exclude_none=True)


class RunSpec(_Strict):
    """One run of the comparison: a name and dotted overrides of the config (as `--set`); `workload.*` keys override the workload."""

    name: str = Field(..., min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)


AS_BASE = "as_base"


class StaticSearch(_Strict):
    """A scenario's `search:` section (or `rollart sim --search static`'s options)."""

    base: str | None = None
    """The run whose config is searched (default: the scenario's first run)."""
    budget_devices: int | None = Field(None, ge=2)
    """Trainer plus rollout devices, at most (default: the base run's own total, unless `budget_cost` is set)."""
    budget_cost: float | None = Field(None, gt=0)
    """Trainer plus rollout cost per hour in the catalogue's units (H800 = 1.0), at most."""
    metric: Literal["step_time", "trained_tokens_per_s"] = "step_time"
    """What "best" means: the shortest mean step, or the most trained response tokens per second."""
    rollout_hardware: list[str] = Field(default_factory=lambda: [AS_BASE], min_length=1)
    """Rollout layouts to try: `as_base` (the base's pools, devices scaled in their proportions) or a
    hardware name (one pool of that type)."""
    granularity: int = Field(8, ge=1)
    """Trainer devices move in multiples of this (a node of 8 GPUs by default)."""
    coarse: int = Field(5, ge=2, le=64)
    """Points of the first grid over the trainer's share."""
    refine: int = Field(2, ge=0, le=16)
    """Rounds at half the spacing around the best point so far."""
    iterations: int | None = Field(None, ge=2)
    """Iterations per candidate (default: the scenario's)."""

    @model_validator(mode="after")
    def _one_budget(self) -> StaticSearch:
        from rollart.resource.hardware import BUILTIN_HARDWARE

        if self.budget_devices is not None and self.budget_cost is not None:
            raise ValueError("set one of budget_devices or budget_cost, not both")
        for hw in self.rollout_hardware:
            if hw != AS_BASE and hw not in BUILTIN_HARDWARE:
                raise ValueError(f"rollout_hardware: unknown {hw!r}; allowed: {[AS_BASE, *sorted(BUILTIN_HARDWARE)]}")
        return self


class Scenario(_Strict):
    """A scenario file (see the module docstring)."""

    name: str = Field(..., min_length=1)
    paper: str = ""
    seed: int = Field(0, ge=0)
    iterations: int = Field(4, ge=1, le=10_000)
    warmup: int = Field(1, ge=0)
    config: dict[str, Any]
    workload: Workload = Field(default_factory=Workload)
    runs: list[RunSpec] = Field(..., min_length=1)
    search: StaticSearch | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.warmup >= self.iterations:
            raise ValueError(f"warmup must be < iterations={self.iterations}, got {self.warmup}")
        names = [r.name for r in self.runs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"runs names must be unique, got duplicates {dupes}")
        if self.search is not None and self.search.base is not None and self.search.base not in names:
            raise ValueError(f"search.base: no run named {self.search.base!r}; allowed: {names}")
        if self.search is not None and self.search.iterations is not None and self.search.iterations <= self.warmup:
            raise ValueError(f"search.iterations must be > warmup={self.warmup}, got {self.search.iterations}")
        return self

    def run_config(self, run: RunSpec) -> RunConfig:
        """The validated RunConfig of one run: config + run.set, workload filled in, sim parts required.

        Raises:
            ConfigError: naming `runs.<name>.set` / `config.<field>` / `config.tasks.<i>.env_args.<field>`.
        """
        from rollart.app.config import parse_config

        sets = {k: v for k, v in run.set.items() if not k.startswith("workload.")}
        workload_sets = {k.removeprefix("workload."): v for k, v in run.set.items() if k.startswith("workload.")}
        try:
            data = apply_overrides(self.config, [f"{k}={json.dumps(v)}" for k, v in sets.items()])
            workload = self.workload
            if workload_sets:
                raw = apply_overrides(self.workload.model_dump(exclude_none=True),
                                      [f"{k}={json.dumps(v)}" for k, v in workload_sets.items()])
                workload = Workload.model_validate(raw)
        except ConfigError as err:
            raise ConfigError(f"runs.{run.name}.set: {err}") from None
        except ValidationError as err:
            raise ConfigError(_prefix(format_validation_error(err, Workload), f"runs.{run.name}.set.workload.")) from None
        data.setdefault("run", {})
        data["run"] = {"tensorboard": False, "checkpoint_every": 1_000_000, **data["run"], "iterations": self.iterations,
                       "seed": self.seed}
        for i, task in enumerate(data.get("tasks") or []):
            if isinstance(task, dict) and task.get("env") == "synthetic":
                own = task.get("env_args")
                try:
                    task["env_args"] = (Workload.model_validate(own) if own else workload).env_args()
                except ValidationError as err:
                    raise ConfigError(_prefix(format_validation_error(err, Workload), f"config.tasks.{i}.env_args.")) from None
        try:
            config = parse_config(data)
        except ConfigError as err:
            raise ConfigError(_prefix(str(err), "config.") + (f" (run {run.name!r})" if run.set else "")) from None
        if config.trainer.backend != "sim" or any(p.engine != "sim" for p in config.rollout.pools):
            raise ConfigError(f"config.trainer.backend / config.rollout.pools.*.engine: a scenario runs simulated parts "
                              f"(trainer.backend: sim, engine: sim) (run {run.name!r})")
        if config.cluster.uses_ray:
            raise ConfigError(f"config.cluster.ray: a simulation runs in one process; use ray: none (run {run.name!r})")
        from rollart.app.plan import check_trainer_fits

        try:
            check_trainer_fits(config)  # every run's trainer fits before the first run starts (D61)
        except ConfigError as err:
            raise ConfigError(f"config.{err} (run {run.name!r})") from None
        return config


def _prefix(message: str, prefix: str) -> str:
    lines = message.splitlines()
    head = lines[0].replace("invalid run config:", "invalid scenario:")
    return "\n".join([head, *(f"  {prefix}{line.strip()}" for line in lines[1:])])


def parse_scenario(data: Any) -> Scenario:
    """Validate a mapping into a Scenario and every run's config.

    Raises:
        ConfigError: one line per problem, naming the dotted field (unknown keys included).
    """
    # VAL: VAL_TYPE(data, dict, exc=ConfigError)
    check.of_type("data", data, dict, exc=ConfigError)  # generated #1c932bdabb
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, Scenario).replace("invalid run config:", "invalid scenario:")) from None
    for run in scenario.runs:
        scenario.run_config(run)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario YAML file and validate it (see `parse_scenario`)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read scenario {str(path)!r}: {err}") from None
    return parse_scenario(data if data is not None else {})
