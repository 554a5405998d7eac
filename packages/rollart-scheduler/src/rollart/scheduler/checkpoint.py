"""Per-iteration checkpoints (design D9, D30): a crash mid-iteration resumes from the last completed one.

Why temp dir + rename: the rename is atomic on POSIX, so a crash while writing leaves the previous
checkpoint intact and never a half-written "latest". Why a JSON manifest and no pickle (D30): the
manifest (iteration, version, config hash, the config itself) is read before anything else, so a
resume under a different config is refused with the fields that changed; the trainer's state is
the trainer's own safetensors + JSON directory, so loading a checkpoint never runs code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart import checks as check
from rollart.scheduler.errors import SchedulerError

_PREFIX = "ckpt-"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
# Run settings that do not change what is trained: extending a run (`-n`), moving it, renaming it,
# checkpointing more or less often or on another Ray cluster resumes without a config change.
# `trainer.algorithm` selected nothing and was removed (rollart-app D49): a checkpoint that stored it resumes unchanged
IGNORED_FOR_HASH = {"run": ("name", "run_dir", "iterations", "checkpoint_every", "tensorboard"), "cluster": None,
                    "trainer": ("algorithm",)}


class ConfigChangedError(SchedulerError):
    """The newest checkpoint was written under another config; resuming needs explicit consent."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What the manifest of one complete checkpoint says; `path / "trainer"` holds the trainer state."""

    path: Path
    iteration: int
    version: int
    config_hash: str
    config: dict[str, Any]


def config_identity(config: Any) -> dict[str, Any]:
    """The part of a run config (a pydantic model or a dict) that decides what is trained, as JSON data."""
    data = config.model_dump(mode="json") if hasattr(config, "model_dump") else json.loads(json.dumps(config))
    for section, keys in IGNORED_FOR_HASH.items():
        if keys is None:
            data.pop(section, None)
        elif isinstance(data.get(section), dict):
            for key in keys:
                data[section].pop(key, None)
    return data


def config_hash(identity: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of `config_identity(...)`."""
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def config_changes(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths whose values differ, as `path: old -> new` (list items by index)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old:
                out.append(f"{path}: (absent) -> {new[key]!r}")
            elif key not in new:
                out.append(f"{path}: {old[key]!r} -> (absent)")
            else:
                out += config_changes(old[key], new[key], path)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for i, (a, b) in enumerate(zip(old, new, strict=True)) for c in config_changes(a, b, f"{prefix}.{i}")]
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]


class Checkpointer:
    """Atomic per-iteration checkpoints (D9, D30): write to a temp dir with a JSON manifest, then rename."""

    def __init__(self, root: Path, keep: int = 2) -> None:
        """Keep the newest `keep` checkpoints."""
        # VAL: VAL_INT_RANGE(keep, min=1, max=1000, exc=SchedulerError)
        check.int_range("keep", keep, min=1, max=1000, exc=SchedulerError)  # generated #e8b3547b74
        self.root = Path(root)
        self.keep = keep

    def _complete(self) -> list[Path]:
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.iterdir() if p.name.startswith(_PREFIX) and (p / MANIFEST).is_file())

    def begin(self, iteration: int) -> Path:
        """A fresh temporary directory for iteration `iteration`; write the trainer into `<it>/trainer`."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{iteration:08d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp

    def commit(self, tmp: Path, iteration: int, version: int, config: Mapping[str, Any]) -> Path:
        """Write the manifest into `tmp`, rename it to its final name, prune old ones; return the path."""
        manifest = {"format": MANIFEST_FORMAT, "iteration": iteration, "version": version,
                    "config_hash": config_hash(config), "config": dict(config)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        final = self.root / f"{_PREFIX}{iteration:08d}"
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self._complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def latest(self) -> CheckpointInfo | None:
        """The manifest of the newest complete checkpoint, or None (a directory without one is ignored)."""
        done = self._complete()
        if not done:
            return None
        path = done[-1]
        try:
            data = json.loads((path / MANIFEST).read_text())
            return CheckpointInfo(path, int(data["iteration"]), int(data["version"]), str(data["config_hash"]),
                                  dict(data["config"]))
        except (ValueError, KeyError, TypeError) as err:
            raise SchedulerError(f"checkpoint manifest {str(path / MANIFEST)!r} is unreadable: {err}") from err

    @staticmethod
    def check_config(info: CheckpointInfo, config: Mapping[str, Any], allow_change: bool = False) -> list[str]:
        """The config changes since `info` was written; raise ConfigChangedError unless `allow_change`."""
        if config_hash(config) == info.config_hash:
            return []
        stored = config_identity(info.config)  # keys ignored since the checkpoint was written do not count
        if config_hash(stored) == config_hash(config):
            return []
        changes = config_changes(stored, dict(config)) or ["(the stored config does not match its hash)"]
        if not allow_change:
            shown = "; ".join(changes[:8]) + (f"; ... {len(changes) - 8} more" if len(changes) > 8 else "")
            raise ConfigChangedError(
                f"checkpoint {str(info.path)!r} (iteration {info.iteration}) was written under a different config "
                f"(hash {info.config_hash[:12]}, this run's is {config_hash(config)[:12]}): {shown}. "
                "Resume anyway with --allow-config-change (Pipeline.restore(allow_config_change=True)), "
                "or start a new run with another --run-dir.")
        return changes
