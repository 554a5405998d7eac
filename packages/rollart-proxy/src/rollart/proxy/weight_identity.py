"""A weight version names one set of weights: digests and comparisons that let a layer tell.

Every token carries the version that produced it, so serving two different payloads under one
version would make the tags lie. The proxy, the workers and the engines accept a version again
only with the weights already served under it (an idempotent re-send); anything else is refused.
These helpers are the one definition of "the same weights" they share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is the [torch] extra: imported only where a tensor is actually seen
    import torch


def weights_digest(weights: Mapping[str, Any]) -> str:
    """A digest of a payload: names, dtypes, shapes and bytes of every tensor (order-independent).

    blake2b over the raw bytes, so two payloads share a digest only if they are bit-equal; costs
    one pass over the payload (about 1 GB/s per core), paid once per weight update.
    """
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        value = weights[name]
        h.update(name.encode())
        if hasattr(value, "detach"):
            import torch

            t = value.detach().cpu().contiguous()
            h.update(f"|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"|{type(value).__name__}|{value!r}|".encode())
    return h.hexdigest()


def same_payload(loaded_digest: str | None, weights: Mapping[str, Any]) -> bool:
    """True if ``weights`` may be accepted again under the version loaded with ``loaded_digest``.

    An empty payload changes nothing, so it is always the same weights; otherwise the digests must
    match. ``loaded_digest`` None means the version's weights came from elsewhere (the checkpoint an
    engine was built from), which no non-empty payload can be proven equal to.
    """
    return len(weights) == 0 or (loaded_digest is not None and weights_digest(weights) == loaded_digest)


def holds_weights(current: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> bool:
    """True if every named tensor of ``weights`` is bit-equal to the one held in ``current``.

    For engines that can read their own parameters: loading ``weights`` would change nothing. A
    tensor is compared after the cast the load would apply (to the held tensor's dtype).
    """
    import torch

    for name, tensor in weights.items():
        held = current.get(name)
        if held is None or tuple(held.shape) != tuple(tensor.shape):
            return False
        if not torch.equal(held.detach().cpu(), tensor.detach().to(held.dtype).cpu()):
            return False
    return True
