"""Trainer state on disk without pickle: tensors in safetensors, everything else in JSON (design D19).

Why not `torch.save`: loading a pickle runs whatever code the file names, so a checkpoint copied
from elsewhere (or tampered with on shared storage) would execute on resume. safetensors holds only
raw tensor bytes with a JSON header, and the rest of a state dict (optimizer hyper-parameters,
counters, the trainer config) is plain JSON, so loading a checkpoint can never run code.

A state is a tree of dicts, lists, tuples, tensors and JSON scalars. `save_state` writes
`<name>.safetensors` (every tensor under the "/"-joined path of its keys; a top-level tensor keeps
its own name, so a model's file carries the Hugging Face names) and `<name>.json` (the tree with
each tensor replaced by a reference); `load_state` rebuilds the tree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart.train.errors import TrainError

if TYPE_CHECKING:
    import torch  # torch and safetensors are imported where tensors are handled: `write_json_atomic` needs neither (D31)

_TENSOR, _TUPLE, _INT_KEYS = "$tensor", "$tuple", "$int_keys"


def _encode(obj: Any, path: str, tensors: dict[str, torch.Tensor], seen: set[int]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().to("cpu").contiguous()
        if tensor.numel() and tensor.data_ptr() in seen:  # tied weights: safetensors refuses shared storage
            tensor = tensor.clone()
        if tensor.numel():
            seen.add(tensor.data_ptr())
        tensors[path] = tensor
        return {_TENSOR: path}
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj):
            return {k: _encode(v, f"{path}/{k}" if path else k, tensors, seen) for k, v in obj.items()}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in obj):
            return {_INT_KEYS: [[k, _encode(v, f"{path}/{k}" if path else str(k), tensors, seen)] for k, v in obj.items()]}
        raise TrainError(f"state at {path or '<root>'!r}: dict keys must be all str or all int, got {sorted(map(repr, obj))!r}")
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TrainError(f"state at {path or '<root>'!r}: cannot store a {type(obj).__name__} without pickle "
                     "(allowed: tensor, dict, list, tuple, str, int, float, bool, None)")


def _decode(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            key = obj[_TENSOR]
            if key not in tensors:
                raise TrainError(f"checkpoint references tensor {key!r}, which its safetensors file lacks")
            return tensors[key]
        if set(obj) == {_TUPLE}:
            return tuple(_decode(v, tensors) for v in obj[_TUPLE])
        if set(obj) == {_INT_KEYS}:
            return {int(k): _decode(v, tensors) for k, v in obj[_INT_KEYS]}
        return {k: _decode(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    return obj


def save_state(state: Mapping[str, Any], directory: str | Path, name: str) -> list[Path]:
    """Write `name.safetensors` and `name.json` into `directory`; return the two paths."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, "", tensors, set())
    weights, skeleton = directory / f"{name}.safetensors", directory / f"{name}.json"
    save_file(tensors, str(weights))
    skeleton.write_text(json.dumps(tree, indent=1))
    return [weights, skeleton]


def load_state(directory: str | Path, name: str) -> dict[str, Any]:
    """Rebuild what `save_state` wrote; never unpickles anything."""
    from safetensors.torch import load_file

    directory = Path(directory)
    weights, skeleton = directory / f"{name}.safetensors", directory / f"{name}.json"
    for part in (weights, skeleton):
        if not part.is_file():
            raise TrainError(f"checkpoint {str(directory)!r} lacks {part.name} (written by save_checkpoint)")
    try:
        tensors = load_file(str(weights))
        tree = json.loads(skeleton.read_text())
    except (OSError, ValueError, RuntimeError) as err:  # safetensors raises SafetensorError(Exception)
        raise TrainError(f"checkpoint file in {str(directory)!r} is not readable: {err}") from err
    except Exception as err:  # noqa: BLE001 - safetensors' own error type is not importable by name everywhere
        raise TrainError(f"checkpoint file {weights.name} in {str(directory)!r} is not a safetensors file: {err}") from err
    return _decode(tree, tensors)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temporary file and rename it over `path` (atomic on POSIX)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)
