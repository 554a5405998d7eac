"""Where a config's names resolve: built-ins, installed plugins (entry points) and import paths.

Why entry points: a third-party package ships its env, reward or engine and declares it under
`rollart.envs`, `rollart.rewards` or `rollart.engines` in its own pyproject; `rollart run` finds it
by name without RollArt being edited. Why import paths too: a user's own class in a file next to
their config (`examples/my_env.py:GuessNumberEnv`) or in any importable module (`pkg.mod:Class`)
works without packaging anything.

Resolution order for a plain name: built-in, then entry point. A spec containing `:` is an import
path: `package.module:attr` or `path/to/file.py:attr` (relative to the config file's folder, then
the working directory).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from rollart.scheduler.errors import ConfigError

KINDS = ("env", "reward", "engine")
ENTRY_POINT_GROUPS = {"env": "rollart.envs", "reward": "rollart.rewards", "engine": "rollart.engines"}

BUILTINS: dict[str, dict[str, str]] = {
    "env": {
        "frozenlake": "rollart.env.envs.frozen_lake:FrozenLakeEnv",
        "math": "rollart.env.envs.math_calc:MathCalcEnv",
        "code": "rollart.env.envs.code_sandbox:CodeSandboxEnv",
        "synthetic": "rollart.app.sim.parts:synthetic_env",  # a simulation (rollart sim)
    },
    "reward": {
        "frozenlake": "rollart.app.tasks:frozen_lake_reward",
        "math": "rollart.app.tasks:math_reward",
        "env_success": "rollart.reward.rules:EnvSuccessReward",
        "math_answer": "rollart.reward.rules:MathAnswerReward",
        "format": "rollart.reward.rules:FormatReward",
        "synthetic": "rollart.app.sim.parts:synthetic_reward",  # a simulation (rollart sim)
    },
    "engine": {
        "torch": "rollart.proxy.torch_engine:TorchEngine",
        "vllm": "rollart.proxy.vllm_engine:VLLMEngine",
        "sim": "rollart.proxy.sim_engine:SimEngine",
    },
}


@dataclass(frozen=True)
class Resolved:
    """A resolved name: the object and where it came from (for `rollart plan` and errors)."""

    obj: Any
    origin: str


def is_import_path(spec: str) -> bool:
    """`pkg.mod:attr` or `file.py:attr` (a Windows drive letter is not an import path)."""
    head, sep, tail = spec.rpartition(":")
    return bool(sep and head and tail and len(head) > 1)


def plugin_names(kind: str) -> list[str]:
    """Names installed packages register under this kind's entry-point group."""
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUPS[kind]))


def known_names(kind: str) -> list[str]:
    """Built-in and plugin names of a kind, for error messages and `rollart plan`."""
    return sorted(set(BUILTINS[kind]) | set(plugin_names(kind)))


def _load_file(path: Path, attr: str, spec: str) -> Any:
    from rollart.reward.function_service import NotAPythonFile, module_from_file

    try:
        module = module_from_file(path)
    except NotAPythonFile:
        raise ConfigError(f"cannot load {spec!r}: {path} is not a Python file") from None
    except Exception as err:
        raise ConfigError(f"cannot load {spec!r}: {type(err).__name__}: {err}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"cannot load {spec!r}: {path} has no attribute {attr!r}") from None


def load_import_path(spec: str, base_dir: Path | None = None) -> Any:
    """Import `pkg.mod:attr` or `path/file.py:attr`; errors say what failed and how to fix it."""
    head, _, attr = spec.rpartition(":")
    if head.endswith(".py") or "/" in head:
        candidates = [Path(head)] if Path(head).is_absolute() else [(base_dir or Path.cwd()) / head, Path.cwd() / head]
        for path in candidates:
            if path.is_file():
                return _load_file(path, attr, spec)
        raise ConfigError(f"cannot load {spec!r}: file {head!r} not found (looked in {[str(c) for c in candidates]})")
    try:
        module = importlib.import_module(head)
    except ImportError as err:
        raise ConfigError(f"cannot load {spec!r}: {err}; is the package installed, or give a file path like path/to/file.py:{attr}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"cannot load {spec!r}: module {head!r} has no attribute {attr!r}") from None


def resolve(kind: str, spec: str, base_dir: Path | None = None, field: str = "") -> Resolved:
    """The object behind a name or import path of `kind` (env class, reward, engine class).

    Raises:
        ConfigError: naming `field`, the spec and the known names.
    """
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    where = f"{field}: " if field else ""
    if is_import_path(spec):
        try:
            return Resolved(load_import_path(spec, base_dir), f"import path {spec}")
        except ConfigError as err:
            raise ConfigError(f"{where}{err}") from None
    if spec in BUILTINS[kind]:
        try:
            return Resolved(load_import_path(BUILTINS[kind][spec]), f"built-in ({BUILTINS[kind][spec]})")
        except ConfigError as err:  # a built-in whose optional extra is not installed
            raise ConfigError(f"{where}built-in {kind} {spec!r} cannot be loaded: {err}") from None
    for ep in entry_points(group=ENTRY_POINT_GROUPS[kind]):
        if ep.name == spec:
            try:
                return Resolved(ep.load(), f"plugin {ep.value} (entry point {ENTRY_POINT_GROUPS[kind]})")
            except Exception as err:  # noqa: BLE001 - a broken plugin is reported, not raised raw
                raise ConfigError(f"{where}plugin {spec!r} ({ep.value}) failed to load: {type(err).__name__}: {err}") from None
    raise ConfigError(f"{where}unknown {kind} {spec!r}; known: {known_names(kind)}, "
                      f"or an import path like package.module:Name or path/to/file.py:Name")
