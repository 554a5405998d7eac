"""ProxyTransitionHook: the proxy's part in the role ledger's two-phase shrink/expand.

rollart.resource's ``ResourceManager`` persists a transition and calls every registered
``TransitionHook``: ``prepare`` (do the work or veto), then ``commit`` or ``abort``. For a shrink out
of the rollout role, prepare *is* the proxy's shrink (stop routing, migrate the requests with their
tokens, offload), so the devices are free before the ledger hands them to training; abort undoes it
with an expand. For an expand back into rollout, prepare checks the workers are offloaded and commit
reloads them (the devices are rollout's only once the ledger has committed). Every method works
from the transition's devices alone, so a hook rebuilt after a controller crash (``recover``) acts
the same, and calling a method twice is harmless.

Worker devices are ledger device ids: build the workers with the ``devices`` of their allocation.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollart import checks as check
from rollart.proxy.errors import ProxyError
from rollart.proxy.proxy import ACTIVE, OFFLOADED, LLMProxy, WorkerSlot
from rollart.resource.ledger import Transition, TransitionVetoed


def ranks_for_devices(slots: Sequence[WorkerSlot], devices: Sequence[int]) -> list[int]:
    """The ranks whose devices together are exactly ``devices``; ProxyError if they do not tile it."""
    transition_devices = set(devices)
    ranks = [s.rank for s in slots if s.devices and set(s.devices) <= transition_devices]
    devices_of_whole_workers = {d for r in ranks for d in slots[r].devices}
    # VAL: VAL_SUBSET(transition_devices, of=devices_of_whole_workers, exc=ProxyError)
    check.subset("transition_devices", transition_devices, of=devices_of_whole_workers, exc=ProxyError)  # generated #2bbc47a7a8
    return ranks


class ProxyTransitionHook:
    """Plugs ``LLMProxy.shrink``/``expand`` into ``ResourceManager`` transitions of one role."""

    def __init__(self, proxy: LLMProxy, role: str = "rollout") -> None:
        """Act on transitions that move devices out of (shrink) or into (expand) ``role``."""
        self.proxy = proxy
        self.role = role

    def _mine(self, transition: Transition) -> bool:
        if transition.kind == "shrink":
            return transition.from_role == self.role
        return transition.to_role == self.role

    async def prepare(self, transition: Transition) -> None:
        """Shrink: stop routing, migrate, offload (veto on bad ranks). Expand: check workers are offloaded."""
        if not self._mine(transition):
            return
        try:
            ranks = ranks_for_devices(self.proxy.slots, transition.devices)
            if transition.kind == "shrink":
                await self.proxy.shrink(ranks)
            else:
                offloaded = [s.rank for s in self.proxy.slots if s.state == OFFLOADED]
                # VAL: VAL_SUBSET(ranks, of=offloaded, exc=ProxyError)
                check.subset("ranks", ranks, of=offloaded, exc=ProxyError)  # generated #3d299efd89
        except ProxyError as exc:
            raise TransitionVetoed(f"rollart.proxy: {exc}") from exc

    async def commit(self, transition: Transition) -> None:
        """Expand: reload and rebalance (idempotent: ranks already active are skipped)."""
        if not self._mine(transition) or transition.kind != "expand":
            return
        ranks = ranks_for_devices(self.proxy.slots, transition.devices)
        todo = [r for r in ranks if self.proxy.slots[r].state == OFFLOADED]
        if todo:
            await self.proxy.expand(todo)

    async def abort(self, transition: Transition) -> None:
        """Shrink: undo prepare by expanding the workers it offloaded (idempotent)."""
        if not self._mine(transition) or transition.kind != "shrink":
            return
        try:
            ranks = ranks_for_devices(self.proxy.slots, transition.devices)
        except ProxyError:
            return  # prepare vetoed before touching anything
        todo = [r for r in ranks if self.proxy.slots[r].state == OFFLOADED]
        if todo:
            await self.proxy.expand(todo)
        # AST: AST_POSTCONDITION(all(self.proxy.slots[r].state == ACTIVE for r in ranks), got=[self.proxy.slots[r].state for r in ranks], msg="an aborted shrink leaves its workers active")
        check.postcondition(all(self.proxy.slots[r].state == ACTIVE for r in ranks), "an aborted shrink leaves its workers active", got_lazy=lambda: [self.proxy.slots[r].state for r in ranks])  # generated #675cb697cf
