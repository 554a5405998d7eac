"""The Engine protocol: the seam every inference backend (torch, vLLM, simulated) implements.

An engine is driven by exactly one ``InferenceWorker`` loop, so its methods need no locking. It is
step-level on purpose (add / abort / step) so that the worker can interleave commands between
steps and never stalls the running batch (paper section 5.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rollart.proxy.types import EngineLoad, EngineOutput, EngineRequest

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Engine(Protocol):
    """One inference engine: a model on a device with a running batch."""

    @property
    def version(self) -> int:
        """The weight version the engine serves now (-1 before any load)."""
        ...

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request (maybe resumed with tokens already generated); it joins the next step."""
        ...

    def abort_request(self, request_id: str) -> EngineOutput:
        """Drop a request and return what it generated so far (finish_reason ``abort``)."""
        ...

    def has_work(self) -> bool:
        """Whether a step would make progress (waiting or running requests)."""
        ...

    async def step(self) -> list[EngineOutput]:
        """Run one prefill or decode step of the batch; return the requests that finished."""
        ...

    def load(self) -> EngineLoad:
        """Running/waiting requests, tokens in flight and free KV, for routing."""
        ...

    async def offload(self) -> None:
        """Release the device memory the weights and KV hold (the engine must be empty)."""
        ...

    async def reload(self) -> None:
        """Bring the weights back after ``offload``."""
        ...

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights by name and serve them as ``version`` (never lower than the current).

        A version names one set of weights: the version served now is accepted again only with
        the weights it serves (a no-op), anything else raises ``ProxyError`` (see weight_identity).
        """
        ...
