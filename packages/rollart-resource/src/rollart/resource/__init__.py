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

# The programming model pulls in httpx (and Ray lazily); import it on first use, not with the package.
_LAZY = {
    "Cluster": "rollart.resource.cluster",
    "Worker": "rollart.resource.worker",
    "register": "rollart.resource.decorators",
    "hw_mapping": "rollart.resource.decorators",
    "register_serverless": "rollart.resource.decorators",
    "ServerlessClient": "rollart.resource.serverless",
    "LocalRuntime": "rollart.resource.runtime",
    "RayRuntime": "rollart.resource.runtime",
    "WorkerContext": "rollart.resource.runtime",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rollart.resource' has no attribute {name!r}")

__all__ = [  # noqa: F822 - the programming-model names are resolved lazily by __getattr__
    "BUILTIN_HARDWARE",
    "Cluster",
    "LocalRuntime",
    "RayRuntime",
    "ServerlessClient",
    "Worker",
    "WorkerContext",
    "hw_mapping",
    "register",
    "register_serverless",
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
