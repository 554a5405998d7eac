"""The Worker base class: the unit that owns resources (paper §5.2).

Why a base class: a Cluster needs every worker to answer the same few control calls (ping, set an
attribute, report its resources) whatever the user's methods are, and users need rank, devices and
hardware type without asking the manager.
"""

from __future__ import annotations

from typing import Any

from rollart import checks as check
from rollart.resource.errors import ResourceError
from rollart.resource.runtime import WorkerContext

__all__ = ["Worker"]


class Worker:
    """The unit that owns resources (paper §5.2): subclass it and decorate methods for a Cluster.

    Example:
        ```python
        class MyActorTrain(Worker):
            @register(mode="execute_all")
            def compute_gradients(self, batch):
                return self.rank, len(batch)
        ```
    """

    def __init__(self, context: WorkerContext) -> None:
        """Keep the context; subclasses call super().__init__(context) first."""
        # deps: none
        self._rollart_context = context

    @property
    def rank(self) -> int:
        """This worker's rank in its cluster."""
        return self._rollart_context.rank

    @property
    def world_size(self) -> int:
        """The number of workers the cluster was created with."""
        return self._rollart_context.world_size

    @property
    def hw(self) -> str:
        """The hardware type of this worker's devices (what hw_mapping routes on)."""
        return self._rollart_context.hw

    @property
    def devices(self) -> tuple[int, ...]:
        """The ledger ids of the devices bound to this worker."""
        return self._rollart_context.devices

    def rollart_ping(self) -> int:
        """Health probe used by Cluster.check_health; returns the rank."""
        return self.rank

    def rollart_set_attribute(self, name: str, value: Any) -> None:
        """Let the cluster set an attribute remotely (register_serverless installs its client this way)."""
        # VAL: VAL_NON_EMPTY(name, exc=ResourceError)
        check.non_empty("name", name, exc=ResourceError)  # generated #c14ca09b08
        setattr(self, name, value)

    def rollart_assigned_resources(self) -> dict[str, float]:
        """The resources the runtime granted (Ray: the bundle's GPU and hardware type), for placement checks."""
        try:
            import ray

            if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
                return {k: float(v) for k, v in ray.get_runtime_context().get_assigned_resources().items()}
        except ImportError:  # pragma: no cover - ray is a dependency, but the local runtime does not need it
            pass
        return {self.hw: float(len(self.devices))}
