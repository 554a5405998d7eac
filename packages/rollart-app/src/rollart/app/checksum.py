"""Per-tensor checksums: the end-to-end proof that every rollout worker serves the trainer's weights."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any


def tensor_checksums(tensors: Mapping[str, Any]) -> dict[str, str]:
    """SHA-256 of each tensor's bytes, with dtype and shape, by name."""
    out = {}
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
        out[name] = h.hexdigest()
    return out
