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

from rollart.app.config import RunConfig, TaskSection
from rollart.app.registry import resolve
from rollart.app.sim.parts import Distribution, SampledResponseLength, SyntheticPrompts
from rollart.app.tasks import FROZEN_LAKE_MAP, FrozenLakePrompts, MathToolPrompts
from rollart.env.trajectory import Trajectory

Scorer = Callable[[Trajectory], Awaitable[float]]
DEMO_PROMPTS = {"frozenlake": FrozenLakePrompts, "math": MathToolPrompts, "synthetic": SyntheticPrompts}
DEMO_ENV_ARGS: dict[str, Callable[[TaskSection], dict[str, Any]]] = {
    "frozenlake": lambda t: {"desc": list(FROZEN_LAKE_MAP), "is_slippery": False, "max_episode_steps": t.max_turns},
    "math": lambda t: {"source": "generated", "max_tool_calls": 2},
}


ENV_METHODS = ("reset", "step", "close")


@dataclass
class TaskParts:
    """What the builder needs for one task: fresh envs, fresh prompt builders, a scorer, its origin.

    `closers` are called (and awaited when they return an awaitable) when the run ends, e.g. the
    reward service client's `aclose`.
    """

    task: TaskSection
    env_factory: Callable[[], Any]
    prompts_factory: Callable[[], Any]
    scorer: Scorer
    env_origin: str
    reward_origin: str
    closers: list[Callable[[], Any]]
    prompts: str = "demo"
    llm_wrapper: Callable[[Any], Any] | None = None  # wraps the task's LLM client (simulated response lengths)
    reward_client: Any = None  # the RewardClient of a service reward (its stats reach the metrics)


def prompt_style(task: TaskSection, config: RunConfig) -> str:
    """`auto` -> `demo` for the tiny model, `chat_template` for a checkpoint."""
    if task.prompts != "auto":
        return task.prompts
    return "chat_template" if config.model.path else "demo"


def as_scorer(obj: Any, field: str = "reward") -> Scorer:
    """A reward as an async `trajectory -> float`.

    Accepts a plain function, an async function, a `RewardFn` object (async `score` returning a
    `RewardResult`, whose `.score` is taken) or a `RewardFn` class (instantiated without arguments).
    A function may return a float or anything with a `.score`.

    Raises:
        ConfigError: naming `field` when `obj` is none of these.
    """
    from rollart.scheduler.errors import ConfigError

    if inspect.isclass(obj):
        try:
            obj = obj()
        except TypeError as err:
            raise ConfigError(f"{field}: reward class {obj.__name__} cannot be built without arguments ({err}); "
                              "export an instance or a function instead") from None
    score = getattr(obj, "score", None)
    if callable(score):
        async def via_reward_fn(trajectory: Trajectory) -> float:
            result = score(trajectory)
            if inspect.isawaitable(result):
                result = await result
            return float(getattr(result, "score", result))
        return via_reward_fn
    if not callable(obj):
        raise ConfigError(f"{field}: {obj!r} is not a reward: expected a function trajectory -> float "
                          "(sync or async) or a RewardFn (an object with async score(trajectory))")

    async def via_function(trajectory: Trajectory) -> float:
        value = obj(trajectory)
        if inspect.isawaitable(value):
            value = await value
        return float(getattr(value, "score", value))
    return via_function


def check_env_class(obj: Any, field: str) -> None:
    """An env spec must name a class (or factory) whose instances have async reset/step/close.

    Raises:
        ConfigError: naming `field` and the missing methods.
    """
    from rollart.scheduler.errors import ConfigError

    if not callable(obj):
        raise ConfigError(f"{field}: {obj!r} is not an env class (rollart.env.Env: async reset/step/close)")
    if inspect.isclass(obj):
        missing = [m for m in ENV_METHODS if not inspect.iscoroutinefunction(getattr(obj, m, None))]
        if missing:
            raise ConfigError(f"{field}: {obj.__name__} is not a rollart.env Env: missing async {missing}")


def build_task(task: TaskSection, index: int, config: RunConfig, tokenizer: Any, base_dir: Path | None = None) -> TaskParts:
    """Resolve the env, the reward and the prompt style of `tasks[index]`.

    Raises:
        ConfigError: naming `tasks.<index>.env` / `.reward` / `.prompts` and what is allowed.
    """
    # deps: resolve, check_env_class, as_scorer, service_scorer, prompt_style
    from rollart.app.registry import BUILTINS
    from rollart.scheduler.errors import ConfigError

    field = f"tasks.{index}"
    env = resolve("env", task.env, base_dir, field=f"{field}.env")
    check_env_class(env.obj, f"{field}.env")
    env_args = {**DEMO_ENV_ARGS.get(task.env, lambda t: {})(task), **task.env_args}
    env_cls = env.obj
    llm_wrapper = None
    if task.env == "synthetic":  # a simulation: the policy's response lengths are part of the workload (D22)
        lengths = Distribution.of(env_args.pop("response_tokens", task.max_tokens))
        seed = config.run.seed

        def llm_wrapper(client: Any) -> Any:
            return SampledResponseLength(client, lengths, seed)

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
    reward_spec = task.reward
    if reward_spec is None:
        if task.env not in BUILTINS["reward"]:
            raise ConfigError(f"{field}.reward: env {task.env!r} has no built-in reward; set reward to a name "
                              f"{sorted(BUILTINS['reward'])}, an import path or {{service: URL, name: ...}}")
        reward_spec = task.env
    if isinstance(reward_spec, str):
        reward = resolve("reward", reward_spec, base_dir, field=f"{field}.reward")
        scorer, origin = as_scorer(reward.obj, f"{field}.reward"), reward.origin
    else:
        scorer, origin, closer = service_scorer(reward_spec, f"{field}.reward")
        closers.append(closer)
    return TaskParts(task, env_factory, prompts_factory, scorer, env.origin, origin, closers, style, llm_wrapper,
                     reward_client=getattr(closer, "__self__", None) if not isinstance(reward_spec, str) else None)


def service_scorer(spec: Any, field: str = "reward") -> tuple[Scorer, str, Callable[[], Any]]:
    """A scorer over the reward service at `spec.service` (token from the env var `spec.token_env`).

    Nothing is contacted here (so `rollart plan` starts nothing); the first score opens the connection.

    Raises:
        ConfigError: naming `field` when the token variable is unset or the URL is not http(s).
    """
    import os

    from rollart.reward.client import RewardClient
    from rollart.reward.errors import RewardError
    from rollart.scheduler.errors import ConfigError

    token = None
    if spec.token_env:
        token = os.environ.get(spec.token_env)
        if not token:
            raise ConfigError(f"{field}.token_env: environment variable {spec.token_env!r} is not set")
    try:
        client = RewardClient(spec.service, token=token or "")
    except RewardError as err:
        raise ConfigError(f"{field}.service: {err}") from None

    async def score(trajectory: Trajectory) -> float:
        result = await client.score(spec.name, trajectory, deadline_s=spec.deadline_s)
        return float(result.score)
    return score, f"reward service {spec.service} ({spec.name})", client.aclose
