"""Serve one user reward function (`module:function` or `file.py:function`) as Reward-as-a-Service.

Why a module of its own: `rollart-reward serve examples/user_env.py:guess_reward` (`rollart.reward.cli`,
and its alias `rollart reward serve`) must work for a plain `trajectory -> float` function without
the user writing a `RewardRegistry` factory. Each
uvicorn worker process rebuilds the registry from `ROLLART_REWARD_FUNCTION` (a JSON spec), the
same way `service.app_from_env` passes its config, so `--workers N` works unchanged.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollart import checks as check
from rollart.env.trajectory import Trajectory
from rollart.reward.errors import RewardError
from rollart.reward.protocol import RewardFn, RewardRegistry, RewardResult
from rollart.reward.service import ServiceConfig, serve

FUNCTION_ENV = "ROLLART_REWARD_FUNCTION"


class FunctionReward:
    """A `RewardFn` over a plain function (sync or async) returning a float or a `RewardResult`."""

    runs_on_loop = False  # the user function may block (time.sleep): the service runs it in a thread (D29)

    def __init__(self, name: str, fn: Callable[[Trajectory], Any]) -> None:
        """Serve `fn` under `name`."""
        # VAL: VAL_NON_EMPTY(name, exc=RewardError)
        check.non_empty("name", name, exc=RewardError)  # generated #87b045a1cf
        self.name = name
        self.fn = fn

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Call the function; a non-finite value is an error (the service reports it per item)."""
        value = self.fn(trajectory)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, RewardResult):
            return value
        score = float(getattr(value, "score", value))
        if not math.isfinite(score):
            raise RewardError(f"reward {self.name!r} returned a non-finite score {score!r}")
        return RewardResult(score=score)


class NotAPythonFile(ImportError):
    """`module_from_file` was given a path importlib cannot load as Python source."""


def module_from_file(path: Path) -> Any:
    """Import a user's ``.py`` file once per process, under a name derived from its resolved path, so the
    reward service and the scheduler's registry share one module (and one class per user type).
    Errors raised by the file itself propagate unchanged; nothing half-imported is left behind."""
    path = path.resolve()
    name = "rollart_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise NotAPythonFile(str(path))
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module


def load_object(spec: str) -> Any:
    """Import `package.module:attr` or `path/to/file.py:attr` (a relative path is from the working directory)."""
    # AST: AST_PRECONDITION(spec.count(":") >= 1 and all(spec.rpartition(":")[::2]), got=spec, msg="the spec is module:attr or file.py:attr", exc=RewardError)
    check.precondition(spec.count(":") >= 1 and all(spec.rpartition(":")[::2]), "the spec is module:attr or file.py:attr", got=spec, exc=RewardError)  # generated #507ea577a6
    head, _, attr = spec.rpartition(":")
    if head.endswith(".py") or "/" in head:
        path = Path(head).expanduser().resolve()
        if not path.is_file():
            raise RewardError(f"cannot load {spec!r}: file {str(path)!r} not found")
        try:
            module = module_from_file(path)
        except NotAPythonFile:
            raise RewardError(f"cannot load {spec!r}: {path} is not a Python file") from None
        except Exception as err:
            raise RewardError(f"cannot load {spec!r}: {type(err).__name__}: {err}") from None
    else:
        try:
            module = importlib.import_module(head)
        except ImportError as err:
            raise RewardError(f"cannot load {spec!r}: {err}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RewardError(f"cannot load {spec!r}: {head!r} has no attribute {attr!r}") from None


def as_reward_fn(obj: Any, name: str) -> RewardFn:
    """A `RewardFn` named `name` from a function, a `RewardFn` object, or a `RewardFn` class."""
    # deps: FunctionReward
    if inspect.isclass(obj):
        obj = obj()
    score = getattr(obj, "score", None)
    if callable(score):
        return FunctionReward(name, score)
    if not callable(obj):
        raise RewardError(f"{obj!r} is not a reward: expected a function trajectory -> float or a RewardFn")
    return FunctionReward(name, obj)


def load_reward(spec: str, name: str | None = None) -> RewardFn:
    """Load `spec` and wrap it; `name` defaults to the attribute name."""
    # deps: load_object, as_reward_fn
    return as_reward_fn(load_object(spec), name or spec.rpartition(":")[2])


def function_registry() -> RewardRegistry:
    """The registry factory each worker calls: the one function named in `ROLLART_REWARD_FUNCTION`."""
    # deps: load_reward
    raw = os.environ.get(FUNCTION_ENV)
    # AST: AST_PRECONDITION(raw is not None, got=FUNCTION_ENV, msg="the function spec is set in the environment", exc=RewardError)
    check.precondition(raw is not None, "the function spec is set in the environment", got=FUNCTION_ENV, exc=RewardError)  # generated #e4a2a853de
    spec = json.loads(raw)
    registry = RewardRegistry()
    registry.register(load_reward(spec["spec"], spec["name"]))
    return registry


def serve_function(spec: str, name: str, token: str, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
                   cache_path: str = "reward-cache.sqlite") -> None:
    """Serve the function at `spec` under `name` (blocking); the spec is loaded once here to fail fast."""
    # deps: load_reward, serve
    # VAL: VAL_INT_RANGE(port, min=0, max=65535, exc=RewardError)
    check.int_range("port", port, min=0, max=65535, exc=RewardError)  # generated #2e46f154fd
    head, _, attr = spec.rpartition(":")
    if head.endswith(".py") or "/" in head:
        spec = f"{Path(head).expanduser().resolve()}:{attr}"  # workers may start elsewhere
    load_reward(spec, name)
    os.environ[FUNCTION_ENV] = json.dumps({"spec": spec, "name": name})
    config = ServiceConfig(registry="rollart.reward.function_service:function_registry", token=token, host=host,
                           port=port, workers=workers, cache_path=cache_path)
    serve(config)
