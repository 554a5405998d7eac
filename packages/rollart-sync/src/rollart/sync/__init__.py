"""rollart.sync: versioned weight synchronization — bucketing, a local channel, torch.distributed broadcast,
and a Mooncake cross-cluster channel.

Mooncake-specific names live in `rollart.sync.mooncake` (imported lazily there), so importing this
package never needs the `[mooncake]` extra.
"""

from rollart.sync.bucket import (
    DEFAULT_BUCKET_BYTES,
    Manifest,
    NamedTensors,
    PackedWeights,
    pack_buckets,
    unpack_buckets,
)
from rollart.sync.channel import DEFAULT_TIMEOUT_S, PublishHandle, WeightChannel, WeightSnapshot
from rollart.sync.errors import (
    ChannelClosedError,
    ChecksumMismatchError,
    StaleVersionError,
    SyncError,
    SyncTimeoutError,
    SyncValidationError,
    VersionNotAvailableError,
)
from rollart.sync.local import LocalChannel
from rollart.sync.model_update import ModelUpdateGroup, UpdateReport, WeightLoader
from rollart.sync.mooncake import MooncakeChannel, MooncakeConfig, mooncake_unavailable_reason
from rollart.sync.torch_dist import TorchDistributedChannel
from rollart.sync.versioning import LATEST, VersionLedger

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
