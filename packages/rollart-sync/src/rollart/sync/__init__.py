"""rollart.sync: versioned weight synchronization — bucketing, a local channel, torch.distributed broadcast,
and a Mooncake cross-cluster channel.

Mooncake-specific names live in `rollart.sync.mooncake` (imported lazily there), so importing this
package never needs the `[mooncake]` extra. Every name resolves on first access (PEP 562): importing
one submodule (`rollart.sync.sim`, which `rollart sim` uses) must not import torch through
`torch_dist` or `mooncake` (D45).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "DEFAULT_BUCKET_BYTES": "bucket", "Manifest": "bucket", "NamedTensors": "bucket", "PackedWeights": "bucket",
    "pack_buckets": "bucket", "unpack_buckets": "bucket",
    "DEFAULT_TIMEOUT_S": "channel", "PublishHandle": "channel", "WeightChannel": "channel", "WeightSnapshot": "channel",
    "ChannelClosedError": "errors", "ChecksumMismatchError": "errors", "StaleVersionError": "errors",
    "SyncError": "errors", "SyncTimeoutError": "errors", "SyncValidationError": "errors",
    "VersionNotAvailableError": "errors",
    "LocalChannel": "local",
    "ModelUpdateGroup": "model_update", "UpdateReport": "model_update", "WeightLoader": "model_update",
    "MooncakeChannel": "mooncake", "MooncakeConfig": "mooncake", "mooncake_unavailable_reason": "mooncake",
    "TorchDistributedChannel": "torch_dist",
    "LATEST": "versioning", "VersionLedger": "versioning",
}

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DEFAULT_TIMEOUT_S",
    "LATEST",
    "ChannelClosedError",
    "ChecksumMismatchError",
    "LocalChannel",
    "Manifest",
    "ModelUpdateGroup",
    "MooncakeChannel",
    "MooncakeConfig",
    "NamedTensors",
    "PackedWeights",
    "PublishHandle",
    "StaleVersionError",
    "SyncError",
    "SyncTimeoutError",
    "SyncValidationError",
    "TorchDistributedChannel",
    "UpdateReport",
    "VersionLedger",
    "VersionNotAvailableError",
    "WeightChannel",
    "WeightLoader",
    "WeightSnapshot",
    "mooncake_unavailable_reason",
    "pack_buckets",
    "unpack_buckets",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rollart.sync' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rollart.sync.{module}"), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
