"""rollart.resource: hardware pools, the resource manager and its metadata store, the Cluster/Worker
programming model on Ray, and the device-role ledger that shrink/expand changes.

Import the parts from their modules (``rollart.resource.ledger``, ``rollart.resource.manager``, ...);
the names below are re-exported for convenience. Ray is imported lazily, only by ``RayRuntime``.
"""

from rollart.resource.errors import (
    PlacementTimeout,
    ResourceError,
    ServerlessError,
    TransitionInFlight,
    UnknownHardwareError,
    WorkerDiedError,
    WorkerFailedError,
)
from rollart.resource.hardware import BUILTIN_HARDWARE, HardwareCatalogue, HardwareSpec
from rollart.resource.ledger import ROLES, DeviceRecord, Transition, TransitionHook, TransitionVetoed
from rollart.resource.manager import Allocation, ResourceManager
from rollart.resource.store import Event, MetadataStore, SqliteMetadataStore

__version__ = "0.1.0"

__all__ = [
    "BUILTIN_HARDWARE",
    "ROLES",
    "Allocation",
    "DeviceRecord",
    "Event",
    "HardwareCatalogue",
    "HardwareSpec",
    "MetadataStore",
    "PlacementTimeout",
    "ResourceError",
    "ResourceManager",
    "ServerlessError",
    "SqliteMetadataStore",
    "Transition",
    "TransitionHook",
    "TransitionInFlight",
    "TransitionVetoed",
    "UnknownHardwareError",
    "WorkerDiedError",
    "WorkerFailedError",
]
