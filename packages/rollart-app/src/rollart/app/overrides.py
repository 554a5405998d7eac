"""`--set dotted.key=value` overrides applied to the YAML mapping before validation (D18).

Why before validation: `rollart run` and `rollart plan` then check exactly the config that runs,
and an override gets the same field-naming errors as the file. Values are parsed as YAML
(`2` -> int, `true` -> bool, `[a, b]` -> list, `null`), list items are addressed by index
(`rollout.pools.0.devices=2`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rollart import checks as check
from rollart.app.config import RunConfig, parse_config, resolve_paths
from rollart.scheduler.errors import ConfigError


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.0.c=value` -> (['a', 'b', '0', 'c'], parsed value)."""
    key, sep, raw = item.partition("=")
    # AST: AST_PRECONDITION(sep == "=" and key.strip() != "" and all(p.strip() for p in key.split(".")), got=item, msg="--set takes dotted.key=value", exc=ConfigError)
    check.precondition(sep == "=" and key.strip() != "" and all(p.strip() for p in key.split(".")), "--set takes dotted.key=value", got=item, exc=ConfigError)  # generated #bc118c4fdb
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML: {err}") from None
    return [p.strip() for p in key.split(".")], value


def apply_overrides(data: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """A copy of `data` with every `dotted.key=value` of `sets` applied in order (missing mappings are created)."""
    # deps: parse_override
    out = copy.deepcopy(data)
    for item in sets:
        path, value = parse_override(item)
        node: Any = out
        for depth, part in enumerate(path):
            last = depth == len(path) - 1
            where = ".".join(path[: depth + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"--set {item!r}: {where} is not an index of a list of {len(node)} items")
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"--set {item!r}: {'.'.join(path[:depth])} is a {type(node).__name__}, not a mapping or list")
    return out


def load_config_with(path: str | Path, sets: Sequence[str] = ()) -> RunConfig:
    """Read YAML, apply `--set` overrides, validate (ConfigError names fields and allowed values)."""
    # deps: apply_overrides, parse_config, resolve_paths
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read run config {str(path)!r}: {err}") from None
    data = resolve_paths(data if data is not None else {}, Path(path).resolve().parent)  # the file's paths, from its folder
    return parse_config(apply_overrides(data, sets) if isinstance(data, dict) else data)  # parse_config names a non-mapping
