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
    """One inference engine: a model on a device with a running batch.

    Every method is called by the one ``InferenceWorker`` loop that owns the engine, never
    concurrently, and the sync ones run on that loop: they must return quickly (the long work
    belongs in ``step``).
    """

    @property
    def version(self) -> int:
        """The weight version the engine serves now (-1 before any load).

        Read by the worker to refuse an older ``load_weights`` and in its stats; every token
        generated after a load is tagged with the new version.
        """
        ...

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request (maybe resumed with tokens already generated); it joins the next step.

        Called between two steps for each ADD. A request that cannot be served (too long, bad
        parameters) raises; the worker then answers it as ``abort``.
        """
        ...

    def abort_request(self, request_id: str) -> EngineOutput:
        """Drop a request and return what it generated so far (finish_reason ``abort``).

        Called for an abort and for every hand-back (evict, offload, stop, a failure): the worker
        relabels the output ``migrated``/``worker_failed`` as needed and resumes it elsewhere, so
        the tokens, log-probs and versions returned must be complete. May raise when the engine is
        broken; the worker then falls back to what the request carried.
        """
        ...

    def has_work(self) -> bool:
        """Whether a step would make progress (waiting or running requests).

        Polled before every step; False lets the worker sleep until the next command.
        """
        ...

    async def step(self) -> list[EngineOutput]:
        """Run one prefill or decode step of the batch; return the requests that finished.

        Each finished request is returned once, with ``stop`` or ``length`` (``abort`` when the
        backend gave up on it). Only called while the worker is running (not suspended or
        offloaded) and ``has_work`` is true. It may take long; it should run the model off the
        event loop (``asyncio.to_thread``, as the torch and vLLM engines do), which the proxy and
        other workers of the process share. An exception marks the engine broken: the worker hands
        every request back as ``worker_failed``.
        """
        ...

    def load(self) -> EngineLoad:
        """Running/waiting requests, tokens in flight and free KV, for routing.

        Called after every step and for each stats snapshot, so it must be cheap and never fail.
        """
        ...

    async def offload(self) -> None:
        """Release the device memory the weights and KV hold (the engine must be empty).

        Called by the worker's OFFLOAD after every request was handed back (a shrink lends the
        device to training); no request is added until ``reload``.
        """
        ...

    async def reload(self) -> None:
        """Bring the weights back after ``offload``, at the version served before it (no-op otherwise).

        The proxy loads newer weights afterwards when the version is stale (``LLMProxy.expand``).
        """
        ...

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights by name and serve them as ``version`` (never lower than the current).

        A version names one set of weights: the version served now is accepted again only with
        the weights it serves (a no-op), anything else raises ``ProxyError`` (see weight_identity).
        """
        ...
