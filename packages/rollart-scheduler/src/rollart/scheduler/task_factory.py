"""From a config task to the parts an EnvManager needs: env factory, prompt builder, scorer.

Why one place: `rollart run`, `rollart plan` (which resolves every name before anything starts)
and the tests must agree on what `env: frozenlake` or `reward: {service: ...}` means.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart.env.trajectory import Trajectory
from rollart.scheduler.config import RunConfig, TaskSection
from rollart.scheduler.registry import resolve
from rollart.scheduler.tasks import FROZEN_LAKE_MAP, FrozenLakePrompts, MathToolPrompts

Scorer = Callable[[Trajectory], Awaitable[float]]
DEMO_PROMPTS = {"frozenlake": FrozenLakePrompts, "math": MathToolPrompts}
DEMO_ENV_ARGS: dict[str, Callable[[TaskSection], dict[str, Any]]] = {
    "frozenlake": lambda t: {"desc": list(FROZEN_LAKE_MAP), "is_slippery": False, "max_episode_steps": t.max_turns},
    "math": lambda t: {"source": "generated", "max_tool_calls": 2},
}


@dataclass
class TaskParts:
    """What the builder needs for one task: fresh envs, fresh prompt builders, a scorer, its origin."""

    task: TaskSection
    env_factory: Callable[[], Any]
    prompts_factory: Callable[[], Any]
    scorer: Scorer
    env_origin: str
    reward_origin: str
    closers: list[Callable[[], Any]]


def prompt_style(task: TaskSection, config: RunConfig) -> str:
    """`auto` -> `demo` for the tiny model, `chat_template` for a checkpoint."""
    if task.prompts != "auto":
        return task.prompts
    return "chat_template" if config.model.path else "demo"


def as_scorer(obj: Any) -> Scorer:
    """A reward as an async `trajectory -> float`: a plain function, an async function, or a `RewardFn`."""
    if inspect.isclass(obj):
        obj = obj()
    score = getattr(obj, "score", None)
    if score is not None:
        async def via_reward_fn(trajectory: Trajectory) -> float:
            result = await score(trajectory)
            return float(getattr(result, "score", result))
        return via_reward_fn

    async def via_function(trajectory: Trajectory) -> float:
        value = obj(trajectory)
        if inspect.isawaitable(value):
            value = await value
        return float(getattr(value, "score", value))
    return via_function


def build_task(task: TaskSection, index: int, config: RunConfig, tokenizer: Any, base_dir: Path | None = None) -> TaskParts:
    """Resolve the env, the reward and the prompt style of `tasks[index]`.

    Raises:
        ConfigError: naming `tasks.<index>.env` / `.reward` / `.prompts` and what is allowed.
    """
    from rollart.scheduler.errors import ConfigError

    field = f"tasks.{index}"
    env = resolve("env", task.env, base_dir, field=f"{field}.env")
    env_args = {**DEMO_ENV_ARGS.get(task.env, lambda t: {})(task), **task.env_args}
    env_cls = env.obj

    def env_factory() -> Any:
        return env_cls(**env_args)

    style = prompt_style(task, config)
    if style == "demo":
        if task.env not in DEMO_PROMPTS:
            raise ConfigError(f"{field}.prompts: 'demo' prompts exist only for {sorted(DEMO_PROMPTS)}; "
                              f"use prompts: chat_template with model.path for env {task.env!r}")
        builder_cls = DEMO_PROMPTS[task.env]

        def prompts_factory() -> Any:
            return builder_cls(tokenizer)
    else:
        from rollart.env.prompts import ChatTemplatePromptBuilder

        if getattr(tokenizer, "chat_template", None) in (None, ""):
            raise ConfigError(f"{field}.prompts: 'chat_template' needs a tokenizer with a chat template "
                              f"(model.path={config.model.path!r} has none)")

        def prompts_factory() -> Any:
            return ChatTemplatePromptBuilder(tokenizer)

    closers: list[Callable[[], Any]] = []
    reward_spec = task.reward if task.reward is not None else task.env
    if isinstance(reward_spec, str):
        reward = resolve("reward", reward_spec, base_dir, field=f"{field}.reward")
        scorer, origin = as_scorer(reward.obj), reward.origin
    else:
        scorer, origin, closer = service_scorer(reward_spec)
        closers.append(closer)
    return TaskParts(task, env_factory, prompts_factory, scorer, env.origin, origin, closers)


def service_scorer(spec: Any) -> tuple[Scorer, str, Callable[[], Any]]:
    """A scorer over the reward service at `spec.service` (token from the env var `spec.token_env`)."""
    import os

    from rollart.reward.client import RewardClient
    from rollart.scheduler.errors import ConfigError

    token = None
    if spec.token_env:
        token = os.environ.get(spec.token_env)
        if not token:
            raise ConfigError(f"reward.token_env: environment variable {spec.token_env!r} is not set")
    client = RewardClient(spec.service, token=token or "")

    async def score(trajectory: Trajectory) -> float:
        result = await client.score(spec.name, trajectory, deadline_s=spec.deadline_s)
        return float(result.score)
    return score, f"reward service {spec.service} ({spec.name})", client.aclose
